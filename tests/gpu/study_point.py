"""One point of the study, measured as users run it: the paper-style script (tests/gpu/seed_script.py) and
`hpc.train` on the same files, each as a whole process under torchrun, one after the other:

    python tests/gpu/study_point.py --data-root DATA --out results/gpu/study_point.json \\
        [--batches 128,1024] [--fraction 1/2] [--epochs 1] [--workers 0,8] [--modes eager,graph] [--arch resnet152]

Rows, per batch size: the script with each DataLoader worker count; the toolkit in each step mode
(eager; graph: train.cuda_graph), with and without the profiler. The toolkit runs profiles/study.yaml's
run sections (the paper's optimizer, no schedule, its profiler window) with the point's data fraction,
batch and epochs. `whole_s` is the process's wall time (torchrun started to exited); `epoch_s` what the
process measured per epoch (the script's own timer; the toolkit's metrics.jsonl). `ddp` is what the run
did (the toolkit's summary.json). `profiler_cycle_extra_s`: the largest whole-process difference
between a profiled toolkit row and its unprofiled twin. The JSON is written atomically at the end;
Beside it, the same as a Markdown table (study_point.md: the README's). Exit 1 when a process failed
(its row keeps its exit status), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc.core.files import write_atomic  # noqa: E402  (torch-free: the project's one atomic write)

SEED_SCRIPT = REPO / "tests" / "gpu" / "seed_script.py"
STUDY = REPO / "profiles" / "study.yaml"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--work-dir", help="run directories and configs (default: a temporary directory)")
    p.add_argument("--batches", default="128,1024", help="per-GPU batch sizes, comma-separated")
    p.add_argument("--fraction", default="1/2")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", default="0,8", help="the script's DataLoader worker counts, comma-separated")
    p.add_argument("--modes", default="eager,graph", help="the toolkit's step modes: eager, graph")
    p.add_argument("--arch", default="resnet152", help="for both (a torchvision ResNet name)")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per run")
    p.add_argument("--timeout-s", type=float, default=600, help="per process")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
        args.workers = [int(w) for w in args.workers.split(",")]
    except ValueError as e:
        p.error(f"--batches/--workers: comma-separated integers expected ({e})")
    args.modes = args.modes.split(",")
    if not set(args.modes) <= {"eager", "graph"}:
        p.error(f"--modes {','.join(args.modes)!r}: eager and/or graph")
    return args


def timed(cmd: list[str], timeout_s: float, log: Path) -> tuple[int, float]:
    """(exit status, wall seconds) of a whole process; its output goes to log."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            done = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - start


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def seed_row(args: argparse.Namespace, work: Path, batch: int, workers: int) -> dict[str, Any]:
    out = work / f"seed-b{batch}-w{workers}.json"
    cmd = [*torchrun(args.nproc), str(SEED_SCRIPT), "--data-root", args.data_root, "--fraction", args.fraction,
           "--batch-size", str(batch), "--epochs", str(args.epochs), "--workers", str(workers), "--arch", args.arch,
           "--out", str(out)]
    rc, whole_s = timed(cmd, args.timeout_s, out.with_suffix(".log"))
    epochs = json.loads(out.read_text())["epoch_s"] if rc == 0 and out.is_file() else []
    return {"name": "seed script", "mode": "eager", "ddp": True, "profiled": False, "batch": batch,
            "workers": workers, "whole_s": whole_s, "epoch_s": epochs, "rc": rc}


def data_source(root: Path) -> str:
    """What the root holds, as data.source says it: the real CIFAR-100, or the synthetic set a GPU machine
    without internet gets (tests/gpu/run.sh writes one)."""
    import pickle

    with open(root / "cifar-100-python" / "meta", "rb") as f:
        names = pickle.load(f, encoding="latin1").get("fine_label_names", [])  # our own files here
    return "synthetic" if names and str(names[0]) in ("class_000", "b'class_000'") else "cifar100"


def toolkit_config(args: argparse.Namespace, batch: int, mode: str) -> dict[str, Any]:
    """profiles/study.yaml's run sections for this point (its sweep section is the grid, not a run)."""
    cfg = {k: v for k, v in yaml.safe_load(STUDY.read_text()).items() if k != "sweep"}
    cfg.setdefault("data", {})["fraction"] = args.fraction
    cfg["data"]["source"] = data_source(Path(args.data_root))  # the same files the seed script reads
    cfg["model"]["arch"] = args.arch
    cfg["train"].update({"batch_size": batch, "epochs": args.epochs, "cuda_graph": mode == "graph"})
    return cfg


