"""A new user's first hour (issue 28): the README's quickstart exactly as written, and no silent
surprises: a run too short for the profiler says so, a CPU run is quiet about the GPU it does not have,
CPU ranks are called ranks, figures name the data actually used, and a folder of several runs is shown
run by run."""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_module
from trainrun import SMOKE, train

ARTIFACTS = Path(os.environ.get("HPC_ARTIFACTS", REPO / "artifacts"))


def quickstart_run_command() -> list[str]:
    """The run part of the README's first command (after its install), with this environment's python."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(python3 -m venv .*?)\n```", readme, re.S).group(1)
    run_part = block.split("&&")[-1].strip()
    assert run_part.startswith(".venv/bin/python -m hpc.submit --local"), run_part
    return [sys.executable, *shlex.split(run_part)[1:]]


@pytest.mark.slow
def test_the_readme_quickstart_as_written(tmp_path):
    """In a fresh directory holding only the profiles (where a clone's working directory has them): it
    writes its synthetic data, trains two ranks, and ends as the README shows."""
    (tmp_path / "profiles").symlink_to(REPO / "profiles")
    start = time.monotonic()
    proc = subprocess.run(quickstart_run_command(), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "SYNTHETIC images (data.source: synthetic, fraction 1), 2 rank(s)" in proc.stdout
    at = next(i for i, line in enumerate(lines) if line.startswith("profiled steps, per rank"))
    assert lines[at + 1].split()[:3] == ["rank", "steps", "cpu_time"] and [r.split()[0] for r in lines[at + 2:at + 4]] == ["0", "1"]
    assert lines[at + 4].startswith("verdict: unknown: no device activity in the trace (a CPU run)")
    assert re.fullmatch(r"job \d+: done", lines[at + 5]) and len(lines) == at + 10
    assert [line.split(":")[0].strip() for line in lines[at + 6:]] == ["run", "logs", "traces", "summary"]
    run_dir = Path(lines[at + 6].split()[-1])
    assert run_dir.parent == tmp_path / "runs" / "resnet18" and (run_dir / "summary.json").is_file()
    assert sum(line.strip().startswith("run:") for line in lines) == 1  # the paths, once
    assert "gpuGetDeviceCount" not in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "runs" / "resnet18").iterdir()) == [run_dir.name]  # no '%j' left
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "quickstart.json").write_text(json.dumps({"seconds": round(took, 1), "stdout_tail": lines[at:]}))


def test_a_run_too_short_for_the_profiler_says_so_and_the_cpu_is_quiet(data_root, tmp_path):
    """smoke.yaml's profiler waits a step, warms up one and records steps 3-4: a 1-step run writes no trace
    and a 2-step run a cut one, and each says so at both ends; on a CPU, Kineto's probing for a GPU is not
    printed as an ERROR."""
    common = ["--config", SMOKE, "--data-root", str(data_root)]
    (rc, out, err), = train(1, [*common, "--run-dir", str(tmp_path / "r1"), "--max-steps", "1"])
    assert "profiler: this run has 1 step(s) to go, and the profiler's window closes after 4 (profiler.wait 1 + " \
           "warmup 1 + active 2): no trace will be written" in out
    assert "traces:     none written (the profiler was off, or the run ended before its window closed)" in out
    (rc, out, err), = train(1, [*common, "--run-dir", str(tmp_path / "r2"), "--max-steps", "2"])
    assert "its trace will hold fewer steps than profiler.active" in out and "(1 written)" in out
    assert "gpuGetDeviceCount" not in err and "USDT" not in err


def test_a_folder_of_runs_is_shown_run_by_run_and_cpu_ranks_are_ranks(data_root, tmp_path):
    folder = tmp_path / "runs"
    for name, world in (("a", 1), ("b", 2)):
        train(world, ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(folder / name),
                      "--max-steps", "6"])
    proc = run_module("analysis", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert f"analysis: {folder} holds 2 runs, each analysed on its own: a, b" in proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(str(folder))]
    assert [r[0] for r in rows] == [str(folder / "a"), str(folder / "b")]
    verdicts = proc.stdout.split("Verdict:", 1)[1]
    assert "  a: fraction 1, batch 16, 1 CPU rank, eager steps: unknown" in verdicts
    assert "  b: fraction 1, batch 16, 2 CPU ranks, eager steps: unknown" in verdicts
    assert "GPU," not in verdicts
    report = run_module("analysis", str(folder / "b"), "--report")
    html = (folder / "b" / "analysis" / "report.html").read_text()
    assert report.returncode == 0 and "batch 16 per rank, 2 CPU ranks, eager steps" in html


def test_the_readme_is_for_the_first_hour_and_links_the_rest():
    """At most 300 lines; what moved beside it (docs/) is linked from it, and every link is there."""
    readme = (REPO / "README.md").read_text()
    assert readme.count("\n") <= 300
    links = re.findall(r"\]\(((?:docs|analysis|results|tests)/[^)#]+)\)", readme)
    assert {"docs/perlmutter.md", "docs/faults.md", "docs/own-script.md", "docs/performance.md", "docs/scale.md"} <= set(links)
    assert all((REPO / link).is_file() for link in links), links
