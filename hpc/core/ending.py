"""How a rank and a run ended: the one vocabulary (two enums, each word spelled here once), the one rule
from the ranks' ends to the run's outcome, the exit code each outcome gives, and the typed records that
carry them between processes (a rank's exit record, what the scheduler said, the task). Every writer and reader
goes through this module: the per-rank runner, summary.json (hpc/core/summary.py), the job's task
(submitit), the batch shell, `hpc.submit --local` and `--wait`, `hpc.rank --outcome`, `hpc.study status`
and the analysis. Nothing of the project below it but the exit codes and the run directory's records; no torch.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol, TypeVar

import msgspec

from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, SchemaError
from hpc.core.files import JsonObject, layout_said
from hpc.core.rundir import SweepPoint


class Word(str, enum.Enum):
    """An enum whose members are their words, in JSON, in f-strings and compared with a plain string."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RankEnd(Word):
    """How one rank's task ended (its exit record's `kind`)."""

    RUNNING = "running"  # no end recorded yet
    OK = "ok"  # exit 0, and known to have finished
    STOPPED = "stopped"  # saved and stopped (a requeue code; exit 0 after a stop, unfinished): a requeue resumes it
    OOM = "oom"  # CUDA out of memory, recorded with its facts
    FAILED = "failed"  # an error of its own: an exit code or a signal nobody of the toolkit sent
    KILLED = "killed"  # still running `stop_grace_s` after a stop: SIGKILLed
    INTERRUPTED = "interrupted"  # ended by a stop without saying it saved
    PEER = "peer"  # stopped because another rank failed
    LOST = "lost"  # its runner died without recording the end, though the job's step ended (summary.json only)


class Outcome(Word):
    """How a run ended (summary.json's `outcome`)."""

    DONE = "done"  # every rank ended ok
    FAILED = "failed"  # a rank failed (the first to end failed or out of memory says which)
    OOM = "oom"  # the first rank to end bad ran out of CUDA memory
    STOPPED = "stopped"  # ranks saved and stopped: a requeue, or the same command again, resumes
    PREEMPTED = "preempted"  # stopped without saying it saved, killed after the grace time, or lost
    CANCELLED = "cancelled"  # a person's stop: scancel, as the scheduler said, or a local run's unsaved Ctrl-C
    RUNNING = "running"  # not every rank has ended


class PointState(Word):
    """Where a sweep's point (or a run the analysis reads) stands where no Outcome says it: the queue's
    words, Slurm's time limit, and what nothing settles. A point's state is one of these or an Outcome
    (POINT_STATES)."""

    PENDING = "pending"  # the queue holds it, not started
    REQUEUED = "requeued"  # the queue holds it again: it ran before
    TIMEOUT = "timeout"  # Slurm ended it at its time limit
    MISSING = "missing"  # never ran: no run directory, not queued
    UNKNOWN = "unknown"  # the queue could not be read and its files alone cannot tell; or a record not ours
    UNFINISHED = "unfinished"  # the analysis: traces, and no record of how the run ended


# hpc.study status's states, in the order its count line gives them
POINT_STATES: tuple[PointState | Outcome, ...] = (
    PointState.PENDING,
    Outcome.RUNNING,
    PointState.REQUEUED,
    Outcome.DONE,
    Outcome.OOM,
    Outcome.FAILED,
    PointState.TIMEOUT,
    Outcome.STOPPED,
    Outcome.PREEMPTED,
    Outcome.CANCELLED,
    PointState.MISSING,
    PointState.UNKNOWN,
)

# Slurm's job states (squeue's %T, sacct's State: one list, slurm.conf's JOB_STATE words) -> ours. A person's
# scancel, the time limit and a running job are also read by name (SLURM_CANCELLED, SLURM_TIMEOUT, SLURM_RUNNING:
# sacct, scontrol during a job's teardown; scheduler.json's `state`).
SLURM_CANCELLED = "CANCELLED"
SLURM_TIMEOUT = "TIMEOUT"
SLURM_RUNNING = "RUNNING"
SLURM_STATES: dict[str, PointState | Outcome] = {
    "PENDING": PointState.PENDING,
    "CONFIGURING": PointState.PENDING,
    "SUSPENDED": PointState.PENDING,
    "RESV_DEL_HOLD": PointState.PENDING,
    "REQUEUED": PointState.REQUEUED,
    "REQUEUE_HOLD": PointState.REQUEUED,
    "REQUEUE_FED": PointState.REQUEUED,
    "SPECIAL_EXIT": PointState.REQUEUED,  # requeued held after its special exit code
    SLURM_RUNNING: Outcome.RUNNING,
    "COMPLETING": Outcome.RUNNING,
    "SIGNALING": Outcome.RUNNING,
    "STAGE_OUT": Outcome.RUNNING,
    "RESIZING": Outcome.RUNNING,
    "STOPPED": Outcome.RUNNING,  # its tasks SIGSTOPped (scancel --signal=STOP): it still holds its nodes
    "COMPLETED": Outcome.DONE,
    "FAILED": Outcome.FAILED,
    "OUT_OF_MEMORY": Outcome.FAILED,
    "NODE_FAIL": Outcome.FAILED,
    "BOOT_FAIL": Outcome.FAILED,
    SLURM_TIMEOUT: PointState.TIMEOUT,
    "DEADLINE": PointState.TIMEOUT,
    "PREEMPTED": Outcome.PREEMPTED,
    SLURM_CANCELLED: Outcome.CANCELLED,
    "REVOKED": Outcome.CANCELLED,  # a federation's sibling job withdrawn
}