def toolkit_row(args: argparse.Namespace, work: Path, batch: int, mode: str, profiled: bool) -> dict[str, Any]:
    name = f"toolkit-b{batch}-{mode}-{'profiled' if profiled else 'plain'}"
    config, run_dir = work / f"{name}.yaml", work / name
    config.write_text(yaml.safe_dump(toolkit_config(args, batch, mode)))
    cmd = [*torchrun(args.nproc), "-m", "hpc.train", "--config", str(config), "--run-dir", str(run_dir),
           "--data-root", args.data_root, *([] if profiled else ["--no-profile"])]
    rc, whole_s = timed(cmd, args.timeout_s, work / f"{name}.log")
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    summary = run_dir / "summary.json"
    first = json.loads(summary.read_text())["ranks"][0] if summary.is_file() else {}
    epochs = [r["epoch_time_s"] for r in records if r["kind"] == "epoch"]
    median = (first.get("step_time_s") or {}).get("median")
    after = (first.get("step_time_after_profiler_s") or {}).get("median")
    steps = first.get("steps_per_epoch")
    # The first epoch's cost over steady steps (autotuning, lazy loading, capture, the profiler's window):
    # the epoch's time less its steps at the run's median step time.
    extra = epochs[0] - steps * median if epochs and median and steps else None
    return {"name": "toolkit", "mode": first.get("step_mode", mode), "ddp": bool(first.get("ddp")), "profiled": profiled,
            "batch": batch, "whole_s": whole_s, "epoch_s": epochs, "rc": rc, "step_median_s": median,
            "after_window_step_median_s": after, "first_epoch_extra_s": extra}


def profiled_twins(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(profiled toolkit row, its unprofiled twin: same batch and mode) for every profiled row that has one."""
    plain = {(r["batch"], r["mode"]): r for r in rows if r["name"] == "toolkit" and not r["profiled"]}
    return [(r, plain[(r["batch"], r["mode"])]) for r in rows
            if r["name"] == "toolkit" and r["profiled"] and (r["batch"], r["mode"]) in plain]


def profiler_cycle_extra_s(rows: list[dict[str, Any]]) -> float | None:
    """The largest (profiled - unprofiled) whole-process time over the toolkit's twin rows."""
    extra = [r["whole_s"] - twin["whole_s"] for r, twin in profiled_twins(rows)]
    return max(extra) if extra else None


def after_window_slowdown(rows: list[dict[str, Any]]) -> float | None:
    """The largest (median step after the profiler's window / median step of the unprofiled twin) - 1."""
    ratios = [r["after_window_step_median_s"] / twin["step_median_s"] - 1 for r, twin in profiled_twins(rows)
              if r.get("after_window_step_median_s") and twin.get("step_median_s")]
    return max(ratios) if ratios else None


def markdown(doc: dict[str, Any]) -> str:
    """The rows as the README's table: one line per process, the first and the steady epoch apart."""
    extra, slower = doc["profiler_cycle_extra_s"], doc["after_window_slowdown"]
    lines = [f"{doc['device']}, torch {doc['torch']}; profiled cycle's extra wall time: "
             f"{'-' if extra is None else f'{extra:.2f}'} s; steps after the window against unprofiled ones: "
             f"{'-' if slower is None else f'{100 * slower:+.1f}%'}",
             "", "| batch | run | mode | DDP | profiled | whole process (s) | first epoch (s) | last epoch (s) "
             "| first epoch over steady steps (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        run = r["name"] + (f", {r['workers']} workers" if "workers" in r else "")
        run += f" (exit {r['rc']})" if r["rc"] else ""
        first, last = (f"{r['epoch_s'][0]:.2f}", f"{r['epoch_s'][-1]:.2f}") if r["epoch_s"] else ("-", "-")
        warm = "-" if r.get("first_epoch_extra_s") is None else f"{r['first_epoch_extra_s']:.2f}"
        lines.append(f"| {r['batch']} | {run} | {r['mode']} | {'yes' if r['ddp'] else 'no'} | "
                     f"{'yes' if r['profiled'] else 'no'} | {r['whole_s']:.1f} | {first} | {last} | {warm} |")
    return "\n".join(lines) + "\n"


def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    for batch in args.batches:
        for workers in args.workers:
            rows.append(seed_row(args, work, batch, workers))
            print(json.dumps(rows[-1]), flush=True)
        for mode in args.modes:
            for profiled in (True, False):
                rows.append(toolkit_row(args, work, batch, mode, profiled))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch  # after the arguments: a bad flag is answered without loading torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = measure(args, work)
    cuda = torch.cuda.is_available()
    doc = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__, "rows": rows,
           "profiler_cycle_extra_s": profiler_cycle_extra_s(rows), "after_window_slowdown": after_window_slowdown(rows)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1))
    write_atomic(out.with_suffix(".md"), markdown(doc))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 1 if any(r["rc"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
