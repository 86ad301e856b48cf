"""Every signal a job can get, on the local Slurm cluster (issue 52): 2 nodes x 2 tasks through hpc.submit
(submitit). `scancel --signal=USR1` (Lightning's requeue signal; Slurm sends it to every process of the
step) leaves the per-rank wrappers alive and reaches every rank's script; the time limit's warning (SIGUSR2
to the batch shell, passed on to the tasks as SIGTERM) makes the Lightning-like script (tests/scripts/bypass_sigterm.py)
exit 0 unfinished: recorded as stopped, not done, the job requeued once, and the second start runs to
its end. No script process is left on any node. The same here: tests/e2e/test_runner_signals.py."""

import json
import subprocess
import time

import pytest

from test_own_script_slurm import ENV, PY, REPO, TWO_BY_TWO
from test_runner_signals import SCRIPT
from test_slurm_jobs import job_state, wait_gone, warn

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def outs_holding(runs, needle: str, count: int, timeout_s: float = 180) -> list:
    """The ranks' logs once `count` of them hold `needle` (each occurrence counted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        outs = sorted(runs.glob("*/*/logs/rank*.out"))
        if sum(o.read_text().count(needle) for o in outs) >= count:
            return outs
        assert time.monotonic() < deadline, [o.read_text() for o in outs]
        time.sleep(0.5)


def test_usr1_reaches_every_script_and_an_unfinished_exit_0_is_requeued_once(slurm_cluster, tmp_path):
    # 150 steps of 0.1 s: long enough for the signals below, short enough for the requeued start to finish
    proc = subprocess.Popen([PY, "-m", "hpc.submit", *TWO_BY_TWO, "--runs-dir", str(tmp_path), "--no-profile",
                             "--wait", "--", PY, str(SCRIPT), "--steps", "150"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    outs = outs_holding(tmp_path, "started", 4)
    run = outs[0].parents[1]
    job = run.name
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    outs_holding(tmp_path, "got SIGUSR1", 4)
    assert job_state(job)["JobState"] == "RUNNING"  # no wrapper died of it
    warn(job)  # the time limit's warning: the batch shell tells the tasks (SIGTERM)
    wait_gone(job, 300, hurry_requeue=True)
    out, err = proc.communicate(timeout=120)
    said = {o.name: o.read_text() for o in outs}
    for text in said.values():  # the first start stopped early, the second ran to its end
        assert text.count("started") == 2 and "got SIGUSR1" in text, said
        assert text.index("Bypassing SIGTERM") < text.index("stopping early") < text.rindex("started"), said
        assert text.rstrip().endswith("finished"), said
    assert job_state(job)["Restarts"] == "1"  # requeued once, by rank 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["attempt"] == f"{job}.1.0", out + err
    left = subprocess.run(["pgrep", "-f", str(SCRIPT)], capture_output=True, text=True).stdout.split()
    assert not left, f"script processes left after the job: {left}"


def test_usr1_never_kills_the_wrapper_under_torchrun(slurm_cluster, tmp_path):
    """launcher torchrun: torchrun's agent would die of SIGUSR1 (it handles TERM, INT, HUP, QUIT); it is
    started with SIGUSR1 ignored, and its workers pass their own on. The run then ends done."""
    r = subprocess.Popen([PY, "-m", "hpc.submit", *TWO_BY_TWO, "--set", "cluster.launcher=torchrun", "--runs-dir", str(tmp_path),
                          "--no-profile", "--wait", "--", PY, str(SCRIPT), "--steps", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    outs = outs_holding(tmp_path, "started", 4)
    subprocess.run(["scancel", "--signal=USR1", outs[0].parents[1].name], check=True)
    outs_holding(tmp_path, "got SIGUSR1", 4)
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, out + err
    summary = json.loads((outs[0].parents[1] / "summary.json").read_text())
    assert summary["outcome"] == "done" and [x["launcher"] for x in summary["ranks"]] == ["torchrun"] * 4