def slurm_state(word: str | None) -> PointState | Outcome:
    """A Slurm job state (squeue's, sacct's: "CANCELLED by 0" is sacct's CANCELLED) in our words; UNKNOWN for
    one not in Slurm's list (a newer Slurm's)."""
    if not word:
        return PointState.UNKNOWN
    words = word.split()
    return SLURM_STATES.get(words[0], PointState.UNKNOWN) if words else PointState.UNKNOWN


# How a run's end is a command's exit code, the same from `hpc.submit --local`, `--wait` on Slurm and
# `hpc.rank --outcome` (docs/faults.md; read only by hpc/core/summary.py run_exit_code, the one decider):
# a sweep's point that did not fit (oom) is its result, not a failure; a run that has not ended when its
# job did is not known to be anything.
EXIT_CODES: dict[Outcome, int] = {
    Outcome.DONE: EXIT_OK,
    Outcome.OOM: EXIT_OK,
    Outcome.FAILED: EXIT_FAILED,
    Outcome.STOPPED: EXIT_PREEMPTED,
    Outcome.PREEMPTED: EXIT_PREEMPTED,
    Outcome.CANCELLED: EXIT_PREEMPTED,
    Outcome.RUNNING: EXIT_FAILED,
}
# What a run that ended so leaves to resume from: its checkpoint (hpc.train; hpc.study status)
RESUMABLE = frozenset({Outcome.STOPPED, Outcome.PREEMPTED, Outcome.CANCELLED, Outcome.RUNNING})
# A rank that ended so was stopped from outside, without its own checkpoint said: the run was preempted
_STOPPED_FROM_OUTSIDE = frozenset({RankEnd.KILLED, RankEnd.INTERRUPTED, RankEnd.PEER, RankEnd.LOST})


def rank_end(word: object) -> RankEnd | None:
    """A record's kind as a RankEnd (None: not one)."""
    try:
        return RankEnd(word)
    except ValueError:
        return None


def outcome(word: object) -> Outcome | None:
    """A summary's outcome as an Outcome (None: not one)."""
    try:
        return Outcome(word)
    except ValueError:
        return None


class Ending(Protocol):
    """A rank's end as the rule reads it: an exit record (RankExit) or summary.json's entry (RankEntry)."""

    @property
    def rank(self) -> int: ...
    @property
    def kind(self) -> RankEnd: ...
    @property
    def ended_ns(self) -> int | None: ...


E = TypeVar("E", bound=Ending)


def first_bad(ranks: Iterable[E]) -> E | None:
    """The first rank to end failed or out of memory (an OOM first at the same moment), or None."""
    bad = [r for r in ranks if r.kind in (RankEnd.FAILED, RankEnd.OOM)]
    return min(bad, key=lambda r: (r.ended_ns or 0, r.kind != RankEnd.OOM, r.rank)) if bad else None


def run_outcome(ranks: Iterable[Ending], world_size: int, cancelled: bool = False) -> Outcome:
    """The one rule from the ranks' ends (each with its rank, kind and ended_ns) to the run's outcome:
    done if every rank of the world ended ok; else a person's cancel, where the scheduler said so; else the
    first rank to end bad says failed or oom (a script's peers fail after its OOM); else preempted if a
    rank was stopped from outside; stopped if one saved and stopped; else running."""
    ranks = list(ranks)
    kinds = {r.kind for r in ranks}
    if len(ranks) == world_size and kinds == {RankEnd.OK}:
        return Outcome.DONE
    if cancelled:  # the scheduler's word: its ranks saw only a SIGTERM, as in a preemption
        return Outcome.CANCELLED
    first = first_bad(ranks)
    if first is not None:
        return Outcome.FAILED if first.kind == RankEnd.FAILED else Outcome.OOM
    if kinds & _STOPPED_FROM_OUTSIDE:
        return Outcome.PREEMPTED
    return Outcome.STOPPED if RankEnd.STOPPED in kinds else Outcome.RUNNING


# What a job's task hands submitit as its result, from how its rank (or its node's torchrun) ended
# The layouts of the records between processes (each refused by its reader in one line when of another: a later
# toolkit's file; one written before its field was added is of the first)
RANK_EXIT_SCHEMA = 1  # rank{R}.exit.json
SCHEDULER_SCHEMA = 1  # scheduler.json
TASK_SCHEMA = 1  # task.json (RankCommand)


class Versioned(Protocol):
    """A record that says its layout (read-only: frozen records qualify)."""

    @property
    def schema(self) -> int: ...


