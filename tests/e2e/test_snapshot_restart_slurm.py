"""The torchrun-snapshot script (tests/scripts/snapshot_ddp.py) on the local Slurm cluster, 2 nodes x 1
under `cluster.launcher: torchrun` (one agent a node), the second node's rank 1 SIGKILLed mid-run (issue
52): the same Slurm job (no requeue) restarts the worker group on both nodes, which resumes from the
snapshot to the uninterrupted run's weights; the lost rank is named (the first node's agent, restarting
its worker for the other's, may count no restart of its own: its rank's attempt then stays J.0.0); no
script of any start is left on any node. Here, with reasons: tests/e2e/test_snapshot_restart.py."""

import json
import os
import signal
import subprocess
import time

import pytest

from test_own_script_slurm import ENV, PY, REPO, TWO_BY_ONE
from test_slurm_jobs import job_state, wait_gone
from test_snapshot_restart import ARGS, LATE, RESTART_BOUND_S, SNAPSHOT, digest_in, rank_pid, straight_digest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def script_processes(snapshot: str) -> list[int]:
    """Live processes of the snapshot script writing `snapshot`, on any node (all of them are here)."""
    out = subprocess.run(["pgrep", "-f", f"{SNAPSHOT}.*{snapshot}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_rank_killed_on_the_second_node_restarts_both_nodes_from_the_snapshot(slurm_cluster, tmp_path):
    expected = straight_digest(tmp_path / "straight", 2)
    snapshot = str(tmp_path / "snapshot.pt")
    proc = subprocess.Popen([PY, "-m", "hpc.submit", *TWO_BY_ONE, "--no-profile", "--name", "snap", "--runs-dir",
                             str(tmp_path / "runs"), "--set", "cluster.launcher=torchrun", "--set",
                             "cluster.max_restarts=2", "--wait", "--", "sh", "-c", LATE, PY, str(SNAPSHOT), *ARGS,
                             "--snapshot_path", snapshot], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=ENV)
    deadline = time.monotonic() + 180
    while not list((tmp_path / "runs" / "snap").glob("*/logs/rank0.out")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    run = next((tmp_path / "runs" / "snap").glob("*/logs/rank0.out")).parents[1]
    job = run.name
    deadline = time.monotonic() + 180
    while "Epoch 2 | Training snapshot saved" not in (run / "logs" / "rank0.out").read_text():
        assert time.monotonic() < deadline, (run / "logs" / "rank0.out").read_text()
        time.sleep(0.2)
    record = json.loads((run / "ranks" / "rank1.exit.json").read_text())
    assert record["node_rank"] == 1 and record["local_rank"] == 0, record  # the second node's
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    wait_gone(job, RESTART_BOUND_S)
    out, err = proc.communicate(timeout=60)
    state = job_state(job)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "0", state  # the same job, no requeue
    said = [line for line in err.splitlines() if "torchrun restarted the worker group" in line]
    assert len(said) == 1 and "1 time" in said[0] and "rank 1 (" in said[0] and "SIGKILL" in said[0], out + err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["attempt"] == f"{job}.0.1", summary
    assert [e["attempt"] for e in summary["earlier"]] == [f"{job}.0.0"], summary["earlier"]
    assert summary["earlier"][0]["first"].startswith("rank 1 ("), summary["earlier"]
    # the second node counted a restart; the first counts one only when its worker failed before its agent
    # saw the other node rejoin (seen both ways): either way one start of the group, all of it done
    assert summary["ranks"][1]["attempt"] == f"{job}.0.1" and [r["kind"] for r in summary["ranks"]] == ["ok"] * 2
    assert len(list((run / "ranks" / "earlier").iterdir())) == 2  # every rank's end of the first start
    log = (run / "logs" / "rank0.out").read_text()
    assert log.count("Resuming training from snapshot at Epoch 3") == 1, log
    assert digest_in(log) == expected
    assert script_processes(snapshot) == []
