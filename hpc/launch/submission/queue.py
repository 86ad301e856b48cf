"""The Slurm queue, asked through squeue and sacct: which jobs are still listed and in what state, and how
ended jobs ended. Used by hpc.submit (waiting for jobs) and hpc.study (status, waiting for the report).

Without slurmdbd, sacct cannot say that a job ended (submitit's own done() then waits for a result file
a killed job never writes); squeue can, by no longer listing it. The parsers take squeue's and sacct's
text as they print it, so they are tested on literal outputs. No torch import.

A controller that does not answer is not an empty queue: `queued` raises QueueError (squeue failed or
timed out), and its callers say "unknown" or keep waiting, never "ended". A machine without squeue at
all (a laptop, local runs) has nothing queued.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import subprocess
import time

from hpc.core.errors import QueueError

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 60  # squeue retries a silent controller for a while itself; past this, it is down


# squeue -O: the job (an array task as 123_4), its state and Slurm's count of its restarts (requeues)
SQUEUE_FIELDS = "JobArrayID:|,State:|,RestartCnt:|"


@dataclasses.dataclass(frozen=True)
class Queued:
    """A job as squeue lists it: its state and how often Slurm restarted it (a requeue, Slurm's or ours)."""

    state: str
    restarts: int = 0


def parse_squeue(stdout: str) -> dict[str, Queued]:
    """`squeue -h -r -O SQUEUE_FIELDS` -> {job id: Queued}; array tasks are listed one by one (123_4)."""
    out = {}
    for line in stdout.splitlines():
        job, state, restarts, *_ = [*line.split("|"), "", ""]
        if job.strip() and state.strip():
            out[job.strip()] = Queued(state.strip(), int(restarts) if restarts.strip().isdigit() else 0)
    return out


def parse_sacct(stdout: str) -> dict[str, str]:
    """`sacct -n -P -X -o JobID,State` -> {job id: state} ("CANCELLED by 0" -> CANCELLED)."""
    out = {}
    for line in stdout.splitlines():
        if line.count("|") == 1 and line.split("|")[1].split():
            job_id, state = line.split("|")
            out[job_id] = state.split()[0]
    return out


def ask_slurm(command: list[str]) -> subprocess.CompletedProcess:
    """Run a Slurm client command; QueueError when it cannot be run or does not answer in time."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise QueueError(f"{command[0]} did not answer in {QUERY_TIMEOUT_S} s (is slurmctld up?)") from None
    except OSError as e:
        raise QueueError(f"{command[0]} could not be run ({e.strerror or e})") from None


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else "no message"


def listed(job_ids: list[str]) -> dict[str, Queued]:
    """{job id: Queued} of the given jobs (or arrays) that squeue still lists; {} when none is, or when
    this machine has no squeue. QueueError when squeue fails or times out (the controller is down)."""
    if not job_ids or not shutil.which("squeue"):
        return {}
    q = ask_slurm(["squeue", "-h", "-r", "-O", SQUEUE_FIELDS, "-j", ",".join(sorted(set(job_ids)))])
    if q.returncode != 0:
        if "Invalid job id" in q.stderr:  # all the ids unknown (purged after the jobs ended): none is queued
            return {}
        raise QueueError(f"squeue failed (exit {q.returncode}: {first_line(q.stderr)})")
    return parse_squeue(q.stdout)


def queued(job_ids: list[str]) -> dict[str, str]:
    """{job id: Slurm state} of the given jobs that squeue still lists (`listed`)."""
    return {job: entry.state for job, entry in listed(job_ids).items()}


class QueueWatch:
    """The queue as a waiting loop sees it: a controller that stops answering is said once on stderr (and
    once again when it answers), and waited through; it never reads as "the job has ended"."""

    def __init__(self) -> None:
        self.silent_since: float | None = None

    def ask(self, job_ids: list[str]) -> dict[str, str] | None:
        """queued(job_ids), or None while the queue cannot be read."""
        try:
            listed = queued(job_ids)
        except QueueError as e:
            if self.silent_since is None:
                log.warning(f"hpc: {e}; still waiting")
                self.silent_since = time.monotonic()
            return None
        if self.silent_since is not None:
            log.warning(f"hpc: the queue answers again after {time.monotonic() - self.silent_since:.0f} s")
            self.silent_since = None
        return listed

    def left(self, job_id: str) -> bool:
        """True once squeue no longer lists the job (an array task by its own id, 123_4); False while it
        does, or while the queue cannot be read."""
        listed = self.ask([job_id.split("_")[0]])
        return listed is not None and job_id not in listed


def accounted(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} from sacct where it works (it needs slurmdbd); {} elsewhere."""
    if not job_ids or not shutil.which("sacct"):
        return {}
    try:
        q = ask_slurm(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(sorted(set(job_ids)))])
    except QueueError:
        return {}  # sacct is a bonus where slurmdbd runs; squeue is what decides
    return parse_sacct(q.stdout) if q.returncode == 0 else {}


def ended_as(job_id: str) -> str | None:
    """Slurm's word for how an ended job ended: the controller's (scontrol keeps an ended job for
    MinJobAge, with accounting or without), else the accounting's; None where neither says."""
    if shutil.which("scontrol"):
        try:
            said = ask_slurm(["scontrol", "show", "job", "-o", job_id])
        except QueueError:
            said = None
        found = re.search(r"(?:^|\s)JobState=(\S+)", said.stdout) if said is not None and said.returncode == 0 else None
        if found:
            return found.group(1)
    word = accounted([job_id]).get(job_id)
    return word.split(" ")[0] if word else None
