"""Requeueing a job that stopped with a checkpoint (Slurm's warning before the time limit, a preemption,
a lost peer), in one place: the ranks decide (`ask_for_requeue`: the rule `may_requeue` held, Slurm's
own state asked by rank 0, a mark left in the run directory), and the batch shell acts once, after the
job's step has ended (`teardown_lines`, added to every Slurm job's script: outside the step, so no
signal Slurm sends the step's processes can cut its `scontrol requeue`, and outside any container), as
TorchX's batch script does. The batch shell of a hand-written sbatch script (hpc/launch/batch.py) is
the same act on the same rule. A requeue that fails is one line in the job's log; the checkpoint stays,
and resubmitting the point resumes it. A stop a person asked for (Ctrl-C, a local SIGTERM, scancel) is
not requeued. No torch import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.ending import SLURM_CANCELLED, RankEnd
from hpc.core.errors import EXIT_PEER_LOST, EXIT_PREEMPTED, QueueError
from hpc.core.files import write_atomic
from hpc.core.summary import exit_code_of
from hpc.launch.submission.queue import accounted, ask_slurm

log = logging.getLogger(__name__)

REQUEST = ".hpc-requeue"  # in the run directory: the ranks ask their batch shell to requeue the job


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


def requeue_code(record: Mapping[str, Any]) -> int | None:
    """The code the requeue rule reads for a rank's end, None where the rank's end is not one to resume: a
    stopped rank's own (its requeue code; 3 for exit 0 unfinished after a stop), and 3 for a rank killed
    after the grace time that followed a SIGTERM: a command that took the stop and did not end in time
    (Lightning's DDP ranks, deadlocked by the collective in its SIGTERM handler: docs/faults.md) resumes
    from what it last saved, as a task srun killed on its batch shell's SIGTERM does."""
    kind = record.get("kind")
    if kind == RankEnd.STOPPED:
        return exit_code_of(record)
    if kind == RankEnd.KILLED and record.get("stop") == signal.SIGTERM.name:
        return EXIT_PREEMPTED
    return None


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
    if accounted([job_id]).get(job_id) == SLURM_CANCELLED:
        return CANCELLED
    try:
        said = ask_slurm(["scontrol", "show", "job", "-o", job_id])
    except QueueError:
        return None
    return requeued_since(said.stdout, env)


def requeued_since(scontrol_job: str, env: dict[str, str] | Any) -> str | None:
    """ALREADY where `scontrol show job -o`'s restart count is above this start's (SLURM_RESTART_COUNT, 0
    when unset); None where it is not, or says none."""
    now = restarts_in(scontrol_job)
    return ALREADY if now is not None and now > int(env.get("SLURM_RESTART_COUNT") or 0) else None


def ask_for_requeue(job_id: str, rank: int, code: int | None, run_dir: Path, why: str) -> bool:
    """A rank whose task asked to be requeued (the rule held): the mark the batch shell reads once the step
    has ended. Rank 0 decides for the job, after asking Slurm whether it may (not_to_requeue: a person's
    cancel, a requeue made since this start); a rank that lost its peer marks too, without asking (rank 0
    may be the peer lost, dead or frozen). `why` says how the task ended, in rank 0's line. Whether the
    mark is there; a failed write is said."""
    if rank == 0:
        why_not = not_to_requeue(job_id, os.environ)
        if why_not is not None:
            log.info(f"hpc: job {job_id} {why_not}")
            return False
    elif code != EXIT_PEER_LOST:
        return False  # a stop's requeue is rank 0's to ask for
    try:
        write_atomic(run_dir / REQUEST, job_id)
    except OSError as e:
        log.warning(
            f"hpc: job {job_id}: rank {rank} could not ask its batch shell for a requeue ({e}); "
            f"its checkpoint stays in {run_dir}: resubmit the point to resume it"
        )
        return False
    if rank == 0:
        log.info(f"hpc: {why}: job {job_id} is requeued by its batch shell once its step has ended")
    return True


def clear_request(run_dir: Path) -> None:
    """A new attempt starts clean: a REQUEST left by one whose batch shell never ran its teardown (killed
    by a requeue from inside) must not requeue this one when it ends."""
    with contextlib.suppress(OSError):  # none there (FileNotFoundError) is the usual case
        (run_dir / REQUEST).unlink()


# The batch shell's line before the step: a SIGTERM to it (a preemption signals the batch shell too) waits
# for the step to end, so that the teardown lines still run (bash runs a trapped signal's handler once its
# foreground command has ended; srun, exec'd, gets the default disposition back).
KEEP_TEARDOWN = "trap 'echo \"hpc.submit: the batch shell got SIGTERM: its step ends first\" >&2' TERM"


def teardown_lines(folder: Path) -> list[str]:
    """The batch shell's lines after the step: requeue the job when its run directory (submitit's folder,
    %j being this job's id, or its array job id and task) holds REQUEST; then end with the step's exit code,
    so that Slurm records a job whose step failed as FAILED (not COMPLETED, which the last line would say)."""
    mark = '"$hpc_jid"'.join(shlex.quote(part) for part in str(folder / REQUEST).split("%j"))  # every %j, as submitit
    said_ok = 'echo "hpc.submit: job $hpc_jid requeued from the batch shell"'
    said_already = f'echo "hpc.submit: job $hpc_jid {ALREADY}"'
    said_not = (
        "echo \"hpc.submit: job $hpc_jid could not requeue itself (scontrol: ${hpc_out//$'\\n'/ }); its checkpoint "
        'stays in the run directory: resubmit the point to resume it" >&2'
    )
    return [
        "hpc_rc=$?",
        "hpc_jid=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
        "hpc_jid=${hpc_jid:-$SLURM_JOB_ID}",
        f'if [ -e {mark} ] && ! sacct -n -P -X -o State -j "$hpc_jid" 2>/dev/null '
        f"| grep -q '^{SLURM_CANCELLED}'; then",
        f"    rm -f {mark}",
        "    hpc_restarts=$(scontrol show job -o \"$hpc_jid\" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)",
        '    if [ "${hpc_restarts:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]; then',
        f"        {said_already}",
        f'    elif hpc_out=$(scontrol requeue "$hpc_jid" 2>&1); then {said_ok}; else {said_not}; fi',
        "fi",
        'exit "$hpc_rc"',
    ]
