"""summary.json, the run's record, and its one writer: made from the run directory's own records, whatever
task the ranks ran (the toolkit's training or a user's command).

Every rank leaves two records in RUN/ranks/:
- rank{R}.exit.json: how its process ended, written by the per-rank runner (hpc/launch/rank/runner.py): a
  typed RankExit (hpc/core/ending.py: its kind, `lost` in summary.json once the job's step ended with the
  rank still running; exit code or signal, host, pid, logs);
- rank{R}.facts.json: what it measured, written by the task itself: the toolkit's training
  (hpc/training/summary.py: steps, step times, throughput, memory, the profiler's cycles), or the
  start-up hook in a user's script (hpc/training/hook/autoprofile.py). A CUDA out-of-memory error adds `oom`.

Each node's GPUs, sampled by NVML (RUN/gpus/, hpc/core/gpusample.py), are summed up in `gpus`.

What the scheduler said of a start (a person's cancel; that its every task has ended) is in
RUN/ranks/scheduler.json (ending.SchedulerSaid), so summary.json is a function of the run directory's
files alone: deleting it and writing it again gives the same file, and a reader finds it rebuilt where a
record is newer than it (`current_summary`). The outcome and its words: hpc/core/ending.py.

Each record between processes is decoded into its struct when read (exit records: RankExit; facts: RankFacts;
scheduler.json: SchedulerSaid; task.json: RankCommand; summary.json: RunRecord of
RankEntry records) and says its
layout (`schema`): one of another layout (a later toolkit's) is refused in one line (SchemaError), one
without the field is of the first.

An earlier attempt's exit records (a worker group torchrun restarted, a requeued job's last start) are
moved to RUN/ranks/earlier/ as the next attempt starts: summary.json's `earlier` says how each ended.

`write_run_summary` makes summary.json of them, under a lock (the runner's rank 0 once every rank has
ended, a failing rank at once, the training's rank 0 at its end, whoever saw the job end: `--wait`,
`--local`, the batch shell). A rank
whose runner has not yet recorded its end but whose task recorded its exit code is judged by that
code; a run started without a runner (`python -m hpc.train`) has facts alone. The root cause of a
failure is torchelastic's rule taken across every node: among the latest attempt's ranks that failed
on their own (kind `failed`: an exit code or a signal nobody sent them), the one that ended first
(nanosecond clocks; same instant: the lower rank). No torch; nothing else of the project but core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import json
import logging
import os
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from hpc.core.ending import (
    EXIT_CODES,
    RESUMABLE,
    SLURM_CANCELLED,
    Outcome,
    RankCommand,
    RankEnd,
    RankExit,
    SchedulerSaid,
    decode_exit,
    decode_scheduler,
    decode_task,
    decode_versioned,
    first_bad,
    run_outcome,
)
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_OOM, EXIT_PREEMPTED, SchemaError
from hpc.core.files import (
    JsonObject,
    Warn,
    decoded,
    ignore,
    load_yaml_text,
    other_layout,
    read_json,
    temp_name,
    with_value,
    write_atomic,
)
from hpc.core.gpusample import GpuSummary
from hpc.core.gpusample import summarize as summarize_gpus
from hpc.core.owner import open_append
from hpc.core.rundir import Count, RunPaths, SweepPoint, is_count, read_checkpoint_info

log = logging.getLogger(__name__)

TAIL_BYTES = 8192
# A Python exception's last line, as a traceback ends (torch's launchers prefix `[rankN]: `).
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


# A rank whose runner never recorded its end though the job's step ended: what its record says.
LOST = (
    "its runner ended without recording how its task ended (killed: a SIGKILL, the kernel's OOM killer, a "
    "lost node); its task died with it"
)
EARLIER_KEPT = 20  # earlier attempts in summary.json (their records all stay on disk)
ATTEMPT_VARIABLE = "HPC_ATTEMPT"  # the runner's attempt, handed to its task (which has no SUBMITIT_* variables)


# ----------------------------------------------------------------------------------------------
# The records: what a rank's task measured (RUN/ranks/rank{R}.facts.json), written by the task (the
# toolkit's training, hpc/training/summary.py; a script's start-up hook, hpc/training/hook/autoprofile.py;
# the one OOM recorder, hpc/training/oom.py) and decoded into RankFacts when read (read_facts); summary.json's
# `ranks` are RankEntry records: the facts under the rank's exit record, with `complete`. Every field but `rank`
# is optional: each task writes what it knows (a script's hook knows no batch size) and a reader finds None
# where a task did not say. The nested records a profiler cycle or a config carry stay mappings of JSON
# values (JsonObject): their keys are torch's and the config's, read where they are used.
# ----------------------------------------------------------------------------------------------

Rank = Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]  # as rundir.is_count reads a rank
FACTS_SCHEMA = 1  # rank{R}.facts.json's layout (its `schema`; one without the field is of the first)


class StepStats(msgspec.Struct, kw_only=True):
    """Step times in seconds (hpc/training/steptimes.py step_time_stats): how many, their mean, median,
    90th percentile and extremes (None where none was timed)."""

    n: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    min: float | None = None
    max: float | None = None


class OwnSeries(msgspec.Struct, kw_only=True):
    """The last steps' own work in ms, each in its place from `first_step` (None: not measured), and the
    time the rank waited for a core in the same spans where measured (steptimes.own_work_series)."""

    first_step: int = 0
    ms: list[float | None] = msgspec.field(default_factory=list)
    queued_ms: list[float | None] | None = None


class StartupRecord(msgspec.Struct, kw_only=True):
    """Where a rank's start-up went (steptimes.startup_record): Unix times and spans, and each phase's
    Unix time (None where not seen)."""

    process_start_unix: float | None = None
    group_join_start_unix: float | None = None
    group_join_s: float | None = None
    first_step_end_unix: float | None = None
    to_first_step_s: float | None = None
    phases: dict[str, float | None] = msgspec.field(default_factory=dict)


class TraceFailure(msgspec.Struct, kw_only=True):
    """A trace the profiler could not write: its file, why, and the step."""

    file: str | None = None
    error: str | None = None
    step: int | None = None


class ProfilerFacts(msgspec.Struct, kw_only=True):
    """What a rank's profiler did: each finished cycle's totals (torch's key averages, window peaks: keys
    of torch's), the trace files it wrote, those it could not, and a script's note on why none."""

    cycles: list[JsonObject] = msgspec.field(default_factory=list)
    traces: list[str] = msgspec.field(default_factory=list)
    failed: list[TraceFailure] = msgspec.field(default_factory=list)
    note: str | None = None


class CollectivesInSteps(msgspec.Struct, kw_only=True):
    """A script's step intervals, and how many of them held a collective (the hook's `collectives_in_steps`)."""

    intervals: int
    with_collectives: int


class OomRecord(msgspec.Struct, kw_only=True):
    """A CUDA out-of-memory error as its rank recorded it (hpc/training/oom.py oom_record, the training's and
    a script's one recorder; in the rank's facts, and summary.json's `oom`): the allocator's first line, the
    allocation it names, the device's memory (None off a GPU), the batch where known, the step it came in,
    and the allocator's history dumped beside the run (`snapshot`, a file name) when asked."""

    rank: int
    message: str
    batch_size_per_gpu: int | None = None
    global_batch_size: int | None = None
    requested_bytes: int | None = None
    memory_fraction: float | None = None  # train.cuda_memory_fraction
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    limit_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    step: int | None = None
    snapshot: str | None = None


class RankFacts(msgspec.Struct, kw_only=True):
    """A rank's facts file: who and where it is, what it ran, and what it measured (the training's and a
    script's from the same clock: steptimes.RANK_MEASURES)."""

    rank: Rank
    world_size: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    node: str | None = None  # as Slurm names it
    launcher: str | None = None
    attempt: str | None = None  # which start of the job measured this
    pid: int | None = None
    master_addr: str | None = None
    device: str | None = None
    device_name: str | None = None
    torch: str | None = None
    backend: str | None = None
    # the toolkit's training: its model, batch and data, and how its steps ran
    arch: str | None = None
    stem: str | None = None
    batch_size_per_gpu: int | None = None
    global_batch_size: int | None = None
    data_fraction: float | None = None
    data_source: str | None = None
    step_mode: Literal["graph", "eager"] | None = None
    graph_check: str | None = None  # "passed", or what failed where
    graph_check_detail: JsonObject | None = None
    graph_replays: int | None = None
    ddp: bool | None = None
    train_images: int | None = None
    steps_per_epoch: int | None = None
    model_flops_per_image: float | None = None
    affinity: JsonObject | None = None
    slurm: dict[str, str | None] | None = None
    nccl_network: str | None = None
    epochs_completed: int | None = None
    weights_sha256: str | None = None
    env: dict[str, str] | None = None
    config: JsonObject | None = None
    # where it stopped, and how its task exited
    steps: int | None = None
    exit_code: int | None = None
    complete: bool | None = None
    recovered: bool | None = None  # a rerun that only wrote a finished run's missing summary
    # what it measured (steptimes.measures)
    step_time_s: StepStats | None = None
    own_step_time_s: StepStats | None = None
    own_step_series: OwnSeries | None = None
    startup: StartupRecord | None = None
    step_time_after_profiler_s: StepStats | None = None
    wall_time_s: float | None = None
    cuda_max_memory_allocated_bytes: int | None = None
    cuda_max_memory_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    images_per_s: float | None = None
    global_images_per_s: float | None = None
    profiler: ProfilerFacts | None = None
    # a script's: whether it made a process group, its collectives, Accelerate's settings
    process_group: bool | None = None
    collectives_in_steps: CollectivesInSteps | None = None
    accelerate: dict[str, str] | None = None
    mixed_precision: str | None = None
    oom: OomRecord | None = None


class RankEntry(RankFacts, kw_only=True):
    """A rank's entry in summary.json: its facts, its exit record's fields over them (RankExit's), and
    `complete` (it ended ok). A run without exit records (no runner) has its facts alone, `running`."""

    kind: RankEnd = RankEnd.RUNNING
    group: str | None = None
    logs: dict[str, str] = msgspec.field(default_factory=dict)
    command: list[str] | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    signal: str | None = None
    message: str | None = None
    stderr_tail: list[str] = msgspec.field(default_factory=list)
    signals_passed_on: list[str] | None = None
    steps_seen: int | None = None
    stop: str | None = None
    hung: bool | None = None
    orphaned: bool | None = None
    leftovers_killed: bool | None = None


def attempt_of(env: Mapping[str, str]) -> str:
    """This start of the job, alike on every rank: the job id (an array's task included) and Slurm's
    restart count (a requeue), and torchrun's restart of its worker group; in a task, its runner's."""
    if env.get(ATTEMPT_VARIABLE):
        return env[ATTEMPT_VARIABLE]
    job = env.get("SUBMITIT_LOCAL_JOB_ID")  # first: an outer job's Slurm variables are not a local run's
    if not job and env.get("SLURM_ARRAY_JOB_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    job = job or env.get("SLURM_JOB_ID") or "here"
    return f"{job}.{env.get('SLURM_RESTART_COUNT') or 0}.{env.get('TORCHELASTIC_RESTART_COUNT') or 0}"


def tail_lines(path: Path, count: int = 10) -> list[str]:
    """The last non-empty lines of a log (at most TAIL_BYTES of it), each cut to 300 characters."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip()[:300] for line in text.splitlines() if line.strip()][-count:]


def last_said(lines: list[str]) -> str | None:
    """What a failed rank said last: its last exception line where there is one (a process that raised and
    then aborted at its exit, as gloo's threads make it, still says why), else its last line."""
    return next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1] if lines else None)


def _exits(folder: Path) -> list[RankExit]:
    """The exit records in `folder`: each a RankExit, or left out (cut, planted, not that shape: said)."""
    found = []
    for path in sorted(folder.glob("rank*.exit.json")) if folder.is_dir() else []:
        try:
            record = decode_exit(path.read_bytes())
        except SchemaError as e:  # a later toolkit's layout: said
            log.warning(f"hpc: {path}: not an exit record ({e})")
            continue
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:  # cut or planted: no record
            log.debug(f"hpc: {path}: not an exit record ({e})")
            continue
        if is_count(record.rank):
            found.append(record)
    return found


def group_of(record: RankExit) -> str:
    """Which start of the world a rank's record is of: its `group` (the runner's group_key)."""
    return str(record.group)


def latest_attempt(records: list[RankExit]) -> str | None:
    """The highest attempt among a start's records (under torchrun each node counts its own restarts)."""
    return max((r.attempt for r in records), key=_attempt_order, default=None)


def _attempt_order(attempt: str) -> list[int]:
    return [int(p) if p.isdigit() else -1 for p in attempt.split(".")[1:]]


def read_records(paths: RunPaths) -> list[RankExit]:
    """Every rank's exit record of the latest start of the world (the group started last), by rank."""
    found = _exits(paths.ranks)
    if not found:
        return []
    newest = group_of(max(found, key=lambda r: r.started_ns or 0))
    return sorted((r for r in found if group_of(r) == newest), key=lambda r: r.rank)


def read_facts(paths: RunPaths) -> dict[int, RankFacts]:
    """Every rank's facts (what its task measured), by rank, each decoded into RankFacts: a file not that
    shape is no record (said); a mistyped OOM record in one is said and left out, the rest kept."""
    found = {}
    for path in sorted(paths.ranks.glob("rank*.facts.json")) if paths.ranks.is_dir() else []:
        data = read_json(path)
        if not isinstance(data, dict):
            continue  # cut, or being written: no record yet
        if (why := other_layout(data, FACTS_SCHEMA)) is not None:
            log.warning(f"hpc: {path}: not read: {why}")
            continue
        oom = oom_in(data, str(path))
        try:
            facts = msgspec.convert({**data, "oom": None}, RankFacts)
        except msgspec.ValidationError as e:
            log.warning(f"hpc: {path}: not a facts record ({with_value(data, str(e))})")
            continue
        facts.oom = oom
        found[facts.rank] = facts
    return found


def write_facts(paths: RunPaths, facts: RankFacts) -> None:
    """A rank's facts file, whole, with its layout (the caller says a failed write in its own terms)."""
    paths.ranks.mkdir(parents=True, exist_ok=True)
    record = {**msgspec.to_builtins(facts, enc_hook=str), "schema": FACTS_SCHEMA}  # a torch type: as text
    write_atomic(paths.rank_facts(facts.rank), msgspec.json.format(msgspec.json.encode(record), indent=1).decode())


def kind_of_code(code: int | None, requeue_codes: tuple[int, ...], oom: bool = False) -> RankEnd:
    """How a task that exited with `code` ended, as its exit record names it (signals aside)."""
    if code == EXIT_OK:
        return RankEnd.OK
    if code == EXIT_OOM and oom:
        return RankEnd.OOM
    return RankEnd.STOPPED if code in requeue_codes else RankEnd.FAILED


Ended = RankExit | RankEntry  # a rank's end as its runner recorded it, or as summary.json holds it


def exit_code_of(record: Ended) -> int:
    """A rank's exit code as a shell reads it: its task's own, 128 + N for a signal N, 1 when unknown; 3
    for a task stopped that exited 0 without saying it finished (stopped: requeued by the rule)."""
    if record.kind == RankEnd.OK:
        return EXIT_OK
    code = record.exit_code
    if record.kind == RankEnd.STOPPED and code == EXIT_OK:
        return EXIT_PREEMPTED
    if code is not None and code > 0:
        return code
    sig = record.signal
    number = getattr(signal, sig, None) if sig is not None and sig.startswith("SIG") else None
    return 128 + int(number) if isinstance(number, signal.Signals) else 1


def root_cause(records: Sequence[Ended]) -> Ended | None:
    """The first rank to fail on its own (see the module doc), or None."""
    failed = [r for r in records if r.kind == RankEnd.FAILED]
    return min(failed, key=lambda r: (r.ended_ns or 0, r.rank)) if failed else None


def requeue_code(record: Ended) -> int | None:
    """The code the requeue rule reads for a rank's end, None where the rank's end asks for nothing: a
    stopped rank's own requeue code (3 for a script that exited 0 after the stop, unfinished: Lightning
    does, and resumes from its last.ckpt), and 3 for a rank killed after the grace time that followed a
    SIGTERM: a command that took the stop and did not end in time (Lightning's DDP ranks, deadlocked by the
    collective in its SIGTERM handler: docs/faults.md) resumes from what it last saved, as a task killed at
    the end of the warning would."""
    if record.kind == RankEnd.STOPPED:
        return exit_code_of(record)
    if record.kind == RankEnd.KILLED and record.stop == signal.SIGTERM.name:
        return EXIT_PREEMPTED
    return None


class CodeFor(enum.Enum):
    """Who reads a run's exit code (docs/faults.md)."""

    JOB = "job"  # Slurm: the batch shell's exit, the job's state and what `afterok` waits on
    COMMAND = "command"  # whoever ran or followed the run: hpc.submit (--local, --wait, salloc), hpc.rank --outcome


def run_exit_code(outcome: Outcome | None, reader: CodeFor, ranks: Sequence[Ended] = (), step_rc: int = EXIT_OK) -> int:
    """How a run's end is an exit code, decided here alone, from its outcome (run_outcome's) and its ranks'
    records. Never 0 for a run that did not finish, but for an OOM told to a command.
    - For a job: 4 for an OOM (Slurm says FAILED, `afterok` waits), the first failing rank's code (128 + N
      for a signal N), a stopped rank's (3 for a script that exited 0 unfinished), else srun's
      (`step_rc`), else 1.
    - For a command (EXIT_CODES): 0 done or oom (a sweep point that did not fit is its result), 3 stopped,
      preempted or cancelled, 1 failed, or not known to have ended (None: no record)."""
    if reader is CodeFor.COMMAND:
        return EXIT_CODES[outcome or Outcome.FAILED]
    if outcome == Outcome.DONE:
        return EXIT_OK
    if outcome == Outcome.OOM:
        return EXIT_OOM
    cause = root_cause(ranks)
    if cause is not None:
        return exit_code_of(cause)
    stopped = [code for r in ranks if (code := requeue_code(r)) is not None]  # a stopped rank's code is never 0
    return stopped[0] if stopped else step_rc or EXIT_FAILED


def failure_line(records: Sequence[Ended], world_size: int) -> str | None:
    """One line naming the failing rank, its host, its exit code or signal, its last stderr line and its
    log, and what became of the others; None when no rank failed."""
    cause = root_cause(records)
    if cause is None or (first_bad(records) or cause).kind == RankEnd.OOM:  # an OOM's peers failing after it
        return None
    others = [r.rank for r in records if r is not cause]
    missing = sorted(set(range(world_size)) - {r.rank for r in records})
    after = f"; {_ranks(others)} ended after it" if others else ""
    lost = f"; {_ranks(missing)} left no record (killed with the job)" if missing else ""
    return (
        f"rank {cause.rank} failed first (on {cause.hostname}, local rank {cause.local_rank}): "
        f"{cause.message}; its stderr: {cause.logs.get('err')}{after}{lost}"
    )


def world_of(records: Sequence[Ended]) -> int:
    """The ranks' world size as they recorded it (the largest said), else how many recorded."""
    said = [r.world_size for r in records if r.world_size is not None and is_count(r.world_size)]
    return max(said, default=len(records))


def _ranks(ranks: list[int]) -> str:
    listed = ",".join(str(r) for r in ranks[:16]) + (f",... ({len(ranks)})" if len(ranks) > 16 else "")
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}"


