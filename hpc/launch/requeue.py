"""How a Slurm job's stop is told apart, and the one requeue executor, in one place: the batch shell's
signals while its step runs (`JobSignals`), then, once the step has ended, `requeue_after_step`, which
says how the run ended, decides from the run's records and those signals, and acts with `scontrol
requeue`. Every Slurm job of the toolkit runs it in its batch shell (hpc/launch/batch.py `run_job`:
`python -m hpc.batch` of a hand-written script, and submitit's job, whose script execs python there).

What each stop is (docs/faults.md; ../shared/design/stops.md has what Slurm sends):
- USR2 to the batch shell: the time limit's warning (`--signal=B:USR2@N`), a preemption where the site
  sends the job's signal, or `scancel -b --signal=USR2`. The tasks are told as scripts expect (SIGTERM,
  through `scancel --signal=TERM` of the job's steps), and a run that saved is requeued (max_requeues).
- SIGTERM to the batch shell: Slurm is ending the job (a person's `scancel`, the time limit itself, a
  preemption). Final: never requeued here; a preemption's requeue is Slurm's own (`--requeue`).
- A stop the tasks alone saw (`scancel --signal=TERM`, a person's): the run stops, is not requeued, and
  the job ends non-zero with the line that resumes it.
The job's exit code is 0 only when its run finished, so `afterok` holds. No torch import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping

from hpc.core.ending import SLURM_CANCELLED, SLURM_RUNNING, SLURM_TIMEOUT, RankEnd
from hpc.core.errors import EXIT_OK, EXIT_PREEMPTED, QueueError
from hpc.core.rundir import RunPaths
from hpc.core.stop import Caught
from hpc.core.summary import (
    CodeFor,
    RunRecord,
    record_scheduler,
    requeue_code,
    restarts_line,
    run_exit_code,
    write_run_summary,
)
from hpc.launch.submission.queue import accounted, ask_slurm

log = logging.getLogger(__name__)

WARNING_SIGNAL = signal.SIGUSR2  # the job's own signal, to its batch shell alone: sbatch's --signal=B:USR2@N
TELL_AGAIN_S = 2.0  # a warning the tasks could not be told yet (no step yet, scancel failed) is tried again
PREEMPT_WAIT_S = 600.0  # a preemption's end waited for at most this long (a grace time is seconds to minutes)


class JobSignals:
    """The batch shell's signals while its job runs, the one place a Slurm stop is told apart: USR2
    (`warned`: the time limit's warning, a site's preemption signal, `scancel -b --signal=USR2`) is passed
    on to the tasks as the SIGTERM scripts expect; SIGTERM (`ended`: a person's scancel, the time limit
    itself, a preemption) is final. The handlers only note; `tell_tasks` acts, from the waiting loop."""

    def __init__(self, job: str) -> None:
        self.caught = Caught(WARNING_SIGNAL, signal.SIGTERM)
        self.job = job  # Slurm's id of this job (an array task's own id): what scancel signals
        self.told = False  # the tasks were told of the warning
        self.tried_at = 0.0

    def __enter__(self) -> JobSignals:
        self.caught.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.caught.__exit__()

    @property
    def warned(self) -> bool:
        return WARNING_SIGNAL in self.caught.seen

    @property
    def ended(self) -> bool:
        return signal.SIGTERM in self.caught.seen

    def wait_for_end(self, limit_s: float) -> None:
        """Until Slurm ends the job (SIGTERM to this shell), at most `limit_s`."""
        deadline = time.monotonic() + limit_s
        while not self.ended and time.monotonic() < deadline:
            time.sleep(0.2)

    def tell_tasks(self) -> None:
        """After the warning, SIGTERM to every process of the job's steps (not this shell): what a script
        saves on. Said once; tried again every TELL_AGAIN_S until scancel takes it."""
        if not self.warned or self.told or self.ended or time.monotonic() - self.tried_at < TELL_AGAIN_S:
            return
        if not self.tried_at:
            log.info(f"job {self.job}: Slurm's warning (SIGUSR2): the ranks are told to save and stop (SIGTERM)")
        self.tried_at = time.monotonic()
        try:
            said = ask_slurm(["scancel", "--signal=TERM", self.job])
        except QueueError as e:
            log.warning(f"job {self.job}: the ranks could not be told yet ({e}); trying again")
            return
        self.told = said.returncode == 0


@dataclasses.dataclass(frozen=True)
class StepEnd:
    """How a job's step ended, as its batch shell saw it."""

    job: str  # the job, in its array form where it is one (as the ranks' attempts name it)
    rc: int  # srun's exit code
    warned: bool = False  # the job's warning reached the batch shell (JobSignals)
    ended: bool = False  # Slurm is ending the job: a SIGTERM reached the batch shell


