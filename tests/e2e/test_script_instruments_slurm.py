"""Every instrument for a user's script on the local Slurm cluster (issue 51): 2 nodes x 2 tasks, gloo on
the CPU, the scripts of tests/scripts/ unchanged. A rank stopped with SIGSTOP on the second node is named
frozen (rank, host, pid) within command.hang_timeout_s and the job ends FAILED with nothing left running;
torch's OutOfMemoryError (a stand-in raised on the CPU: no GPU here) is the job's outcome `oom`; a script
that profiles itself runs to its end with its own traces while ours stands down. The same with --local:
tests/e2e/test_script_instruments.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import processes, wait_until
from test_own_script_slurm import ENV, PY, REPO, SCRIPTS, TWO_BY_TWO, run_dir_of, submit
from test_script_instruments import HANG_S, OOM_STANDIN, model_weights_bytes
from test_slurm_jobs import job_state, wait_gone

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_rank_stopped_on_the_second_node_is_named_frozen_and_memory_by_category_kept(slurm_cluster, tmp_path):
    ckpt = tmp_path / "ck.pt"
    proc = subprocess.Popen([PY, "-m", "hpc.submit", *TWO_BY_TWO, "--runs-dir", str(tmp_path), "--set",
                             "profiler.memory_categories=true", "--set", f"command.hang_timeout_s={HANG_S}", "--wait",
                             "--", PY,
                             str(SCRIPTS / "torchrun_ddp.py"), "--epochs", "100", "--step-sleep", "0.1", "--ckpt",
                             str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    run = run_dir_of(proc.stdout.readline())
    out = run / "logs" / "rank0.out"
    wait_until(lambda: out.exists() and "epoch 0" in out.read_text(), "the first epoch", 180)
    # the profiled window's end on rank 3 (its facts, written whole once the window's trace is out)
    wait_until(lambda: (run / "ranks" / "rank3.facts.json").exists(), "rank 3's profiled window", 120)
    record = json.loads((run / "ranks" / "rank3.exit.json").read_text())
    os.kill(record["pid"], signal.SIGSTOP)  # the cluster's nodes share this machine: the pid is here
    stopped = time.monotonic()
    wait_gone(run.name, 120)
    took = time.monotonic() - stopped
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout + stderr
    assert HANG_S <= took <= HANG_S + 30, took  # the bound, then srun ending the job's other tasks
    assert job_state(run.name)["JobState"] == "FAILED"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "failed"
    assert summary["failure"].startswith(f"rank 3 failed first (on {record['hostname']}, local rank 1): frozen: its "
                                         f"process (pid {record['pid']}) was stopped"), summary["failure"]
    assert record["node"] != json.loads((run / "ranks" / "rank0.exit.json").read_text())["node"]
    assert not [c for c in processes().values() if str(ckpt) in c], "a rank of the job outlived it"
    # memory by category, recorded at the profiled window's end on every rank (the frozen one's too), against
    # the model's own weights (torchrun_ddp.py's make_model) and SGD's momentum buffer of the same size
    weights = model_weights_bytes()
    for rank in json.loads((run / "summary.json").read_text())["ranks"]:
        (cycle,) = rank["profiler"]["cycles"]
        categories = cycle["memory_categories"]["categories"]
        assert categories["parameters"] == weights == categories["optimizer_state"], (rank["rank"], categories)


def test_out_of_memory_in_a_script_is_the_jobs_outcome(slurm_cluster, tmp_path):
    script = tmp_path / "oom_standin.py"
    script.write_text(OOM_STANDIN)
    r = submit(*TWO_BY_TWO, "--runs-dir", str(tmp_path), "--no-profile", "--wait", "--", PY, str(script), "16")
    run = run_dir_of(r.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "oom", r.stdout + r.stderr
    assert (summary["oom"]["rank"], summary["oom"]["step"], summary["oom"]["requested_bytes"]) == (1, 3, 2**31)
    (rank1,) = [x for x in summary["ranks"] if x["rank"] == 1]
    assert (rank1["kind"], rank1["exit_code"]) == ("oom", 4)  # the documented code of an out-of-memory rank
    # hpc.submit --wait: an OOM is a result (a sweep marks it and goes on), said as such, not FAILED
    assert r.returncode == 0 and f"job {run.name}: oom" in r.stdout and "FAILED" not in r.stderr, r.stderr
    wait_gone(run.name, 60)


def test_a_script_that_profiles_itself_runs_to_its_end_on_slurm(slurm_cluster, tmp_path):
    r = submit(*TWO_BY_TWO, "--runs-dir", str(tmp_path / "runs"), "--wait", "--", PY,
               str(SCRIPTS / "own_profiler_ddp.py"), "--logdir", str(tmp_path / "mine"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "mine").iterdir()) == [f"mine{r}" for r in range(4)]
    summary = json.loads((run_dir_of(r.stdout) / "summary.json").read_text())
    assert summary["outcome"] == "done" and all("stood down" in x["profiler"]["note"] for x in summary["ranks"])


def test_a_slow_rank_on_the_second_node_is_named_with_its_node(slurm_cluster, tmp_path):
    r = submit(*TWO_BY_TWO, "--runs-dir", str(tmp_path), "--wait", "--", PY, str(SCRIPTS / "comm_hook_ddp.py"),
               "--slow-rank", "3", "--slow-s", "0.3", "--steps", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_dir_of(r.stdout)
    wait_gone(run.name, 60)
    second = subprocess.run(["scontrol", "show", "hostnames", job_state(run.name)["NodeList"]], capture_output=True,
                            text=True, check=True).stdout.split()[1]  # Slurm's block layout: ranks 2-3 there
    analysed = subprocess.run([PY, "-m", "analysis", str(run)], capture_output=True, text=True, env=ENV, timeout=120)
    (verdict,) = [line for line in analysed.stdout.splitlines() if ": imbalance: " in line]
    assert f"imbalance: rank 3 on {second}: own work (before the gradient sync)" in verdict, analysed.stdout
    assert "a slow rank, not a slow node" in verdict  # rank 2, on the same node, is not slow