def _ended_on_its_own(facts: RankFacts) -> bool:
    """Whether a task recorded its own end: its exit code, or an OOM."""
    return facts.exit_code is not None or facts.oom is not None


def rank_entries(
    records: list[RankExit], facts: dict[int, RankFacts], requeue_codes: tuple[int, ...]
) -> list[RankEntry]:
    """Each rank's record in summary.json: its facts, then its exit record over them, with `complete`. A
    rank still `running` by its runner's record but whose task recorded its exit code is judged by that
    code; without exit records (no runner), the facts alone make the ranks."""
    exits = {r.rank: r for r in records}
    ranks = sorted(exits) or sorted(rank for rank, f in facts.items() if _ended_on_its_own(f))
    entries = []
    for rank in ranks:
        record, own = exits.get(rank), facts.get(rank)
        if own is not None and record is not None and own.attempt not in (None, record.attempt):
            own = None  # an earlier attempt's measurements are not this one's
        fields = msgspec.to_builtins(own) if own is not None else {"rank": rank}
        entry = msgspec.convert({**fields, **(record.as_dict() if record is not None else {})}, RankEntry)
        if entry.kind == RankEnd.RUNNING and own is not None and _ended_on_its_own(own):
            entry.exit_code = own.exit_code if own.exit_code is not None else EXIT_OOM
            entry.kind = kind_of_code(entry.exit_code, requeue_codes, own.oom is not None)
        seen = record.steps_seen if record is not None else None  # a script killed before its facts' last write
        if seen is not None and is_count(seen) and (entry.steps is None or entry.steps < seen):
            entry.steps = seen
        entry.complete = entry.kind == RankEnd.OK
        entry.profiler = entry.profiler or ProfilerFacts()
        entries.append(entry)
    return entries


