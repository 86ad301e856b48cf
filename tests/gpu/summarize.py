"""Gather what tests/gpu/run.sh measured into OUTDIR/results.json and OUTDIR/summary.md.

`python tests/gpu/summarize.py OUTDIR [--command TEXT]`: reads phases.jsonl, pytest.xml,
gpu_tests.json and the hpc.bench JSON files, checks the speed targets of issue 9 against them, and
writes both files atomically. Missing inputs (a phase that failed) are reported as missing, never
filled in.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc.core.files import write_atomic  # noqa: E402
from hpc.bench.trainspeed import markdown  # noqa: E402

A100_40GB_BYTES = 40e9  # what a Perlmutter GPU has; the CUDA context takes ~0.5 GB of it


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def junit(path: Path) -> dict | None:
    """Per-test outcome from pytest's JUnit XML (our own file, written by the phase before)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    tests = {}
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped: " + (child.get("message") or "")[:200]
        tests[f"{case.get('classname')}::{case.get('name')}"] = {"outcome": outcome, "seconds": float(case.get("time", 0))}
    return tests


def rows_of(bench: dict, stem: str) -> list[dict]:
    """Every timed row of the hpc.bench reports for one stem, in file order, tagged with its file."""
    return [{**r, "source": key} for key, report in bench.items() if report and report.get("stem") == stem
            for r in report.get("results", [])]


def row(rows: list[dict], config: str, batch: int) -> dict | None:
    return next((r for r in rows if r["config"] == config and r["batch"] == batch and "error" not in r), None)


def target(name: str, goal: str, measured: str, ok: bool | None) -> dict:
    return {"target": name, "goal": goal, "measured": measured, "met": ok}


def speedup_target(tv: list[dict]) -> list[dict]:
    base = row(tv, "baseline", 128)
    if base is None:
        return [target("toolkit vs baseline, torchvision stem, batch 128", ">= 4x images/s", "not measured", None)]
    out = []
    for config in ("toolkit", "toolkit + CUDA graph", "toolkit + compile"):
        r = row(tv, config, 128)
        ratio = r["images_per_s"] / base["images_per_s"] if r else None
        out.append(target(f"{config} vs baseline, torchvision stem, batch 128", ">= 4x images/s",
                          f"{ratio:.2f}x ({r['images_per_s']:.0f} vs {base['images_per_s']:.0f} img/s)" if r else "not measured",
                          ratio >= 4 if r else None))
    return out


def peak_target(cifar: list[dict]) -> list[dict]:
    out = []
    for r in cifar:
        if "error" in r or r["batch"] < 512 or not r["config"].startswith("toolkit") or r.get("profiled"):
            continue
        frac = r["fraction_of_peak"]
        out.append(target(f"{r['config']}, CIFAR stem, batch {r['batch']} [{r['source']}]", ">= 25% of dense bf16 peak",
                          f"{100 * frac:.1f}% ({r['achieved_tflops']:.0f} TFLOP/s)" if frac else "no peak known",
                          frac >= 0.25 if frac else None))
    return out or [target("CIFAR stem, batch >= 512", ">= 25% of dense bf16 peak", "not measured", None)]


def per_batch_targets(tv: list[dict]) -> list[dict]:
    """Profiler cost, data share, DDP cost and run-to-run noise, each from the rows of one file."""
    out = []
    for r in tv:
        if "error" in r:
            continue
        b, same_file = r["batch"], [x for x in tv if x["source"] == r["source"]]
        if r["config"] == "toolkit, profiled" and "profiler_overhead_epoch_pct" in r:
            out.append(target(f"profiler, default schedule, batch {b}", "< 3% of a whole run (one epoch)",
                              f"{r['profiler_overhead_epoch_pct']:.2f}% (+{r['profiler_extra_s']:.2f} s; "
                              f"{r['profiler_overhead_pct']:+.1f}% median step)", r["profiler_overhead_epoch_pct"] < 3))
        if r["config"] == "toolkit":
            out.append(target(f"data share of step, toolkit, batch {b}", "<= 2%", f"{r['data_share_pct']:.2f}%",
                              r["data_share_pct"] <= 2))
            bare = row(same_file, "toolkit without DDP", b)
            if bare:
                cost = 100 * (r["step_time_median_s"] / bare["step_time_median_s"] - 1)
                out.append(target(f"DDP at world size 1 vs bare model, batch {b}", "within 3%", f"{cost:+.1f}%",
                                  abs(cost) <= 3))
            again = row(same_file, "toolkit, again", b)
            if again:
                noise = 100 * (again["step_time_median_s"] / r["step_time_median_s"] - 1)
                out.append(target(f"profiler off: toolkit run twice, batch {b}", "no measurable difference",
                                  f"{noise:+.1f}% (run-to-run)", None))
    return out


