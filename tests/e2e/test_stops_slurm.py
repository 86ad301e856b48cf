"""A person's stop is final, and Slurm is told the truth (issue 87), on the local Slurm cluster, with Slurm's
accounting (slurmdbd) and without it (slurmdbd stopped): the oracle is Slurm itself, `scontrol show job`'s
state, restart count and exit code, and a real dependent job, never the toolkit's own records alone.

- a plain `scancel` of a running script that keeps no checkpoint, and of the toolkit's training: CANCELLED,
  never requeued, the `afterok` job never starts;
- `scancel` while the job is torn down after its warning (its ranks still saving), in a job already
  requeued once: CANCELLED, one restart, no second;
- `scancel` of a pending job: CANCELLED, and `--wait` says so;
- a person's `scancel --signal=TERM`: the run stops, its job ends FAILED 3:0, the afterok job never starts,
  and the command its log prints resumes it to its end;
- one command each to follow (`hpc.submit --wait`, `hpc.job log --follow`), query (`hpc.job status`) and
  cancel (`hpc.job cancel`) a run, and to cancel a sweep (`hpc.study cancel`).

Cheap scripts (no torch) where the stop is the point; each case once per accounting mode where the
toolkit's decision could depend on it."""

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from test_own_script_slurm import SCRIPTS
from test_slurm_jobs import ENV, PY, REPO, SMOKE, job_ids, job_state, wait_gone, warn

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ONE_BY_TWO = ["--nodes", "1", "--gpus", "2", "--account", "m1234_g", "--export", "ALL,OMP_NUM_THREADS=1",
              "--no-profile"]

# A plain script that keeps no checkpoint and takes SIGTERM's default (it dies of it).
NO_SAVE = """import os, sys, time
print("started", flush=True)
for step in range(1, 100000):
    print(f"step {step}", flush=True)
    time.sleep(0.2)
"""
# A script that saves slowly on SIGTERM (longer than the cluster's KillWait, 5 s, would be too long), then exits 3.
SLOW_SAVE = """import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print(f"started {os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
while not stop:
    time.sleep(0.1)
print("saving", flush=True)
time.sleep(3)
print("saved", flush=True)
sys.exit(3)
"""