class EarlierAttempt(msgspec.Struct):
    """How an earlier start of the run ended (summary.json's `earlier`)."""

    attempt: str | None
    outcome: Outcome
    failure: str | None  # the line naming its first failing rank
    first: str | None  # the first rank to end badly, in a phrase


def oom_in(facts: Mapping[str, object], where: str) -> OomRecord | None:
    """A rank's OOM record in its facts, decoded (None: none, or not that shape: said)."""
    try:
        return msgspec.convert(facts.get("oom"), OomRecord) if facts.get("oom") is not None else None
    except msgspec.ValidationError as e:
        log.warning(f"hpc: {where}: rank {facts.get('rank')}: its out-of-memory record ignored ({e})")
        return None


# summary.json's layout. A reader refuses another in one line (a later toolkit's file); a file written
# before the field was added is of the first.
SUMMARY_SCHEMA = 1


class RunRecord(msgspec.Struct, kw_only=True):
    """summary.json: the same top-level keys whatever the task, written whole by its one writer and decoded
    into this when read (a field a file leaves out reads as its default: the file of a run whose writer had
    not yet that field). `ranks`: each rank's facts under its exit record (RankExit's fields, `complete`, and
    what its task measured: the training's or the hook's), each with an integer `rank`."""

    kind: Literal["train", "command"] = "train"
    run_dir: str = ""
    command: list[str] | None = None
    point: SweepPoint | None = None
    world_size: Count | None = None
    attempt: str | None = None
    outcome: Outcome | None = None
    failure: str | None = None
    profiled: bool = False
    config: JsonObject | None = None
    oom: OomRecord | None = None
    recovered: bool = False
    earlier: list[EarlierAttempt] = msgspec.field(default_factory=list)
    gpus: GpuSummary | None = None
    metrics: str | None = None  # where the command wrote its metrics outside the run directory (metrics_place)
    ranks: list[RankEntry] = msgspec.field(default_factory=list)
    schema: int = SUMMARY_SCHEMA

    @property
    def first_rank(self) -> RankEntry | None:
        """Rank 0's record (the lowest rank's), where the run-wide facts are; None without one."""
        return self.ranks[0] if self.ranks else None