def merged_memory(out: Path) -> list[dict]:
    """memory*.json rows by (configuration, batch); a later file fills in or replaces an earlier one's."""
    rows: dict = {}
    for path in sorted(out.glob("memory*.json")):
        for r in (read_json(path) or {}).get("memory", []):
            if not r.get("error") or (r["config"], r["batch"]) not in rows:
                rows[(r["config"], r["batch"])] = r
    return sorted(rows.values(), key=lambda r: (r["batch"], r["config"]))


def memory_rows(memory: list[dict]) -> list[str]:
    lines = ["| configuration | batch | peak, first step (GiB) | peak, steady (GiB) | fits a 40 GB A100 |", "|---|---|---|---|---|"]
    for r in memory:
        if r.get("error") or r.get("peak_memory_bytes") is None:
            lines.append(f"| {r['config']} | {r['batch']} | {r.get('error') or '-'} | | |")
            continue
        fits = "yes" if r["peak_memory_bytes"] < A100_40GB_BYTES - 1e9 else "no"
        lines.append(f"| {r['config']} | {r['batch']} | {r['peak_memory_bytes'] / 2**30:.2f} | "
                     f"{r['steady_peak_memory_bytes'] / 2**30:.2f} | {fits} |")
    return lines


def summary_markdown(results: dict) -> str:
    env = results["environment"]
    lines = [f"# GPU results: {env.get('device', '?')}", "",
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, NCCL {env.get('nccl')}, "
             f"Python {env.get('python')}; command `{results['command']}`", "", "## Phases", "",
             "| phase | exit | seconds |", "|---|---|---|"]
    lines += [f"| {p['phase']} | {p['rc']} | {p['seconds']} |" for p in results["phases"]]
    lines += ["", "## GPU tests", "", "| test | outcome | seconds |", "|---|---|---|"]
    for name, t in (results["tests"] or {}).items():
        lines.append(f"| {name.split('::')[-1]} | {t['outcome']} | {t['seconds']:.1f} |")
    lines += ["", "## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
    for t in results["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        lines.append(f"| {t['target']} | {t['goal']} | {t['measured']} | {met} |")
    for key, report in results["bench"].items():
        if report:
            lines += ["", f"## hpc.bench: {key}", "", f"`{report['command']}`", "", markdown(report)]
    lines += ["", "## Peak memory of a training step (ResNet152, torchvision stem)", ""] + memory_rows(results["memory"])
    if results.get("study_point_md"):  # tests/gpu/study_point.py's table (HPC_GPU_PHASES=study_point)
        lines += ["", "## One study point, whole processes (tests/gpu/study_point.py)", "", results["study_point_md"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/gpu/summarize.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--command", default="bash tests/gpu/run.sh")
    args = parser.parse_args(argv)
    out = Path(args.outdir)
    phases = [json.loads(line) for line in (out / "phases.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "phases.jsonl").exists() else []
    bench = {p.stem.removeprefix("bench_"): read_json(p) for p in sorted(out.glob("bench_*.json"))}
    memory = merged_memory(out)
    env_source = next((r for r in (*bench.values(), read_json(out / "memory.json")) if r), {})
    environment = {k: env_source.get(k) for k in ("device", "torch", "cuda", "cudnn", "nccl", "python", "host",
                                                  "device_memory_bytes", "multiprocessors")}
    tv, cifar = rows_of(bench, "torchvision"), rows_of(bench, "cifar")
    targets = speedup_target(tv) + peak_target(cifar) + per_batch_targets(tv)
    results = {"environment": environment, "command": args.command, "phases": phases,
               "tests": junit(out / "pytest.xml"), "measured_by_tests": read_json(out / "gpu_tests.json"),
               "targets": targets, "bench": bench, "memory": memory, "study_point": read_json(out / "study_point.json"),
               "study_point_md": (out / "study_point.md").read_text() if (out / "study_point.md").is_file() else None}
    write_atomic(out / "results.json", json.dumps(results, indent=2))
    write_atomic(out / "summary.md", summary_markdown(results))
    print(f"wrote {out / 'results.json'} and {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