def may_requeue(
    code: int | None, requeue_codes: Iterable[int], warned: bool, env: Mapping[str, str], budget: int
) -> bool:
    """The requeue rule, the one place it is written: a run that ended with one of its task's requeue codes,
    with requeues left (Slurm's restart count below the budget); a saved stop (3) only after the job's
    warning (a stop the tasks alone saw is a person's: final)."""
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    if code not in tuple(requeue_codes) or restarts >= budget:
        return False
    return warned or code != EXIT_PREEMPTED


def restarts_in(scontrol_job: str) -> int | None:
    """Slurm's restart count of a job in `scontrol show job -o`'s line (Restarts=N), None without one."""
    return _count(_field(scontrol_job, "Restarts"))


def _field(scontrol_job: str, name: str) -> str | None:
    found = re.search(rf"(?:^|\s){name}=(\S*)(?:\s|$)", scontrol_job)
    return found.group(1) if found else None


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


ALREADY = "was requeued already since this start (by its task: Lightning requeues its job on SIGUSR1): not again"
CANCELLED = "was cancelled (scancel): a person's stop is not requeued"
ENDING = "is being ended by Slurm (JobState {state}: a person's scancel, or its time limit): not requeued"
PREEMPTING = (
    "is being preempted (Slurm's PreemptTime is set): Slurm ends it after its grace time, and requeues it where the "
    "site says so; waiting for that"
)
ENDED = "was ended by Slurm (scancel, its time limit or a preemption): not requeued"
BY_A_PERSON = "was stopped by a person (scancel --signal: no warning reached its batch shell): not requeued"
UNFINISHED = (
    "ended unfinished: the command exited 0 after the warning; requeued all the same, it resumes only from a "
    "checkpoint of its own (Lightning's last.ckpt), else it starts again from its first step; a script says it "
    "saved by exiting 3 (docs/own-script.md)"
)


def not_to_requeue(job_id: str, env: Mapping[str, str]) -> str | None:
    """Why Slurm's own state forbids requeueing the job now, in words (None: nothing does): it is being
    ended (scontrol's JobState is no longer RUNNING: a person's scancel while the step ended), a person
    cancelled it (Slurm's accounting, where it runs), or it was requeued since this start by someone else
    (its task: Lightning requeues its own job on SIGUSR1; a person): Slurm's restart count above this
    start's. No answer says nothing: the requeue is tried (and Slurm refuses a second one of a job already
    pending)."""
    try:
        said = ask_slurm(["scontrol", "show", "job", "-o", job_id])
    except QueueError:
        said = None
    line = said.stdout if said is not None and said.returncode == 0 else ""
    state = _field(line, "JobState")
    if state is not None and state != SLURM_RUNNING:
        return ENDING.format(state=state)
    if accounted([job_id]).get(job_id) == SLURM_CANCELLED:
        return CANCELLED
    return requeued_since(line, env)


def requeued_since(scontrol_job: str, env: Mapping[str, str]) -> str | None:
    """ALREADY where `scontrol show job -o`'s restart count is above this start's (SLURM_RESTART_COUNT, 0
    when unset); None where it is not, or says none."""
    now = restarts_in(scontrol_job)
    return ALREADY if now is not None and now > int(env.get("SLURM_RESTART_COUNT") or 0) else None


def ending_state(job_id: str, env: Mapping[str, str]) -> str | None:
    """Slurm's word for a job whose batch shell got SIGTERM, while it is torn down (KillWait: seconds): None
    where it was requeued since this start (its task's own requeue: Lightning's; its next start follows);
    TIMEOUT where scontrol says its reason is the time limit; else CANCELLED, a person's scancel. The same
    with and without Slurm's accounting, which is not asked here: it may not answer within KillWait. A
    preemption reads as a cancel too: its requeue, where the site makes one, is Slurm's own, and the next
    start's records replace this one's."""
    try:
        line = ask_slurm(["scontrol", "show", "job", "-o", job_id]).stdout
    except QueueError:
        return SLURM_CANCELLED
    if requeued_since(line, env) is not None:
        return None
    return SLURM_TIMEOUT if _field(line, "Reason") == "TimeLimit" else SLURM_CANCELLED


def unfinished(summary: RunRecord) -> bool:
    """Whether the run's stopped ranks all exited 0 (a script that took the stop without saying it saved)."""
    stopped = [r for r in summary.ranks if r.kind == RankEnd.STOPPED]
    return bool(stopped) and all(r.exit_code == EXIT_OK for r in stopped)


def asked(summary: RunRecord, code: int) -> str:
    """Why the run is requeued, in words: a rank killed after the grace time that followed the warning's
    SIGTERM (it took the stop and hung: Lightning's DDP ranks, docs/faults.md), else the task's own code."""
    for r in summary.ranks:
        if r.kind == RankEnd.KILLED and requeue_code(r) is not None:
            return (
                f"the task took Slurm's stop and did not end in time ({r.message}): it resumes from what it last saved"
            )
    return f"the task asked to be requeued (exit {code})"