def decode_run_record(data: bytes) -> RunRecord:
    """summary.json's bytes as the typed record, strictly (msgspec.ValidationError: not that shape;
    SchemaError: of another layout)."""
    return decode_versioned(data, RunRecord, SUMMARY_SCHEMA)


def earlier_attempts(paths: RunPaths) -> list[EarlierAttempt]:
    """How each earlier attempt of the run ended (the last EARLIER_KEPT, oldest first), from the exit
    records moved aside (keep_earlier): its attempt, outcome, the line naming its first failing rank, and
    that rank's end in a phrase. A rank still `running` there was lost (its runner never recorded its end)."""
    by_group: dict[str, list[RankExit]] = {}
    for record in _exits(paths.earlier):
        if record.kind == RankEnd.RUNNING:
            record = msgspec.structs.replace(record, kind=RankEnd.LOST, message=LOST)
        by_group.setdefault(group_of(record), []).append(record)
    attempts: list[EarlierAttempt] = []
    for records in sorted(by_group.values(), key=lambda rs: min(r.started_ns or 0 for r in rs)):
        records.sort(key=lambda r: r.rank)
        attempt = max((r.attempt for r in records), key=_attempt_order)
        world = world_of(records)
        ended = [r for r in records if r.kind != RankEnd.OK]
        first = first_bad(records) or min(ended, key=lambda r: (r.ended_ns or 0, r.rank), default=None)
        said = None if first is None else f"rank {first.rank} ({first.hostname}): {first.message}"
        outcome, failure = run_outcome(records, world), failure_line(records, world)
        attempts.append(EarlierAttempt(attempt, outcome, failure, said))
    return attempts[-EARLIER_KEPT:]