@pytest.fixture(scope="module", params=["accounting", "no accounting"])
def accounting(request, slurm_cluster):
    """Slurm's accounting as the cluster runs it, or stopped (slurmdbd down: sacct cannot answer, as on a site
    without accounting); started again after the module's tests."""
    if request.param == "accounting":
        yield True
        return
    subprocess.run(["pkill", "-x", "slurmdbd"], check=False)
    wait_until(lambda: subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, timeout=60).returncode != 0,
               "sacct to fail with slurmdbd stopped", 60)
    try:
        yield False
    finally:
        subprocess.run(["slurmdbd"], check=True)
        wait_until(lambda: subprocess.run(["sacctmgr", "-n", "list", "cluster"], capture_output=True,
                                          timeout=60).returncode == 0, "slurmdbd to answer again", 60)


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def submitted(tmp_path: Path, *words: str, runs: str = "runs") -> tuple[str, Path]:
    """hpc.submit of `words` (hpc.submit's own options first where they end with --) on 1 node x 2 GPUs."""
    own, words = (words[: words.index("--")], words[words.index("--") + 1 :]) if "--" in words else ((), words)
    command = ["--", *words] if words else []  # none: the toolkit's training
    r = subprocess.run([PY, "-m", "hpc.submit", *ONE_BY_TWO, *own, "--runs-dir", str(tmp_path / runs), *command],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (job,) = job_ids(r.stdout)
    (run,) = (tmp_path / runs).glob(f"*/{job}")
    return job, run


def dependent(tmp_path: Path, job: str) -> str:
    """A CPU job that may start only after `job` finished (afterok)."""
    r = subprocess.run(["sbatch", "--parsable", "-A", "m1234", "-C", "cpu", "-t", "5", "-d", f"afterok:{job}",
                        "-o", str(tmp_path / "after-%j.out"), "--wrap", "echo ran"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def never_ran(job: str) -> None:
    """The afterok job was never started: Slurm holds it for good (DependencyNeverSatisfied); then removed."""
    wait_until(lambda: job_state(job).get("Reason") == "DependencyNeverSatisfied", f"job {job} to be held", 60)
    assert job_state(job)["JobState"] == "PENDING"
    subprocess.run(["scancel", job], check=True)


def said(run: Path, needle: str, rank: int = 0) -> bool:
    out = run / "logs" / f"rank{rank}.out"
    return out.exists() and needle in out.read_text()


def cancelled_for_good(job: str, restarts: str) -> dict:
    """Slurm's word once the job left the queue: CANCELLED, with `restarts` restarts and no more."""
    wait_gone(job, 120)
    state = job_state(job)
    assert state["JobState"] == "CANCELLED" and state["Restarts"] == restarts, state
    return state


def test_a_scancel_ends_a_running_script_for_good(accounting, tmp_path):
    """A plain script, no checkpoint, killed by Slurm's SIGTERM: one scancel, CANCELLED, never requeued;
    the afterok job never runs; summary.json says cancelled, as Slurm does."""
    job, run = submitted(tmp_path, PY, str(script(tmp_path, "nosave.py", NO_SAVE)))
    after = dependent(tmp_path, job)
    wait_until(lambda: said(run, "step 3"), "the script's third step")
    subprocess.run(["scancel", job], check=True)
    cancelled_for_good(job, "0")
    never_ran(after)
    assert json.loads((run / "summary.json").read_text())["outcome"] == "cancelled"
    assert f"resume with: python -m hpc.submit --resume {run}" in (run / f"{job}_0_log.out").read_text()


def test_a_scancel_ends_the_toolkits_training_for_good(accounting, data_root, tmp_path):
    """jobs/resnet152.sbatch: the training saves on Slurm's SIGTERM and exits 3, a requeue code; the batch
    shell got SIGTERM too, so it is a person's scancel: CANCELLED, never requeued."""
    run = tmp_path / "run"
    r = subprocess.run(["sbatch", "--parsable", "--export=ALL,OMP_NUM_THREADS=1", "-N", "1", "--ntasks-per-node=1",
                        "-o", str(tmp_path / "out-%j.txt"), "jobs/resnet152.sbatch", "--config", SMOKE, "--data-root",
                        str(data_root), "--run-dir", str(run), "--epochs", "200", "--no-profile"],
                       capture_output=True, text=True, cwd=REPO, env=ENV)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    wait_until(lambda: (run / "metrics.jsonl").exists(), "the training's first records", 180)
    subprocess.run(["scancel", job], check=True)
    cancelled_for_good(job, "0")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "cancelled", summary["outcome"]
    log = (tmp_path / f"out-{job}.txt").read_text()
    assert "was ended by Slurm (scancel, its time limit or a preemption): not requeued" in log, log[-2000:]


def test_a_scancel_during_the_teardown_of_a_job_requeued_once_is_final(accounting, tmp_path):
    """The warning requeues the job once (Restarts 1); the second start is warned too, and while its ranks
    still save (a script that saves slowly), a person cancels it: CANCELLED, Restarts still 1."""
    job, run = submitted(tmp_path, PY, str(script(tmp_path, "slow_save.py", SLOW_SAVE)))
    scancel_in_the_second_teardown(job, run, lambda: said(run, "started 0"), "started 1")


@pytest.mark.parametrize("accounting", ["no accounting"], indirect=True)
def test_a_scancel_during_the_teardown_of_the_trainings_job_requeued_once_is_final(accounting, data_root, tmp_path):
    """The same with the toolkit's training (2 s steps: its ranks finish their step, then save), once: without
    accounting; with it, the script's case above takes the accounting's road the training's would."""
    job, run = submitted(tmp_path, "--export", "ALL,OMP_NUM_THREADS=1,HPC_FAULT_INJECT=slow-step:2000", "--config",
                         SMOKE, "--data-root", str(data_root), "--epochs", "50", "--")
    scancel_in_the_second_teardown(job, run, lambda: (run / "metrics.jsonl").exists(), "resuming from")


def scancel_in_the_second_teardown(job: str, run: Path, started, second: str) -> None:
    """Warned and requeued once; warned again in its second start, and cancelled as its ranks stop."""
    wait_until(started, "the first start", 180)
    warn(job)
    wait_until(lambda: job_state(job).get("Restarts") == "1", "the requeue", 120)
    deadline, held_since = time.monotonic() + 180, None
    while not said(run, second):  # Slurm's hold of a requeued job cut short, not at once (wait_gone says why)
        if "BeginTime" in job_state(job).get("Reason", ""):
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since >= 3:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
        assert time.monotonic() < deadline, job_state(job)
        time.sleep(1)
    warn(job)
    told = "Slurm's warning (SIGUSR2): the ranks are told to save and stop"
    wait_until(lambda: (run / f"{job}_0_log.out").read_text().count(told) == 2, "the second warning told")
    subprocess.run(["scancel", job], check=True)
    cancelled_for_good(job, "1")


def test_a_pending_jobs_scancel_is_said_cancelled(accounting, tmp_path):
    """Held in the queue (sbatch's --hold), then cancelled: `--wait` says cancelled and exits 3."""
    proc = subprocess.Popen([PY, "-m", "hpc.submit", *ONE_BY_TWO, "--sbatch", "hold", "--runs-dir", str(tmp_path),
                             "--wait", "--", PY, "-c", "pass"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=ENV)
    wait_until(lambda: list(tmp_path.glob("*/*/*_submitted.pkl")), "the job to be submitted")
    job = next(tmp_path.glob("*/*/*_submitted.pkl")).name.split("_")[0]
    assert job_state(job)["JobState"] == "PENDING"
    subprocess.run(["scancel", job], check=True)
    out, err = proc.communicate(timeout=120)
    assert job_state(job)["JobState"] == "CANCELLED"
    assert proc.returncode == 3 and f"job {job}: cancelled before its task started" in err, out + err


def test_a_persons_stop_holds_afterok_and_the_printed_command_resumes_it(slurm_cluster, tmp_path):
    """scancel --signal=TERM (the ranks alone): the script saves and exits 3; no warning reached the batch
    shell, so it is a person's stop: FAILED 3:0, the afterok job never starts. The line the job's log prints
    resumes the run in its own directory to its end, from the saved epoch."""
    words = [PY, str(SCRIPTS / "torchrun_ddp.py"), "--epochs", "4", "--ckpt", str(tmp_path / "c.ck"), "--out",
             str(tmp_path / "c.pt"), "--step-sleep", "0.2"]
    job, run = submitted(tmp_path, *words)
    after = dependent(tmp_path, job)
    wait_until(lambda: said(run, "epoch 1"), "the script's second epoch")
    subprocess.run(["scancel", "--signal=TERM", job], check=True)
    wait_gone(job, 120)
    state = job_state(job)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("FAILED", "3:0", "0"), state
    never_ran(after)
    log = (run / f"{job}_0_log.out").read_text() + (run / f"{job}_0_log.err").read_text()
    (resume,) = re.findall(r"resume with: (python -m hpc\.submit --resume \S+)$", log, flags=re.M)
    r = subprocess.run([*resume.replace("python", PY, 1).split(), "--wait"], capture_output=True, text=True,
                       cwd=tmp_path, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (again,) = job_ids(r.stdout)
    assert f"job {again}: run dir {run}" in r.stdout and job_state(again)["JobState"] == "COMPLETED"
    assert "rank 0: resumed at epoch" in (run / "logs" / "rank0.out").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and [e["outcome"] for e in summary["earlier"]] == ["stopped"]


def test_a_run_is_followed_queried_and_cancelled_with_one_command_each(slurm_cluster, tmp_path):
    """`hpc.submit --wait` and `hpc.job log JOB --follow` show rank 0's lines while Slurm says RUNNING;
    `hpc.job cancel RUN` ends it for good (Slurm: CANCELLED, no restart); the follower stops by itself once
    the job has left the queue; `hpc.job status RUN` says what Slurm says, and the line that resumes it."""
    words = [PY, str(script(tmp_path, "nosave.py", NO_SAVE))]
    waiting = subprocess.Popen([PY, "-m", "hpc.submit", *ONE_BY_TWO, "--runs-dir", str(tmp_path / "runs"), "--wait",
                                "--", *words], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=ENV)
    follower = None
    try:
        wait_until(lambda: list((tmp_path / "runs").glob("*/*/task.json")), "the run to start")
        run = next((tmp_path / "runs").glob("*/*/task.json")).parent
        job = run.name
        follower = subprocess.Popen([PY, "-m", "hpc.job", "log", job, "--follow"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV, bufsize=1)
        seen, deadline = "", time.monotonic() + 180
        while "step 3" not in seen:
            assert time.monotonic() < deadline and follower.poll() is None, seen + follower.stderr.read()
            if select.select([follower.stdout], [], [], 1)[0]:
                seen += follower.stdout.readline()
        assert seen.startswith("started\n") and job_state(job)["JobState"] == "RUNNING", seen
        cancel = subprocess.run([PY, "-m", "hpc.job", "cancel", str(run)], capture_output=True, text=True, env=ENV)
        assert cancel.returncode == 0 and f"job {job}: cancelled (scancel): final" in cancel.stdout, cancel
        cancelled_for_good(job, "0")
        follower.communicate(timeout=60)  # it ends by itself once the job has left the queue
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 3 and "step 3" in out and f"job {job}: cancelled" in out, out + err
        status = subprocess.run([PY, "-m", "hpc.job", "status", str(run)], capture_output=True, text=True, env=ENV)
        assert status.returncode == 0, status.stderr
        assert f"job:     {job} (Slurm: CANCELLED)" in status.stdout and "outcome: cancelled" in status.stdout
        assert f"resume:  python -m hpc.submit --resume {run}" in status.stdout, status.stdout
    finally:
        for proc in (waiting, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_a_sweep_is_cancelled_with_one_command(slurm_cluster, tmp_path):
    """`hpc.study cancel SWEEP`: every job of it, its array's tasks running or pending and its analysis job,
    CANCELLED in Slurm's word; none runs after."""
    sweep_file = script(tmp_path, "sweep.yaml", "sweep: {name: stops, batch_sizes: [8], gpus: [1], axes: {seed: [1, 2, 3]}}\n"
                        "command: {args: ['{seed}']}\n")
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep_file), "-A", "m1_g", "--max-parallel", "1", "--runs-dir",
                        str(tmp_path / "runs"), "--no-profile", "--", PY, str(script(tmp_path, "nosave.py", NO_SAVE))],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (array,) = re.findall(r"^arrays:\s+(\d+)$", r.stdout, flags=re.M)
    (analysis,) = re.findall(r"^analysis: job (\d+)", r.stdout, flags=re.M)
    (sweep,) = (tmp_path / "runs" / "stops").glob("sweep-*")
    wait_until(lambda: any(said(p, "step 2") for p in sweep.glob(f"{array}_*")), "a point to run")
    out = subprocess.run([PY, "-m", "hpc.study", "cancel", str(sweep)], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0 and f"cancelled (scancel) job(s) {array} {analysis}: final" in out.stdout, out
    wait_gone(array, 120)
    wait_gone(analysis, 60)
    states = [job_state(f"{array}_{task}")["JobState"] for task in range(3)] + [job_state(analysis)["JobState"]]
    assert states == ["CANCELLED"] * 4, states


def test_a_preemption_is_requeued_by_slurm_and_resumes(slurm_cluster, tmp_path):
    """NERSC's preempt QOS (tests/slurm/cluster.sh: PreemptType=preempt/qos, PreemptMode=REQUEUE, a grace time
    of 3 s): a regular job needs the node. Slurm sends the tasks SIGTERM (as a person's scancel --signal
    would), the script saves and exits 3; the batch shell sees Slurm's PreemptTime and waits for Slurm, which
    requeues the job at the grace time's end. It resumes from the saved epoch to its end: COMPLETED, one
    restart (Slurm's), the first start's end recorded stopped, not cancelled."""
    words = [PY, str(SCRIPTS / "torchrun_ddp.py"), "--epochs", "3", "--ckpt", str(tmp_path / "c.ck"), "--out",
             str(tmp_path / "c.pt"), "--step-sleep", "0.2"]
    r = subprocess.run([PY, "-m", "hpc.submit", *ONE_BY_TWO, "-q", "preempt", "-w", "nid008", "--exclusive",
                        "--runs-dir", str(tmp_path / "runs"), "--", *words], capture_output=True, text=True,
                       cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (job,) = job_ids(r.stdout)
    (run,) = (tmp_path / "runs").glob(f"*/{job}")
    wait_until(lambda: said(run, "epoch 1"), "the script's second epoch")
    regular = subprocess.run(["sbatch", "--parsable", "-A", "m1234", "-q", "regular", "-w", "nid008", "--exclusive",
                              "-t", "2", "-o", "/dev/null", "--wrap", "sleep 1"], capture_output=True, text=True)
    assert regular.returncode == 0, regular.stderr
    wait_until(lambda: job_state(job).get("Restarts") == "1", "Slurm's requeue of the preempted job", 120)
    wait_gone(job, 300, hurry_requeue=True)
    state = job_state(job)
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), state
    log = (run / f"{job}_0_log.out").read_text() + (run / f"{job}_0_log.err").read_text()
    assert f"job {job} is being preempted (Slurm's PreemptTime is set)" in log, log[-3000:]
    assert "requeueing job" not in log  # Slurm's requeue, not a second of ours
    assert "rank 0: resumed at epoch" in (run / "logs" / "rank0.out").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and [e["outcome"] for e in summary["earlier"]] == ["stopped"], summary
