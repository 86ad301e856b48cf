"""The Slurm queue, asked through squeue and sacct: which jobs are still listed and in what state, and how
ended jobs ended. Used by hpc.submit (waiting for jobs) and hpc.study (status, waiting for the report).

Without slurmdbd, sacct cannot say that a job ended (submitit's own done() then waits for a result file
a killed job never writes); squeue can, by no longer listing it. The parsers take squeue's and sacct's
text as they print it, so they are tested on literal outputs. No torch import.
"""

from __future__ import annotations

import shutil
import subprocess

# squeue's states (%T) -> the states hpc.study shows; a state not listed here is shown lower-cased.
QUEUE_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "REQUEUED": "requeued",
    "REQUEUE_HOLD": "requeued",
    "REQUEUE_FED": "requeued",
    "SUSPENDED": "pending",
}
# sacct's states of ended jobs -> the same.
SACCT_STATES = {
    "COMPLETED": "done",
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "OUT_OF_MEMORY": "failed",
    "CANCELLED": "failed",
    "NODE_FAIL": "failed",
    "PREEMPTED": "stopped",
    "BOOT_FAIL": "failed",
}


def parse_squeue(stdout: str) -> dict[str, str]:
    """`squeue -h -r -o '%i %T'` -> {job id: state}; array tasks are listed one by one (123_4)."""
    return dict(line.split(None, 1) for line in stdout.splitlines() if len(line.split()) == 2)


def parse_sacct(stdout: str) -> dict[str, str]:
    """`sacct -n -P -X -o JobID,State` -> {job id: state} ("CANCELLED by 0" -> CANCELLED)."""
    out = {}
    for line in stdout.splitlines():
        if line.count("|") == 1 and line.split("|")[1].split():
            job_id, state = line.split("|")
            out[job_id] = state.split()[0]
    return out


def queued(job_ids: list[str]) -> dict[str, str] | None:
    """{job id: Slurm state} of the given jobs (or arrays) that squeue still lists; {} when none is;
    None when the queue cannot say (no squeue here, or it failed)."""
    if not job_ids or not shutil.which("squeue"):
        return None if job_ids else {}
    q = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(sorted(set(job_ids)))], capture_output=True, text=True
    )
    if q.returncode != 0:
        # All the ids unknown (purged after the job ended): none is queued. Anything else: unknown.
        return {} if "Invalid job id" in q.stderr else None
    return parse_squeue(q.stdout)


def left_queue(job_id: str) -> bool:
    """True when squeue no longer lists the job (an array task by its own id, 123_4)."""
    listed = queued([job_id.split("_")[0]])
    return listed is not None and job_id not in listed


def accounted(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} from sacct where it works (it needs slurmdbd); {} elsewhere."""
    if not job_ids or not shutil.which("sacct"):
        return {}
    q = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(sorted(set(job_ids)))],
        capture_output=True,
        text=True,
    )
    return parse_sacct(q.stdout) if q.returncode == 0 else {}