def restarts_line(summary: RunRecord) -> str | None:
    """One line on the worker group's restarts inside this start of the job (torchrun's; a requeue is
    said where it happens), naming the rank each earlier group lost first; None when there were none."""
    attempt = summary.attempt or ""
    start = attempt.rsplit(".", 1)[0] + "."
    restarts = [a for a in summary.earlier if (a.attempt or "").startswith(start)]
    if not restarts or "." not in attempt:
        return None
    ends = "; ".join(f"after {a.attempt}, {a.first or a.outcome}" for a in restarts)
    count = f"{len(restarts)} time" + ("s" if len(restarts) > 1 else "")
    return f"torchrun restarted the worker group {count} (ranks/earlier/ has how each rank ended): {ends}"


def task_of(paths: RunPaths) -> tuple[RankCommand | None, JsonObject | None]:
    """What the run is, for summary.json: the task's record (task.json, written by the job; None: a run
    started outside any runner, or a file that is no task, said), and the resolved config of the toolkit's
    training (config.yaml)."""
    task = None
    try:
        task = decode_task(paths.task.read_bytes())
    except OSError:  # none: a run started outside any runner
        pass
    except (msgspec.DecodeError, msgspec.ValidationError, SchemaError) as e:
        log.warning(f"hpc: {paths.task}: ignored: {e}")
    config = None
    with contextlib.suppress(Exception):  # a damaged config.yaml: the summary says none (hpc.train says why)
        loaded = load_yaml_text(paths.config.read_text()) if paths.config.is_file() else None
        config = loaded if isinstance(loaded, dict) else None
    return task, config