def resume_line(paths: RunPaths) -> str:
    """The one command that resumes a stopped Slurm run from its checkpoint, in its run directory."""
    return f"python -m hpc.submit --resume {shlex.quote(str(paths.root))}"


def requeue_after_step(
    paths: RunPaths,
    requeue_codes: tuple[int, ...],
    end: StepEnd,
    env: Mapping[str, str],
    budget: int,
    door: str,
    signals: JobSignals | None = None,
) -> int:
    """The one requeue executor, once the job's step has ended: the run's end in one line (summary.json
    written, every task having ended; Slurm's word first where Slurm is ending the job), then the rule,
    then `scontrol requeue`. `door` begins each line (the command whose log it lands in); `signals`, still
    listening, may say that Slurm began to end the job meanwhile. The job's exit code: 0 only for a run
    that finished (requeued or not, an unfinished run's job ends non-zero: `afterok` waits)."""
    job = end.job
    summary, code, state = settled(paths, end, env, door)
    if code != EXIT_OK and not (end.warned or end.ended) and signals is not None and preempting(job):
        log.info(f"{door}: job {job} {PREEMPTING}")
        signals.wait_for_end(PREEMPT_WAIT_S)
        end = dataclasses.replace(end, ended=signals.ended)
        if end.ended:  # Slurm's word on it now: requeued (its restart count), or ended
            summary, code, state = settled(paths, end, env, door)
    if code == EXIT_OK or (code not in requeue_codes and not end.ended):  # done; a failure: its own line said
        return code
    why_not = not_requeued(summary, code, requeue_codes, end, env, budget, state, signals)
    if why_not is not None:
        level, words = why_not
        resume = "" if words == ALREADY else f"; resume with: {resume_line(paths)}"
        log.log(level, f"{door}: job {job} {words}{resume}")
        return code
    if unfinished(summary):
        log.warning(f"{door}: job {job} {UNFINISHED}")
    log.info(f"{door}: {asked(summary, code)}: requeueing job {job}")
    said = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if said.returncode == 0:
        log.info(f"{door}: job {job} requeued from the batch shell")
        return code
    words = " ".join((said.stdout + said.stderr).split()) or "no message"
    log.warning(
        f"{door}: job {job} could not requeue itself (scontrol: {words}); its checkpoint stays; resume with: "
        f"{resume_line(paths)}"
    )
    return code


def settled(paths: RunPaths, end: StepEnd, env: Mapping[str, str], door: str) -> tuple[RunRecord, int, str | None]:
    """The run's end once its step has ended, in one line (Slurm's word recorded first where Slurm is ending
    the job): its summary, its exit code, and that word (None: none, or a requeue since this start)."""
    state = ending_state(end.job, env) if end.ended else None
    if state is not None:  # before the summary is made of it: a person's scancel reads cancelled
        with contextlib.suppress(OSError):
            record_scheduler(paths, job=end.job, state=state)
    summary = write_run_summary(paths, ended=True) or RunRecord()
    outcome = summary.outcome or "no rank started"
    log.info(f"{door}: {paths.root}: {outcome}" + (f": {summary.failure}" if summary.failure else ""))
    restarted = restarts_line(summary)
    if restarted:
        log.info(f"{door}: {restarted}")
    return summary, run_exit_code(summary.outcome, CodeFor.JOB, summary.ranks, end.rc), state


def preempting(job_id: str) -> bool:
    """Whether Slurm is preempting the job: its PreemptTime set (the grace time, when the tasks alone got SIGTERM)."""
    try:
        said = ask_slurm(["scontrol", "show", "job", "-o", job_id])
    except QueueError:
        return False
    return _field(said.stdout, "PreemptTime") not in (None, "", "None")


def not_requeued(
    summary: RunRecord,
    code: int,
    requeue_codes: tuple[int, ...],
    end: StepEnd,
    env: Mapping[str, str],
    budget: int,
    state: str | None,
    signals: JobSignals | None,
) -> tuple[int, str] | None:
    """Why a stopped run is not requeued (its log level and words), or None: it is. In order: Slurm is
    ending the job (a person's scancel; a requeue since this start); a stop the tasks alone saw (a
    person's); the budget spent; then Slurm's own state (being ended, cancelled, requeued already), asked
    last, and a SIGTERM that came meanwhile."""
    if end.ended:
        return logging.INFO, ALREADY if state is None else ENDED
    if code == EXIT_PREEMPTED and not end.warned:
        return logging.INFO, BY_A_PERSON
    if not may_requeue(code, requeue_codes, end.warned, env, budget):
        restarts = env.get("SLURM_RESTART_COUNT") or 0
        return logging.WARNING, f"stopped after {restarts} requeues (max_requeues {budget})"
    why_not = not_to_requeue(end.job, env)
    if why_not is None and signals is not None and signals.ended:
        why_not = ENDING.format(state="SIGTERM")
    return None if why_not is None else (logging.INFO, why_not)
