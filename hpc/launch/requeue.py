"""Requeueing a job that stopped with a checkpoint (Slurm's warning before the time limit, a preemption,
a lost peer): from inside the job through submitit's handler, and where that cannot (no `scontrol` inside
a container, a controller that does not answer), from the batch shell after the step, which runs
outside any container (`teardown_lines`, added to every Slurm job's script). A requeue that fails there
too is one line in the job's log; the checkpoint stays, and resubmitting the point resumes it. A stop a
person asked for (Ctrl-C, a local SIGTERM) is not requeued. No torch import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpc.launch.submission.queue import accounted

log = logging.getLogger(__name__)

REQUEST = ".hpc-requeue"  # in the run directory: the job asks its batch shell to requeue it
SURVIVOR_GRACE_S = 30  # a rank that lost a peer waits this long for rank 0's requeue before its own


def stopped_by_user(signum: int | None, env: dict[str, str] | Any) -> bool:
    """A stop a person asked for, not the scheduler: Ctrl-C (SIGINT) anywhere; SIGTERM on this machine
    (submitit's local controller forwards the user's; on Slurm SIGTERM is a preemption). Not requeued."""
    return signum == signal.SIGINT or (signum == signal.SIGTERM and env.get("SUBMITIT_EXECUTOR") == "local")


def may_requeue(
    code: int | None, requeue_codes: Any, signum: int | None, env: dict[str, str] | Any, max_requeues: int
) -> bool:
    """The requeue rule, the one place it is written (the job's own path, hpc/launch/submission/job.py, and the
    batch shell's, hpc/launch/batch.py): a task that exited with one of its requeue codes, not stopped by
    a person, with requeues left (Slurm's restart count below the profile's max_requeues)."""
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    return code in tuple(requeue_codes) and not stopped_by_user(signum, env) and restarts < max_requeues


def restarts_in(scontrol_job: str) -> int | None:
    """Slurm's restart count of a job in `scontrol show job -o`'s line (Restarts=N), None without one."""
    found = re.search(r"(?:^|\s)Restarts=(\d+)(?:\s|$)", scontrol_job)
    return int(found.group(1)) if found else None


ALREADY = "was requeued already since this start (by its task: Lightning requeues its job on SIGUSR1): not again"
CANCELLED = "was cancelled (scancel): a person's stop is not requeued"


def not_to_requeue(job_id: str, env: dict[str, str] | Any) -> str | None:
    """Why Slurm's own state forbids requeueing the job now, in words (None: nothing does): a person
    cancelled it (its tasks saw only a SIGTERM, as in a preemption, and a requeue would undo the cancel:
    while the job completes scontrol says COMPLETING, Slurm's accounting says CANCELLED), or it was
    requeued since this start by someone else (its task: Lightning requeues its own job on SIGUSR1; a
    person): Slurm's restart count above this start's. No answer says nothing: the requeue is tried (and
    Slurm refuses a second one of a job already pending)."""
    if accounted([job_id]).get(job_id) == "CANCELLED":
        return CANCELLED
    try:
        said = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    except (subprocess.SubprocessError, OSError):
        return None
    now = restarts_in(said.stdout)
    return ALREADY if now is not None and now > int(env.get("SLURM_RESTART_COUNT") or 0) else None


@contextlib.contextmanager
def stderr_kept(kept: list[str]) -> Iterator[None]:
    """What child processes write to our stderr (fd 2) goes into `kept`, and is written out after."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            kept.append(buffer.read().decode(errors="replace"))


def requeue(submitit_handler: Any, job_id: str, run_dir: Path) -> None:
    """submitit's requeue (it pickles the job again, runs `scontrol requeue` and exits). One that fails
    inside the job (no scontrol in a container, a controller that does not answer) leaves REQUEST in the
    run directory for the batch shell (teardown_lines), and says so in one line with scontrol's words."""
    said: list[str] = []
    try:
        with stderr_kept(said):
            submitit_handler(signal.SIGUSR2, None)
    except (subprocess.SubprocessError, OSError) as e:
        lines = "".join(said).splitlines()
        sys.stderr.write("".join(f"{line}\n" for line in lines if line.startswith("submitit ")))
        words = " ".join(" ".join(line for line in lines if not line.startswith("submitit ")).split())
        with contextlib.suppress(OSError):
            (run_dir / REQUEST).write_text(job_id)
        log.warning(
            f"hpc.submit: job {job_id}: scontrol requeue failed inside the job "
            f"({(words or ' '.join(str(e).split()))[:200]}); the batch shell tries after the step"
        )
    except BaseException:
        sys.stderr.write("".join(said))  # submitit exits after a requeue: what it said still reaches the log
        raise
    else:
        sys.stderr.write("".join(said))


def requeue_if_rank0_does_not(job_id: str, rank: int, run_dir: Path, grace_s: float = SURVIVOR_GRACE_S) -> None:
    """A rank other than 0 that lost a peer, under Slurm: rank 0 requeues the job, and Slurm then ends
    every task, this one too. Unless rank 0 is the peer lost (dead, or frozen and holding the step): a
    rank still here after `grace_s` (plus its rank, so the lowest goes first) requeues it with scontrol.
    A second requeue of a job already pending is refused by Slurm, which is then all it says."""
    time.sleep(grace_s + rank)
    why_not = not_to_requeue(job_id, os.environ)
    if why_not is not None:
        log.info(f"hpc.submit: job {job_id} {why_not}")
        return
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (subprocess.SubprocessError, OSError) as e:
        log.warning(
            f"hpc.submit: job {job_id}: rank {rank} could not requeue it ({e}); its checkpoint stays in {run_dir}"
        )
        return
    said = " ".join((out.stdout + out.stderr).split())[:200]
    if out.returncode == 0:
        log.warning(f"hpc.submit: job {job_id}: rank 0 did not requeue it within {grace_s + rank:g} s; rank {rank} did")
    else:
        log.info(f"hpc.submit: job {job_id}: rank {rank}: scontrol requeue: {said} (already requeued)")


def clear_request(run_dir: Path) -> None:
    """A new attempt starts clean: a REQUEST left by one whose batch shell never ran its teardown (killed
    by a requeue from inside) must not requeue this one when it ends."""
    with contextlib.suppress(OSError):
        (run_dir / REQUEST).unlink(missing_ok=True)


def teardown_lines(folder: Path) -> list[str]:
    """The batch shell's lines after the step: requeue the job when its run directory (submitit's folder,
    %j being this job's id, or its array job id and task) holds REQUEST; then end with the step's exit code,
    so that Slurm records a job whose step failed as FAILED (not COMPLETED, which the last line would say)."""
    before, has_id, after = str(folder).partition("%j")
    mark = (
        f'{shlex.quote(before)}"$hpc_jid"{shlex.quote(after + "/" + REQUEST)}'
        if has_id
        else shlex.quote(str(folder / REQUEST))
    )
    said_ok = 'echo "hpc.submit: job $hpc_jid requeued from the batch shell"'
    said_not = (
        "echo \"hpc.submit: job $hpc_jid could not requeue itself (scontrol: ${hpc_out//$'\\n'/ }); its checkpoint "
        'stays in the run directory: resubmit the point to resume it" >&2'
    )
    return [
        "hpc_rc=$?",
        "hpc_jid=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
        "hpc_jid=${hpc_jid:-$SLURM_JOB_ID}",
        f"if [ -e {mark} ] && ! sacct -n -P -X -o State -j \"$hpc_jid\" 2>/dev/null | grep -q '^CANCELLED'; then",
        f"    rm -f {mark}",
        f'    if hpc_out=$(scontrol requeue "$hpc_jid" 2>&1); then {said_ok}; else {said_not}; fi',
        "fi",
        'exit "$hpc_rc"',
    ]