def metrics_place(paths: RunPaths) -> Path | None:
    """Where the run's command writes its metrics outside its run directory (task.json's command.metrics, its
    {run_dir} filled, relative to where the command started); None where not set, or task.json unreadable."""
    try:
        task = decode_task(paths.task.read_bytes())
        place = task.metrics.format_map({"run_dir": str(paths.root)}) if task.metrics else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, SchemaError, ValueError, KeyError, IndexError):
        return None
    return Path(task.cwd or paths.root, place) if place else None


def build_summary(paths: RunPaths, records: list[RankExit], facts: dict[int, RankFacts]) -> RunRecord:
    """summary.json's contents: the same top-level keys whatever the task (see the module doc); a
    function of the run directory's files alone."""
    task, resolved = task_of(paths)
    said = scheduler_said(paths)
    attempt = latest_attempt(records)
    ended = attempt is not None and said.ended == attempt
    submitted = task.config if task is not None else None
    config = resolved or submitted or next((f.config for f in facts.values() if f.config is not None), None)
    codes = task.requeue_codes if task is not None else ()
    ranks = rank_entries(records, facts, codes)
    for rank in ranks if ended else ():
        if rank.kind == RankEnd.RUNNING:
            rank.kind, rank.message = RankEnd.LOST, LOST
    world = world_of(ranks)
    ooms = [r.oom for r in ranks if r.oom is not None]
    section = (config or {}).get("profiler")
    profiler = section if isinstance(section, dict) else {}
    hook: Mapping[str, object] = {"enabled": False}  # a command's
    if task is not None and task.profiler is not None:
        hook = task.profiler
    return RunRecord(
        kind="train" if config is not None else "command",
        run_dir=str(paths.root),
        command=(records[0].command if records else None) or (list(task.words) if task else None) or None,
        point=task.point if task is not None else None,
        world_size=world,
        attempt=attempt or next((r.attempt for r in ranks), None),
        outcome=run_outcome(ranks, world, cancelled(said, attempt)),
        failure=failure_line(ranks, world),
        profiled=bool((profiler if config is not None else hook).get("enabled", True)),
        config=config,
        oom=ooms[0] if ooms else None,
        recovered=any(r.recovered for r in ranks),
        earlier=earlier_attempts(paths),
        gpus=summarize_gpus(paths.gpus) if paths.gpus.is_dir() else None,
        metrics=str(place) if (place := metrics_place(paths)) is not None else None,
        ranks=ranks,
    )


