"""Following jobs once submitted: waiting for them, echoing a local run's output, reporting how each ended,
and stopping a local run cleanly.

A local run (`hpc.submit --local`, `hpc.study run --local`) stops on Ctrl-C or SIGTERM (`timeout`, a
closed terminal's parent): every rank's runner gets SIGINT and tells its task (SIGTERM), which finishes
its step, writes its checkpoint and exits; the command then prints one line saying where the checkpoint
is and the command that resumes it, and exits 3 (EXIT_PREEMPTED). submitit's local controller must not
see Ctrl-C itself (it would kill the ranks a second later, mid-checkpoint), so it is started with SIGINT
ignored (hpc/launch/submission/submit.py), which it and its tasks inherit; the runner installs its own handler. A
second Ctrl-C kills every process of the run at once. Without --local, Ctrl-C only stops the waiting:
the jobs run on in Slurm. No torch import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from analysis.api import end_of_run_lines, render, run_numbers
from hpc.core.ending import RESUMABLE, SLURM_CANCELLED, Outcome
from hpc.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED
from hpc.core.rundir import RunPaths, SweepPoint, drop_unexpanded, read_checkpoint_info
from hpc.core.stop import Caught
from hpc.core.summary import (
    CodeFor,
    RunRecord,
    no_step_line,
    read_records,
    record_scheduler,
    restarts_line,
    run_exit_code,
    write_run_summary,
)
from hpc.launch.requeue import resume_line
from hpc.launch.submission.queue import QueueWatch, ended_as
from hpc.launch.submission.site import Charge

log = logging.getLogger(__name__)

RESEND_S = 2.0  # a rank still setting up ignores SIGINT (inherited); it is told again until it listens


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) recorded (not raised) while a command follows its jobs."""

    def __init__(self) -> None:
        self.caught = Caught(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        self.sent_at = 0.0  # when the ranks were last told to stop (monotonic)

    def __enter__(self) -> Interrupts:
        self.caught.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.caught.__exit__()

    @property
    def signum(self) -> int | None:
        """The last one caught."""
        return self.caught.seen[-1] if self.caught.seen else None

    @property
    def count(self) -> int:
        return len(self.caught.seen)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "-"


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux's /proc children lists), depth first."""
    found = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    for child in map(int, children):
        found += [child, *descendants(child)]
    return found


def _same_group(pid: int, other: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgid(other)
    except OSError:
        return False


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_here(pending: list[Submitted], interrupts: Interrupts) -> None:
    """After an interrupt: the same stop (SIGINT, or SIGTERM) to the local jobs' ranks, the runners in
    their controller's process group (again every RESEND_S, for ranks still starting), each of which tells
    its task (hpc/launch/rank/runner.py: the task runs in a session of its own); after a second one,
    SIGKILL to every process below the controllers, and to them."""
    if interrupts.signum is None or not pending:
        return
    # a local job's id is its controller's pid (submitit's LocalExecutor names it so)
    controllers = [int(sub.job.job_id) for sub in pending if sub.job.job_id.isdigit()]
    below = [pid for controller in controllers for pid in descendants(controller)]
    if interrupts.count >= 2:
        _signal_all(below + controllers, signal.SIGKILL)
        return
    if time.monotonic() - interrupts.sent_at >= RESEND_S:
        if not interrupts.sent_at:
            training = all(sub.training for sub in pending)  # the toolkit's training stops at a step's end
            what = "stops its task at a step's end" if training else "passes the stop on to its task (SIGTERM)"
            log.info(f"hpc: {interrupts.name}: every rank {what} (again to kill them)")
        runners = [pid for c in controllers for pid in descendants(c) if _same_group(pid, c)]
        # the signal that came (a closed terminal's SIGHUP as a SIGTERM): the ranks' records name it truly
        _signal_all(runners, signal.SIGINT if interrupts.signum == signal.SIGINT else signal.SIGTERM)
        interrupts.sent_at = time.monotonic()


def resume_command(run_dir: Path, ranks: int) -> str:
    """What resumes a run here: its task again (hpc.rank on its task.json), under torchrun for several ranks."""
    again = f"-m hpc.rank --run-dir {shlex.quote(str(run_dir))}"
    if ranks == 1:
        return f"python {again}"
    return f"python -m torch.distributed.run --standalone --nproc-per-node {ranks} {again}"


def said_stopped(subs: list[Submitted], interrupts: Interrupts) -> int:
    """One line per stopped local run: what it kept and what resumes it. EXIT_PREEMPTED."""
    for sub in subs:
        paths, resume = sub.paths, resume_command(sub.run_dir, sub.ranks)
        info = read_checkpoint_info(paths)
        if info is not None:
            log.warning(
                f"hpc: stopped ({interrupts.name}): {sub.run_dir} holds a checkpoint at step {info.step} of "
                f"{info.stop_at}; resume with: {resume}"
            )
        elif sub.training:
            log.warning(
                f"hpc: stopped ({interrupts.name}) before a checkpoint of {sub.run_dir}: nothing to resume; "
                "run the same command again to start afresh"
            )
        else:
            log.warning(  # how a script resumes is its own: say both ways, never promise one
                f"hpc: stopped ({interrupts.name}): the command was told to stop (SIGTERM); one that loads its own "
                f"checkpoint when it starts resumes here in {sub.run_dir} with: {resume}; one that resumes only "
                "with a flag of its own (--resume PATH) would start afresh that way: submit it again with its flag"
            )
    return EXIT_PREEMPTED


class Submitted(msgspec.Struct, frozen=True):
    """A job as submitted, from hpc.submit to its follower (a typed record, built where it is submitted)."""

    job_id: str
    run_dir: Path
    logs: tuple[Path, Path]  # stdout, stderr of task 0
    job: Any  # submitit's Job
    point: SweepPoint | None = None
    charge: Charge | None = None  # what the point is charged (index.json)
    ranks: int = 1  # the run's world size (for the command that resumes it)
    training: bool = False  # the toolkit's training, which says where its checkpoint is

    @property
    def paths(self) -> RunPaths:
        """Its run directory's places."""
        return RunPaths(self.run_dir)

    def ended(self, watch: QueueWatch | None) -> bool:
        """Whether the job has ended: submitit's done() here; on Slurm once squeue no longer lists it (see
        hpc/launch/submission/queue.py: without slurmdbd submitit's own done() waits forever on a killed job).
        Not its result file: a start that returned after its task requeued the job (Lightning's own requeue
        on SIGUSR1) writes one while the job waits to run again."""
        if watch is None or not _is_slurm_job(self.job):
            return bool(self.job.done())
        return watch.left(self.job_id)


def _is_slurm_job(job: Any) -> bool:
    from submitit.slurm.slurm import SlurmJob

    return isinstance(job, SlurmJob)


RUN_NUMBERS = [
    "rank",
    "steps",
    "cpu_time_us",
    "cuda_time_us",
    "kernel_calls",
    "peak_gpu_mem_bytes",
    "peak_cpu_mem_bytes",
]


def print_run_numbers(run_dir: Path) -> None:
    """The run's numbers from its own traces, per rank: what a local run ends with (no torch import)."""
    traces, run = run_numbers(run_dir)
    if traces:
        print(f"profiled steps, per rank (python -m analysis {run_dir} for more):")
        print(render(sorted(traces, key=lambda r: (r.rank is None, r.rank or 0)), RUN_NUMBERS, "table"), end="")
    if run is not None:
        for line in end_of_run_lines(run):
            print(line)


class _LogFollower:
    """Echoes what the jobs' rank 0 writes to stdout and stderr (RUN/logs/rank0.out, .err), as it comes
    (local runs)."""

    def __init__(self, subs: list[Submitted]):
        self.subs = subs
        self.offsets: dict[Path, int] = {}

    def echo(self) -> None:
        for sub in self.subs:
            for stream in ("out", "err"):
                self.copy(sub.paths.rank_stream(0, stream))

    def copy(self, log: Path) -> None:
        if not log.exists():
            return
        with open(log, errors="replace") as f:
            f.seek(self.offsets.get(log, 0))
            text = f.read()
            self.offsets[log] = f.tell()
        sys.stdout.write(text)
        sys.stdout.flush()


def wait_for(subs: list[Submitted], poll_s: float = 2.0, follow: bool = False, echo: bool = False) -> int:
    """Wait until every job has ended; report each: how its run ended, or FAILED with its log. With follow
    (local runs), rank 0's output is echoed as it comes, and Ctrl-C or SIGTERM stops the run (see
    stop_here); with echo (one job waited for on Slurm) rank 0's output is echoed alike. Returns 1 when a
    job failed, EXIT_PREEMPTED when a local run was stopped, else 0."""
    pending = list(subs)
    follower = _LogFollower(subs)
    watch = QueueWatch() if any(_is_slurm_job(sub.job) for sub in subs) else None
    with Interrupts() as interrupts:
        while pending:
            pending = [sub for sub in pending if not sub.ended(watch)]
            if follow or echo:
                follower.echo()
            if follow:
                stop_here(pending, interrupts)
            elif interrupts.signum is not None:
                ids = " ".join(sub.job_id for sub in pending)
                log.warning(
                    f"hpc: stopped waiting ({interrupts.name}); still on Slurm: squeue -j {ids}; scancel {ids} ends "
                    "them"
                )
                return EXIT_INTERRUPTED
            if pending:
                time.sleep(0.5 if follow else poll_s)
    if echo:
        follower.echo()  # the last lines, written as the job ended
    for sub in subs:  # submitit leaves the unexpanded '%j' folder behind, empty, once a job has ended
        drop_unexpanded(sub.run_dir)
    if follow and interrupts.signum is not None:
        for sub in subs:  # every task has ended, killed by a second stop or not: a rank still `running` is lost
            paths = sub.paths
            with contextlib.suppress(OSError):
                summary = write_run_summary(paths, ended=True)
                if summary is not None and summary.outcome == Outcome.PREEMPTED:
                    # ranks killed or lost, not saved: by this run's own person (Ctrl-C, a local SIGTERM), whom
                    # the record names as Slurm names a person's scancel, not by a scheduler's preemption
                    record_scheduler(paths, job=sub.job_id, state=SLURM_CANCELLED)
                    write_run_summary(paths, ended=True)
        return said_stopped(subs, interrupts)
    return exit_code_of_outcomes([print_result(sub, poll_s, follow) for sub in subs])


def exit_code_of_outcomes(outcomes: list[Outcome]) -> int:
    """hpc.submit's exit code, the same here (--local) and waited for on Slurm (--wait): the worst of the
    runs' (hpc/core/summary.py run_exit_code, docs/faults.md): 1 when a run failed (or left no record), else 3
    when one was stopped, preempted or cancelled, else 0."""
    codes = {run_exit_code(Outcome(outcome), CodeFor.COMMAND) for outcome in outcomes}
    return EXIT_FAILED if EXIT_FAILED in codes else max(codes, default=EXIT_OK)


def print_result(sub: Submitted, poll_s: float, follow: bool) -> Outcome:
    """How an ended job's run ended, from its ranks' records: done (with its numbers, followed here), or
    the first failing rank named with its code and last stderr line, and where everything is; a job that
    left no record failed outside its task (its log named). On Slurm a person's cancel (Slurm's CANCELLED)
    is recorded as such, also where the job's batch shell could not (cancelled before it started).
    Returns the outcome ("failed" for no record)."""
    paths = sub.paths
    cancel = _is_slurm_job(sub.job) and ended_as(sub.job_id) == SLURM_CANCELLED
    if cancel and paths.ranks.is_dir():
        with contextlib.suppress(OSError):
            record_scheduler(paths, job=sub.job_id, state=SLURM_CANCELLED)
    summary = write_run_summary(paths, ended=True) if read_records(paths) else None  # the job has ended
    if summary is None and cancel:
        print(f"job {sub.job_id}: cancelled before its task started", file=sys.stderr)
        return Outcome.CANCELLED
    if summary is None:
        print_job_failure(sub, poll_s)
        return Outcome.FAILED
    ended = print_ended(f"job {sub.job_id}", paths, summary, numbers=follow)
    if ended in RESUMABLE and _is_slurm_job(sub.job):
        print(f"job {sub.job_id}: resume with: {resume_line(paths)}", file=sys.stderr)
    return ended


def print_ended(label: str, paths: RunPaths, summary: RunRecord, numbers: bool) -> Outcome:
    """How a run ended, from its summary: done (with its numbers where the run was followed here), or the
    first failing rank named with its code and last stderr line; then where everything is."""
    outcome = summary.outcome or Outcome.FAILED
    if outcome == Outcome.DONE and numbers:
        print_run_numbers(paths.root)
    restarted = restarts_line(summary)
    if restarted:
        print(f"{label}: {restarted}", file=sys.stderr)
    no_step = no_step_line(summary)
    if no_step:
        print(f"{label}: {no_step}", file=sys.stderr)
    if summary.failure:
        print(f"{label}: FAILED: {summary.failure}", file=sys.stderr)
    elif outcome != Outcome.DONE:
        said = "; ".join(sorted({r.message for r in summary.ranks if r.message}))
        print(f"{label}: {outcome}" + (f" ({said})" if said else ""), file=sys.stderr)
    print(
        f"{label}: {outcome}\n  run:     {paths.root}\n  logs:    {paths.rank_stream(0, 'out').parent}"
        f"\n  traces:  {paths.traces}\n  summary: {paths.summary}"
    )
    return outcome


def print_job_failure(sub: Submitted, poll_s: float) -> None:
    """A job whose task never recorded a start: what submitit says of it (its exception), in one line."""
    try:
        if not sub.job.paths.result_pickle.exists():
            time.sleep(poll_s)  # a result written as the job left the queue
        if not sub.job.paths.result_pickle.exists():
            raise RuntimeError("no result: the job was killed or failed outside Python")
        sub.job.results()  # re-raises the job's own exception, whatever it is
        raise RuntimeError("the job ended without running its task")
    except Exception as e:
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        print(
            f"job {sub.job_id}: FAILED ({lines[-1] if lines else type(e).__name__}); see {sub.logs[0]}", file=sys.stderr
        )
