"""The real controller restarted while a study's arrays run, on the local cluster (tests/slurm/cluster.sh):
slurmctld is killed, so squeue fails as it does on a machine whose controller is away; `hpc.study status`
says unknown for every point the run directories alone cannot settle and exits 1; `hpc.study run --wait`
says once that the queue is silent and waits on. slurmctld comes back from its saved state (the jobs ran on
under their slurmstepd meanwhile); status shows the right states, every point ends done, and nothing was
submitted twice: one array, one analysis job, each point's run once (Slurm's own job records say so)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import found, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = dict(os.environ, PATH=f"{Path(PY).parent}:{os.environ['PATH']}", OMP_NUM_THREADS="1")
SWEEP = """sweep:
  name: ctld-restart
  data_fractions: [1]
  batch_sizes: [8, 16]
  gpus: [1]
  nodes: [1]
data:
  source: synthetic
  synth_train: 1024
  synth_test: 64
model:
  arch: tiny
train:
  epochs: 2
  warmup_epochs: 0
  log_every_steps: 4
profiler:
  wait: 0
  warmup: 1
  active: 2
"""


def study(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpc.study", *args], capture_output=True, text=True, cwd=REPO, env=ENV,
                          timeout=timeout)


def controller_up() -> bool:
    return subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout.count("UP") > 0


def slurm_jobs(since: int) -> list[dict]:
    """Every job the controller knows (finished ones too, for MinJobAge) submitted at or after job `since`:
    its fields as `scontrol show job -o` gives them."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout
    jobs = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines()]
    return [j for j in jobs if int(j.get("ArrayJobId", j["JobId"])) >= since]


def test_a_restarted_controller_is_unknown_while_away_and_submits_nothing_twice(slurm_cluster, data_root, tmp_path):
    (tmp_path / "study.yaml").write_text(SWEEP)
    said = tmp_path / "runner.err"  # a file, read while the runner waits
    runner = subprocess.Popen([PY, "-m", "hpc.study", "run", str(tmp_path / "study.yaml"), "--account", "m1_g",
                               "--data-root", str(data_root), "--runs-dir", str(tmp_path / "runs"), "--wait",
                               "--export", "ALL,OMP_NUM_THREADS=1", "--export", "ALL,HPC_FAULT_INJECT=slow-step:300"],
                              cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=said.open("w"), text=True)
    wait_until(lambda: found(tmp_path / "runs", "metrics.jsonl"), "a point to start", 240, every_s=0.5)
    (sweep,) = {p.parent for p in tmp_path.glob("runs/**/index.json")}
    submitted = json.loads((sweep / "index.json").read_text())
    subprocess.run(["pkill", "-x", "slurmctld"], check=True)
    try:
        wait_until(lambda: not controller_up(), "slurmctld to be gone", 60)
        away = study("status", str(sweep), "--format", "json")
        rows = json.loads(away.stdout)
        assert away.returncode == 1 and {r["state"] for r in rows if r["state"] != "done"} == {"unknown"}, away
        assert "squeue failed" in away.stderr and "shown as unknown" in away.stderr, away.stderr
        # the waiting runner has asked the queue meanwhile, and said so
        wait_until(lambda: "still waiting" in said.read_text(), "the runner to find the queue silent", 120)
    finally:
        subprocess.run(["slurmctld", "-i"], check=True)
    out, _ = runner.communicate(timeout=400)
    err = said.read_text()
    assert runner.returncode == 0, out[-2000:] + err[-2000:]
    assert err.count("still waiting") == 1 and err.count("the queue answers again") == 1, err
    after = study("status", str(sweep), "--format", "json")
    assert after.returncode == 0 and {r["state"] for r in json.loads(after.stdout)} == {"done"}, after
    assert json.loads((sweep / "index.json").read_text()) == submitted  # nothing added or changed
    (array,) = {int(p["job_id"].split("_")[0]) for p in submitted["points"]}
    jobs = slurm_jobs(since=array)
    tasks = sorted(j["ArrayTaskId"] for j in jobs if j.get("ArrayJobId") == str(array))
    assert tasks == ["0", "1"] and len(jobs) == 3, jobs  # the array's two tasks and the analysis job, once each
    assert {j["JobState"] for j in jobs} == {"COMPLETED"}, [(j["JobId"], j["JobState"]) for j in jobs]
    for point in submitted["points"]:
        run_dir = sweep / point["run_dir"]
        logs = sorted(p.name for p in run_dir.glob("*_log.out"))
        assert logs and all(name.startswith(f"{point['job_id']}_") for name in logs), (point, logs)
        steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(x)["kind"] == "train"]
        assert steps == sorted(set(steps)), steps  # each step once: no second run of the point