def no_step_line(summary: RunRecord | None) -> str | None:
    """One line when a command ended with no optimizer step seen on any rank (the start-up hook counts
    torch.optim steps): a run that trained nothing, or trained out of the hook's sight, is not a silent done."""
    if summary is None or summary.kind != "command" or summary.outcome != Outcome.DONE:
        return None
    if any(r.steps is not None and r.steps > 0 for r in summary.ranks):
        return None
    return (
        "the command exited 0 with no torch.optim optimizer step on any rank: nothing was trained that the "
        "toolkit could see (no step times, no trace); a script that skipped its training (no GPU found, no data) "
        "or updates its weights by hand says why in its own output (logs/)"
    )


def keep_earlier(paths: RunPaths, rank: int) -> None:
    """The rank's exit record of its earlier start (a worker group torchrun restarted, a requeued job's
    last start, a run resumed outside any runner: one start runs a rank at a time) moved aside before this
    start's replaces it or its facts outdate it: how that one ended stays on disk and in summary.json, and
    this start's own record makes the summary. Each rank moves its own; a failed move is said."""
    try:
        earlier = decode_exit(paths.rank_exit(rank).read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, SchemaError):
        return  # none, or not a record (a cut one is replaced)
    try:
        paths.earlier.mkdir(parents=True, exist_ok=True)
        os.replace(paths.rank_exit(rank), paths.earlier_exit(rank, earlier.started_ns or 0))
    except OSError as e:
        log.warning(f"hpc: rank {rank}: attempt {earlier.attempt}'s exit record not kept ({e})")


def scheduler_said(paths: RunPaths) -> SchedulerSaid:
    """RUN/ranks/scheduler.json (nothing said: an empty one; one not that shape is ignored, one of another
    schema said so in a line)."""
    try:
        return decode_scheduler(paths.scheduler.read_bytes())
    except OSError:
        return SchedulerSaid()
    except (msgspec.DecodeError, msgspec.ValidationError, SchemaError) as e:
        log.warning(f"hpc: {paths.scheduler}: ignored: {e}")
        return SchedulerSaid()


def record_scheduler(paths: RunPaths, **said: str) -> None:
    """Add to what the scheduler said of the run (job and state: the follower's sacct; ended: the
    attempt whose every task has ended). A failed write raises OSError."""
    now = msgspec.structs.replace(scheduler_said(paths), **said)
    paths.ranks.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.scheduler, msgspec.json.encode(now).decode())


def attempt_job(attempt: str) -> str:
    """The job of an attempt (`attempt_of`'s JOB.RESTART.GROUP_RESTART): its Slurm job id, an array task's as 123_4."""
    return attempt.split(".")[0]


def attempt_restarts(attempt: str | None) -> int:
    """Slurm's restart count at an attempt (`attempt_of`'s JOB.RESTART.GROUP_RESTART: SLURM_RESTART_COUNT);
    0 for none, or one without it."""
    counts = _attempt_order(attempt or "")
    return max(counts[0], 0) if counts else 0


def cancelled(said: SchedulerSaid, attempt: str | None) -> bool:
    """Whether the scheduler says a person cancelled this start's job (scancel: Slurm's CANCELLED, recorded
    by the job's follower, hpc/launch/submission/follow.py): its ranks saw only a SIGTERM, as in a
    preemption."""
    if said.state != SLURM_CANCELLED or not attempt:
        return False
    return str(said.job) == attempt_job(attempt)


