"""tests/gpu/study_point.py on the CPU: the GPU proof's study-point measurement (the paper-style script
against hpc.train, each a whole process under torchrun, and hpc.train under hpc.submit --local) run end
to end with gloo, 2 processes, ResNet-18 on a small synthetic set, eager only (graph mode needs CUDA). On a GPU machine `bash tests/gpu/run.sh`
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
    proc = study_point("--data-root", str(root), "--out", str(out), "--points", "1/2:32", "--submit-points",
                       "1/2:32", "--epochs", "2", "--workers", "0", "--mode", "eager", "--arch", "resnet18",
                       "--nproc", "2", "--work-dir", str(tmp_path / "work"), "--timeout-s", "300")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["torch"] and doc["complete"] is True
    rows = {(r["side"], r["launcher"]): r for r in doc["rows"]}
    assert sorted(rows) == [("script", "torchrun"), ("toolkit", "submit"), ("toolkit", "torchrun")]
    for r in doc["rows"]:
        assert r["rc"] == 0 and r["batch"] == 32 and r["fraction"] == "1/2" and r["mode"] == "eager" and r["ddp"]
        assert len(r["epoch_s"]) == 2 and 0 < sum(r["epoch_s"]) < r["whole_s"]  # the epochs are inside the process
    # one comparison: the pair under the same launcher; its ratios are the rows' own
    (c,) = doc["comparisons"]
    script, toolkit = rows[("script", "torchrun")], rows[("toolkit", "torchrun")]
    assert c["whole_ratio"] == pytest.approx(toolkit["whole_s"] / script["whole_s"])
    assert c["last_epoch_speedup"] == pytest.approx(script["epoch_s"][-1] / toolkit["epoch_s"][-1])
    # each toolkit ran the study's own run sections at this point; under hpc.submit, in a runner's job
    for launcher in ("torchrun", "submit"):
        run_dir = tmp_path / "work" / rows[("toolkit", launcher)]["run_dir"]
        config = (run_dir / "config.yaml").read_text()
        assert "lr: 0.001" in config and "momentum: 0.9" in config and "batch_size: 32" in config
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["world_size"] == 2 and (summary["ranks"][0]["step_mode"], summary["ranks"][0]["ddp"]) == ("eager", True)
        # no GPU here: summary.json says so in one line (NVML has no library on this machine)
        assert summary["gpus"]["sampled"] is False and summary["gpus"]["line"].startswith("no GPU to sample on ")
    assert (tmp_path / "work" / "submitted").is_dir() and "task.json" in {p.name for p in run_dir.iterdir()}
    assert run_module("analysis", str(run_dir), "--out", str(tmp_path / "out")).returncode == 0
    header, line = (tmp_path / "out" / "runs.csv").read_text().splitlines()
    assert dict(zip(header.split(","), line.split(",")))["step_mode"] == "eager"
    table = out.with_suffix(".md").read_text()  # the README's table, beside the JSON
    assert table.count("\n| 1/2 | 32 |") == 4 and "(no target)" in table


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    proc = study_point("--data-root", str(tmp_path), "--out", str(tmp_path / "x.json"), "--points", "1/2:128,2:64")
    assert proc.returncode == 2 and "--points: 2:64 is not fraction:batch" in proc.stderr
    assert not (tmp_path / "x.json").exists()
