"""tests/gpu/study_point.py on the CPU: the GPU proof's study-point measurement (the paper-style script
against hpc.train, each a whole process under torchrun) run end to end with gloo, 2 processes, ResNet-18
on a small synthetic set, eager only (graph mode needs CUDA). On a GPU machine `bash tests/gpu/run.sh`
runs it at the study's size; here what is checked is that every row is measured and the file is the
one the README's table is made from."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_module

pytestmark = pytest.mark.slow


def study_point(*args: str) -> subprocess.CompletedProcess:
    """As its header says to run it: python tests/gpu/study_point.py ..., from the checkout."""
    return subprocess.run([sys.executable, "tests/gpu/study_point.py", *args], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)


def test_study_point_measures_the_script_and_the_toolkit_as_whole_processes(tmp_path):
    from hpc.training import data

    root = tmp_path / "data"
    data.synthesize(root, n_train=256, n_test=64, seed=0)
    out = tmp_path / "study_point.json"
    proc = study_point("--data-root", str(root), "--out", str(out), "--batches", "32", "--fraction", "1/2",
                       "--workers", "0", "--modes", "eager", "--arch", "resnet18", "--nproc", "2",
                       "--work-dir", str(tmp_path / "work"), "--timeout-s", "300")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["torch"]
    rows = {(r["name"], r["profiled"]): r for r in doc["rows"]}
    assert sorted(rows) == [("seed script", False), ("toolkit", False), ("toolkit", True)]
    for r in doc["rows"]:
        assert r["rc"] == 0 and r["batch"] == 32 and r["mode"] == "eager" and r["ddp"] is True
        assert len(r["epoch_s"]) == 1 and 0 < r["epoch_s"][0] < r["whole_s"]  # the epoch is inside the process
    assert rows[("seed script", False)]["workers"] == 0
    profiled, plain = rows[("toolkit", True)], rows[("toolkit", False)]
    assert doc["profiler_cycle_extra_s"] == pytest.approx(profiled["whole_s"] - plain["whole_s"])
    # the toolkit ran the study's own run sections: its config is profiles/study.yaml's, at this point
    run_dir = tmp_path / "work" / "toolkit-b32-eager-plain"
    config = (run_dir / "config.yaml").read_text()
    assert "lr: 0.001" in config and "momentum: 0.9" in config and "batch_size: 32" in config
    # the run says how its steps ran, and the run table shows it (eager and graphed sweeps side by side)
    first = json.loads((run_dir / "summary.json").read_text())["ranks"][0]
    assert (first["step_mode"], first["ddp"]) == ("eager", True)
    profiled_dir = tmp_path / "work" / "toolkit-b32-eager-profiled"  # the unprofiled twin has no trace to read
    assert run_module("analysis", str(profiled_dir), "--out", str(tmp_path / "out")).returncode == 0
    header, line = (tmp_path / "out" / "runs.csv").read_text().splitlines()
    assert dict(zip(header.split(","), line.split(",")))["step_mode"] == "eager"
    table = out.with_suffix(".md").read_text().splitlines()  # the README's table, beside the JSON
    assert table[2].startswith("| batch | run | mode | DDP | profiled | whole process (s) |") and len(table) == 7


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    proc = study_point("--data-root", str(tmp_path), "--out", str(tmp_path / "x.json"), "--modes", "eager,fast")
    assert proc.returncode == 2 and "--modes 'eager,fast': eager and/or graph" in proc.stderr
    assert not (tmp_path / "x.json").exists()