V = TypeVar("V", bound=Versioned)


def decode_versioned(data: bytes, kind: type[V], reads: int) -> V:
    """A record of `kind` from its file's bytes, strictly (msgspec.ValidationError or DecodeError: not that
    shape; SchemaError, in one line, of a layout other than `reads`: its reader, who knows the file, names
    it)."""
    record = msgspec.json.decode(data, type=kind)
    if record.schema != reads:
        raise SchemaError(layout_said(record.schema, reads))
    return record


class RankExit(msgspec.Struct, kw_only=True):
    """A rank's exit record (RUN/ranks/rank{R}.exit.json), written by its runner (hpc/launch/rank/runner.py)
    from its start (kind running) to its end, read by summary.json's writer. Decoded strictly: a record
    that is not this shape is no record (a cut or planted file is ignored, said by the reader)."""

    rank: int
    kind: RankEnd
    attempt: str
    group: str | None = None
    world_size: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    node: str | None = None
    launcher: str | None = None
    logs: dict[str, str] = msgspec.field(default_factory=dict)
    command: list[str] | None = None
    started_ns: int | None = None
    pid: int | None = None
    ended_ns: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    stderr_tail: list[str] = msgspec.field(default_factory=list)
    signals_passed_on: list[str] | None = None
    steps_seen: int | None = None  # a command's optimizer steps, counted by its runner from the hook's beats
    stop: str | None = None  # why its runner stopped the task (a signal's name, "rank R failed")
    hung: bool | None = None
    orphaned: bool | None = None  # its submitter (hpc.submit --local) died: never requeued
    leftovers_killed: bool | None = None
    schema: int = RANK_EXIT_SCHEMA

    def as_dict(self) -> JsonObject:
        """The record as summary.json holds it (unset optional flags left out; the schema is summary.json's)."""
        flags = ("signals_passed_on", "steps_seen", "stop", "hung", "orphaned", "leftovers_killed", "pid")
        return {k: v for k, v in msgspec.to_builtins(self).items() if not (k in flags and v is None) and k != "schema"}


def decode_exit(data: bytes) -> RankExit:
    """An exit record from its file's bytes (decode_versioned)."""
    return decode_versioned(data, RankExit, RANK_EXIT_SCHEMA)


def encode_exit(record: RankExit) -> bytes:
    return msgspec.json.format(msgspec.json.encode(record), indent=1)  # pragma: no mutate (for eyes; any indent parses)


class SchedulerSaid(msgspec.Struct, kw_only=True):
    """What the scheduler (or the one who waited for the job) said of a start of the run, recorded in
    RUN/ranks/scheduler.json so that summary.json stays a function of the run directory's files:
    `state` Slurm's word for the job (CANCELLED: a person's scancel; also a local run whose ranks a Ctrl-C
    ended unsaved, recorded by its follower), `ended` the attempt whose every task has ended (its step, its
    job: a rank of it still `running` then is lost)."""

    job: str | None = None
    state: str | None = None
    ended: str | None = None
    schema: int = SCHEDULER_SCHEMA


def decode_scheduler(data: bytes) -> SchedulerSaid:
    """scheduler.json from its bytes (decode_versioned)."""
    return decode_versioned(data, SchedulerSaid, SCHEDULER_SCHEMA)


class RankCommand(msgspec.Struct, frozen=True):
    """task.json, its one layout: what every rank of a run runs, as data (the way TorchX's `Role` describes
    one). Built by hpc/settings/rankcommand.py, written where the job starts (the per-rank runner's
    `write_task`), read by the runner and by summary.json's writer. `words` are templates ({run_dir},
    {python}: hpc/settings/rankcommand.py `words_for` fills them);
    `requeue_codes` the exit codes that mean "requeue me"; `profiler` the start-up hook's section (None:
    no hook); `point` the sweep point it runs; `config` the toolkit's training's run config."""

    words: tuple[str, ...]
    cwd: str
    name: str  # the job's name when none is given, and the runs directory's folder
    env: dict[str, str] = msgspec.field(default_factory=dict)  # templates too
    requeue_codes: tuple[int, ...] = (EXIT_PREEMPTED,)
    profiler: JsonObject | None = None  # ProfilerConfig's fields
    stop_grace_s: int = 60
    # no step for this long: the runner names the rank hung (hpc/launch/rank/hang.py); None: its learned bounds
    hang_timeout_s: int | None = None
    point: SweepPoint | None = None
    config: JsonObject | None = None  # RUN/submitted.yaml
    metrics: str | None = None  # command.metrics, its point's values filled; {run_dir} when the rank starts
    schema: int = TASK_SCHEMA

    @property
    def is_training(self) -> bool:
        return self.config is not None


def decode_task(data: bytes) -> RankCommand:
    """task.json's bytes (decode_versioned)."""
    return decode_versioned(data, RankCommand, TASK_SCHEMA)


def encode_task(task: RankCommand) -> bytes:
    return msgspec.json.format(msgspec.json.encode(task), indent=1)  # pragma: no mutate (for eyes; any indent parses)