def write_run_summary(paths: RunPaths, ended: bool = False) -> RunRecord | None:
    """summary.json made again from the records, under a lock so that two writers do not interleave.
    Returns it, or None when no rank has left a record. A failed write (a full disk) raises OSError.
    `ended`: the caller saw the attempt's every task end (its srun step, its job): recorded first
    (scheduler.json), so a rank still `running` is `lost` (its runner was killed before it could record
    its task's end), in this summary and in any made again of the same files."""
    if not read_records(paths) and not read_facts(paths):
        return None
    paths.ranks.mkdir(parents=True, exist_ok=True)
    with os.fdopen(open_append(paths.ranks / ".summary.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        attempt = latest_attempt(read_records(paths))
        if ended and attempt is not None and scheduler_said(paths).ended != attempt:
            record_scheduler(paths, ended=attempt)
        summary = build_summary(paths, read_records(paths), read_facts(paths))
        write_summary(paths, summary)
    return summary


def current_summary(paths: RunPaths, warn: Warn = ignore) -> RunRecord | None:
    """The run's summary as its records make it now: summary.json as written, or made again in memory
    where it is missing or older than a record of its ranks (a run killed before its last writer came, a
    start outside any runner). Reading writes nothing (the reader may not own the run)."""
    return _current_and_written(paths, warn)[0]


def _current_and_written(paths: RunPaths, warn: Warn) -> tuple[RunRecord | None, RunRecord | None]:
    """current_summary, and summary.json as on disk (the same value where nothing newer was recorded),
    each file read once."""
    newest = max((p.stat().st_mtime_ns for p in _record_files(paths)), default=None)
    try:
        stamp: int | None = paths.summary.stat().st_mtime_ns
    except OSError:
        stamp = None
    written = read_summary(paths.summary, warn) if stamp is not None else None
    if newest is None or (stamp is not None and stamp >= newest):
        return written, written
    records, facts = read_records(paths), read_facts(paths)
    if not records and not facts:
        return written, written
    return build_summary(paths, records, facts), written


def _record_files(paths: RunPaths) -> list[Path]:
    if not paths.ranks.is_dir():
        return []
    found = [*paths.ranks.glob("rank*.exit.json"), *paths.ranks.glob("rank*.facts.json"), paths.scheduler]
    return [p for p in found if p.is_file() and not p.is_symlink()]


def write_summary(paths: RunPaths, summary: RunRecord, first_wins: bool = False) -> None:
    """Write summary.json atomically. With first_wins, an existing one is kept (a hard link never
    replaces a file)."""
    text = json.dumps(msgspec.to_builtins(summary), indent=2)
    if not first_wins:
        write_atomic(paths.summary, text)
        return
    tmp = temp_name(paths.summary.with_name(f"{paths.summary.name}.first"))
    write_atomic(tmp, text)
    try:
        os.link(tmp, paths.summary)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def read_summary(path: Path, warn: Warn = ignore) -> RunRecord | None:
    """summary.json decoded into its record, or None when absent, not that shape or of another layout
    (warned, in one line)."""
    if not path.exists():
        return None
    data = read_json(path, warn)
    return decoded(data, RunRecord, SUMMARY_SCHEMA, str(path), warn) if data is not None else None


# How a run stands, from its directory alone (hpc.train decides with it that a finished run whose summary
# is missing or stale only needs its summary written; hpc.study status shows a point with it): the run
# directory is the truth, whatever the queue says or whether anyone is left to ask: its summary as its
# records make it (current_summary), read as hpc/core/ending.py spells it, and checkpoints/last.json
# (written with every checkpoint: the step it holds and the run's last step), nothing else.


@dataclasses.dataclass(frozen=True)
class RunState:
    """leaves: what the run leaves, not how it ended (that is `said`): done (trained to its last step, its
    last epoch's evaluation recorded), oom, stopped (a checkpoint to resume from short of that, whatever
    ended it: a stop, a preemption, a cancel, a kill), or None (nothing to resume: never started, or failed
    before its first checkpoint).
    step: the last step the run reached and kept (the checkpoint's or the summary's), None if none.
    stop_at: the run's last step, where a checkpoint says it. summary_current: summary.json exists and
    says what the checkpoint says (a run killed between its last checkpoint and its summary has not).
    said: the run's outcome as its ranks' records make it (ending.Outcome; None: no record)."""

    leaves: Outcome | None
    step: int | None
    stop_at: int | None
    summary_current: bool
    said: Outcome | None = None

    @property
    def complete(self) -> bool:
        return self.leaves == Outcome.DONE


def _summary_step(summary: RunRecord | None) -> int | None:
    first = summary.first_rank if summary is not None else None
    return first.steps if first is not None else None


def run_state(paths: RunPaths, warn: Warn = ignore) -> RunState:
    """The run's state from its files (see RunState); unreadable files are warned about and read as absent."""
    summary, written = _current_and_written(paths, warn)  # as the records make it; as on disk
    said = summary.outcome if summary is not None else None
    # what the run leaves: done, oom, or a checkpoint to resume from (stopped, preempted, cancelled, cut short)
    leaves = Outcome.STOPPED if said in RESUMABLE or (summary is not None and said is None) else said
    info = read_checkpoint_info(paths, warn)
    step_said = _summary_step(summary)
    if leaves == Outcome.OOM:
        return RunState(leaves, info.step if info else None, info.stop_at if info else None, True, said)
    if info is None:  # no checkpoint to compare with (or one written before last.json existed): the summary says
        kept = leaves if leaves in (Outcome.DONE, Outcome.STOPPED) else None
        return RunState(kept, step_said, None, written is not None, said)
    step_saved, stop_at = info.step, info.stop_at
    # At the last step but its epoch's end (evaluation, record) still owed: not done. Older files lack it.
    done = info.complete if info.complete is not None else step_saved >= stop_at
    written_said = written.outcome if written is not None else None
    current = written is not None and _summary_step(written) == step_saved and (written_said == Outcome.DONE) == done
    return RunState(Outcome.DONE if done else Outcome.STOPPED, step_saved, stop_at, current, said)
