"""One run's commands (hpc/launch/jobcmd.py: `python -m hpc.job log|status|cancel`) against stand-in Slurm
clients that print what Slurm 22.05 prints: where a job id leads, which job is the run's latest, what cancel
asks of Slurm. The real cluster: tests/e2e/test_stops_slurm.py."""

import os
import time

import pytest

from commands import call
from hpc.core.ending import RankEnd, RankExit
from recordedruns import recorded_run


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """scontrol (`show job` prints SCONTROL_SAYS), squeue (SQUEUE_SAYS), scancel (logged) first on PATH;
    returns the log of what was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, says in (("scontrol", "SCONTROL_SAYS"), ("squeue", "SQUEUE_SAYS"), ("scancel", "")):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "$CALLS"\n'
                                    + (f'printf "%s\\n" "${says}"\n' if says else ""))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("SQUEUE_SAYS", "")
    return tmp_path / "calls"


def started(tmp_path, *attempts):
    """A run whose ranks started as `attempts` (JOB.RESTART.GROUP), one exit record each, in that order."""
    return recorded_run(tmp_path / "run", [
        RankExit(rank=0, kind=RankEnd.STOPPED, attempt=attempt, started_ns=n, ended_ns=n + 1, exit_code=3)
        for n, attempt in enumerate(attempts, 1)][-1:])


def test_a_job_id_leads_to_its_run_directory_through_its_log(slurm, tmp_path, monkeypatch):
    """hpc.submit's job: its log lies in the run. A hand-written script's: its log (sbatch -o) says the run
    directory in the batch shell's first line. Slurm that no longer knows the job: one line, exit 2."""
    from hpc.launch.jobcmd import find_run

    run = started(tmp_path, "41.0.0")
    monkeypatch.setenv("SCONTROL_SAYS", f"JobId=41 JobState=RUNNING StdOut={run.root}/41_0_log.out")
    assert find_run("41").root == run.root
    log = tmp_path / "resnet152-42.out"
    log.write_text(f"job 42 (restart 0) on nid001: 1 node(s) x 4 GPU(s); run dir {run.root}\nepoch 0\n")
    monkeypatch.setenv("SCONTROL_SAYS", f"JobId=42 JobState=RUNNING StdOut={log}")
    assert find_run("42").root == run.root
    assert find_run(str(run.root)).root == run.root
    monkeypatch.setenv("SCONTROL_SAYS", "slurm_load_jobs error: Invalid job id specified")
    out = call("hpc.job", ["status", "43"])
    assert out.code == 2 and out.stderr.strip() == ("hpc.job: error: command line: job 43: Slurm no longer knows it: "
                                                    "give the run directory"), out.stderr


def test_the_runs_latest_job_is_its_latest_start_or_a_resume_waiting(tmp_path):
    from hpc.core.rundir import RunPaths
    from hpc.launch.jobcmd import latest_job

    run = started(tmp_path, "41.0.0", "41.1.0")
    assert latest_job(run) == "41"
    (run.root / "41_submitted.pkl").write_bytes(b"")
    assert latest_job(run) == "41"  # the job that started
    time.sleep(0.01)
    (run.root / "57_submitted.pkl").write_bytes(b"")
    assert latest_job(run) == "57"  # submitted into it since (hpc.submit --resume), not started yet
    sweep_point = RunPaths(tmp_path / "point")
    recorded_run(sweep_point.root, [RankExit(rank=0, kind=RankEnd.RUNNING, attempt="60_2.0.0", started_ns=1)])
    assert latest_job(sweep_point) == "60_2"


@pytest.mark.parametrize("queue, asked, said", [
    ("41|RUNNING|0|", ["scancel 41"], "job 41: cancelled (scancel): final, never requeued; resume later with: "
                                    "python -m hpc.submit --resume {run}"),
    ("", [], "job 41: not in the queue (Slurm: CANCELLED): nothing to cancel"),
])
def test_cancel_is_one_scancel_of_the_runs_job_while_the_queue_holds_it(slurm, tmp_path, monkeypatch, queue, asked,
                                                                         said):
    run = started(tmp_path, "41.0.0")
    monkeypatch.setenv("SQUEUE_SAYS", queue)
    monkeypatch.setenv("SCONTROL_SAYS", f"JobId=41 JobState=CANCELLED StdOut={run.root}/41_0_log.out")
    out = call("hpc.job", ["cancel", str(run.root)])
    assert out.code == 0 and out.stdout.strip() == said.format(run=run.root), out.stdout + out.stderr
    calls = [c for c in slurm.read_text().splitlines() if not c.startswith(("squeue", "scontrol"))]
    assert calls == asked


def test_a_local_run_is_not_cancelled_from_here(slurm, tmp_path):
    """hpc.submit --local's ranks (launcher submitit-local; their job id a pid): no scancel of anything."""
    run = recorded_run(tmp_path / "run", [RankExit(rank=0, kind=RankEnd.RUNNING, attempt="12345.0.0", started_ns=1,
                                                   launcher="submitit-local")])
    out = call("hpc.job", ["cancel", str(run.root)])
    assert out.code == 2 and "a local run stops with Ctrl-C where it runs" in out.stderr, out.stderr
    assert not slurm.exists()  # Slurm not even asked
