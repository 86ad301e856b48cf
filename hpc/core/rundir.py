"""The run directory and the sweep directory: every file's name, and the one reader and writer of each.

A run directory (`RunPaths`; a job's ranks write it, the analysis and hpc.study read it):

    task.json            what every rank runs (hpc/settings/rankcommand.py): its words, where, with what
    job.json             the Slurm job it runs in: its shape and options (`JobRecord`), what resumes it
    logs/rank{R}.out, .err    a rank's stdout and stderr (the runner: hpc/launch/rank/runner.py)
    ranks/rank{R}.exit.json   how a rank's process ended (the runner); .facts.json what it measured
                         (the training, or the profiler hook in a user's script)
    ranks/earlier/rank{R}.{started_ns}.exit.json   its exit record from an earlier start (a torchrun
                         restart of the worker group, a requeue), kept when the next one starts
    ranks/rank{R}.stack.txt   its Python stacks, dumped when the runner asked (a hung rank, a failed peer)
    ranks/rank{R}.busy        touched by its runner while the rank makes no step but works (its peers are not hung)
    flight_recorder/rank{R}   NCCL's Flight Recorder dump, when asked or at torch's own timeout
    summary.json         the run's outcome and one record per rank, made of those (hpc/core/summary.py)
    config.yaml          the toolkit's training: the resolved config (written at the start; a resume
                         must match it); submitted.yaml the config the job hands it
    traces/              torch.profiler traces, rank{R}.*.pt.trace.json[.gz], one per rank per cycle
    metrics.jsonl        one JSON record per log interval and per epoch, rank 0
    checkpoints/last.pt  the checkpoint (hpc/training/checkpoint.py), with a checksum of its contents
    checkpoints/previous.pt   the one before it, kept in case last.pt is found damaged
    checkpoints/last.json     what last.pt holds (step, epoch, the run's last step), readable without torch
    tensorboard/         the scalars for TensorBoard
    logs/rank{R}.log     tracebacks of failures reported in one line on the console
    memory_snapshot.rank{R}.pickle   the allocator's history at an OOM, when recorded
    gpus/{node}.jsonl    NVML samples of the node's GPUs, a few a second (hpc/core/gpusample.py)
    .lock                held by the run's rank 0 while it runs (hpc/core/lock.py): one writer at a time

A sweep directory (`SweepPaths`; hpc.study writes it):

    sweep.yaml           the sweep and what its points run, as resolved
    index.json           every point: its fields, job id, run directory (a name inside the sweep), history
    study.json           the analysis jobs submitted for it
    <job id>/            each point's run directory
    analysis/            the analysis's tables, figures and report.html
    analysis-jobs/       the analysis jobs' submitit folders

Readers are defensive: a file of the wrong shape is reported through `warn` and read as absent (or
with the bad part dropped), never a traceback. No torch import; nothing else of the project but core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Literal, Protocol, overload

import msgspec

from hpc.core.files import (
    JsonObject,
    Warn,
    append_line,
    decoded,
    dump_yaml,
    ignore,
    is_temp_name,
    other_layout,
    read_json,
    with_value,
    write_atomic,
)

CONFIG = "config.yaml"
SUBMITTED = "submitted.yaml"
TRACES = "traces"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT = f"{CHECKPOINTS}/last.pt"
PREVIOUS_CHECKPOINT = f"{CHECKPOINTS}/previous.pt"
CHECKPOINT_INFO = f"{CHECKPOINTS}/last.json"
TENSORBOARD = "tensorboard"
LOGS = "logs"
LOCK = ".lock"
TASK = "task.json"
JOB = "job.json"  # the Slurm job's shape and options (JobRecord), written by its batch shell at each start
RANKS = "ranks"
MEETING = "meeting.json"  # ranks/meeting.json: the run's store and its secret, for the owner alone (hpc/core/meet.py)
SCHEDULER = "scheduler.json"  # the scheduler's word on how the job ended (a cancel), written by its follower
FLIGHT_RECORDER = "flight_recorder"  # NCCL's Flight Recorder dumps, one per rank (and torch's pipes)
GPUS = "gpus"  # NVML samples of each node's GPUs (hpc/core/gpusample.py)
RANK_SIDE_SUFFIXES = (".exit.json", ".facts.json")  # ranks/: records, not traces
EARLIER = "earlier"  # ranks/earlier/: earlier attempts' exit records
RUN_ENTRIES = frozenset(
    {CONFIG, CHECKPOINTS, SUMMARY, METRICS, TRACES, TENSORBOARD, LOGS, TASK, JOB, RANKS, FLIGHT_RECORDER, GPUS}
)

SWEEP_FILE = "sweep.yaml"
INDEX = "index.json"
STUDY = "study.json"
ANALYSIS = "analysis"
ANALYSIS_JOBS = "analysis-jobs"
REPORT = "report.html"
SWEEP_TABLE = "sweep.md"
RUNS_JSON = "runs.json"  # every point's record, its verdict among them
RUNS_CSV = "runs.csv"
RUNS_MD = "runs.md"
SWEEP_CSV = "sweep.csv"
TRACES_JSON = "traces.json"  # every trace's record
WHY_TABLE = "why.md"  # the verdicts first, then where the time went

# JSON files of ours that a search for traces must skip (last.json lies in checkpoints/, under a run;
# agents.json, torchrun's agents' port, in runs of earlier toolkits)
SIDE_FILES = frozenset(
    {SUMMARY, INDEX, STUDY, TRACES_JSON, RUNS_JSON, TASK, JOB, MEETING, "agents.json", Path(CHECKPOINT_INFO).name}
)
TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.json", "*.json.gz")


def trace_worker(rank: int) -> str:
    """The profiler's worker name for a rank: its trace files are traces/<worker>.<id>.pt.trace.json."""
    return f"rank{rank}"


class HasRoot(Protocol):
    """A directory record: RunPaths, SweepPaths."""

    @property
    def root(self) -> Path: ...


class Under:
    """A file or folder at a fixed place below a directory record's `root`: a typed, read-only attribute
    (`RunPaths(r).summary` is `r / "summary.json"`), one line each instead of a property each."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    @overload
    def __get__(self, obj: None, owner: type) -> Under: ...
    @overload
    def __get__(self, obj: HasRoot, owner: type) -> Path: ...
    def __get__(self, obj: HasRoot | None, owner: type) -> Under | Path:
        return self if obj is None else obj.root.joinpath(*self.parts)


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """The files of one run directory (see the module doc)."""

    root: Path

    config = Under(CONFIG)
    submitted = Under(SUBMITTED)
    traces = Under(TRACES)
    metrics = Under(METRICS)
    summary = Under(SUMMARY)
    checkpoints = Under(CHECKPOINTS)
    checkpoint = Under(CHECKPOINT)
    previous_checkpoint = Under(PREVIOUS_CHECKPOINT)
    checkpoint_info = Under(CHECKPOINT_INFO)
    tensorboard = Under(TENSORBOARD)
    lock = Under(LOCK)
    task = Under(TASK)
    job = Under(JOB)
    ranks = Under(RANKS)
    meeting = Under(RANKS, MEETING)
    scheduler = Under(RANKS, SCHEDULER)

    def rank_stream(self, rank: int, stream: str) -> Path:
        """A command's rank's `out` or `err` stream."""
        return self.root / LOGS / f"rank{rank}.{stream}"

    def rank_exit(self, rank: int) -> Path:
        return self.root / RANKS / f"rank{rank}{RANK_SIDE_SUFFIXES[0]}"

    def earlier_exit(self, rank: int, started_ns: int) -> Path:
        """A rank's exit record of an earlier start of it, by when that started."""
        return self.earlier / f"rank{rank}.{started_ns}{RANK_SIDE_SUFFIXES[0]}"

    earlier = Under(RANKS, EARLIER)

    def rank_facts(self, rank: int) -> Path:
        return self.root / RANKS / f"rank{rank}{RANK_SIDE_SUFFIXES[1]}"

    def rank_busy(self, rank: int) -> Path:
        """Touched by a rank's runner while its task makes no step but works (hpc/launch/rank/hang.py): its
        peers, waiting for it in a collective, are not hung."""
        return self.root / RANKS / f"rank{rank}.busy"

    def rank_stack(self, rank: int) -> Path:
        """Every thread's Python stack, dumped on the runner's request (hpc/core/beat.py)."""
        return self.root / RANKS / f"rank{rank}.stack.txt"

    # NCCL's Flight Recorder (hpc/launch/rank/flightrec.py): torch appends the rank to each; its folder holds
    # the dumps alone (torch's analyzer reads every file in it), the pipes torch makes are in ranks/
    flight_recorder_dir = Under(FLIGHT_RECORDER)
    flight_recorder_prefix = Under(FLIGHT_RECORDER, "rank")
    flight_recorder_pipe_prefix = Under(RANKS, "flight_recorder_pipe.rank")

    def flight_recorder(self, rank: int) -> tuple[Path, Path]:
        """A rank's Flight Recorder dump, and the pipe that asks torch for one."""
        return (Path(f"{self.flight_recorder_prefix}{rank}"), Path(f"{self.flight_recorder_pipe_prefix}{rank}.pipe"))

    gpus = Under(GPUS)

    def gpu_samples(self, node: str) -> Path:
        """One node's NVML samples (its name made safe for a file name)."""
        return self.root / GPUS / f"{re.sub(r'[^A-Za-z0-9._-]', '_', node)}.jsonl"

    def memory_snapshot(self, rank: int) -> Path:
        return self.root / f"memory_snapshot.rank{rank}.pickle"

    def rank_log(self, rank: int) -> Path:
        return self.root / LOGS / f"rank{rank}.log"

    def rank_traces(self, rank: int) -> list[str]:
        """The names of a rank's finished trace files, sorted (summary.json lists them per rank): no temp
        file of an export that failed or was cut short."""
        return sorted(
            p.name for p in self.traces.glob(f"{trace_worker(rank)}.*.pt.trace.json*") if not is_temp_name(p.name)
        )

    def debris(self) -> list[Path]:
        """Temp files writers left here (hpc/core/files.py's naming rule): a killed checkpoint write, a
        trace export cut short, a write probe."""
        found = []
        for folder in (self.root, self.checkpoints, self.traces):
            with contextlib.suppress(OSError):
                found += [p for p in folder.iterdir() if is_temp_name(p.name) or p.name.startswith(".write-test.")]
        return sorted(found)

    def job_logs(self, job_id: str) -> list[Path]:
        """submitit's logs of a job in this directory: stderr first, then stdout, per task."""
        return sorted(self.root.glob(f"{job_id}_*_log.err")) + sorted(self.root.glob(f"{job_id}_*_log.out"))

    def holds_run(self) -> bool:
        """True when the directory holds a run (a file of the contract)."""
        with contextlib.suppress(OSError):
            return bool({p.name for p in self.root.iterdir()} & RUN_ENTRIES)
        return False

    def is_run_or_empty(self) -> bool:
        """True when the directory is missing, empty or holds a run (a file of the contract)."""
        if not self.root.is_dir():
            return True
        names = {p.name for p in self.root.iterdir() if p.name != LOCK and not is_temp_name(p.name)}
        return not names or bool(names & RUN_ENTRIES)


@dataclasses.dataclass(frozen=True)
class SweepPaths:
    """The files of one sweep directory (see the module doc)."""

    root: Path

    sweep_file = Under(SWEEP_FILE)
    index = Under(INDEX)
    study = Under(STUDY)
    analysis = Under(ANALYSIS)
    analysis_jobs = Under(ANALYSIS_JOBS)
    report = Under(ANALYSIS, REPORT)
    sweep_table = Under(ANALYSIS, SWEEP_TABLE)
    why_table = Under(ANALYSIS, WHY_TABLE)
    runs_json = Under(ANALYSIS, RUNS_JSON)

    def run(self, run_dir: str) -> RunPaths:
        return RunPaths(self.root / run_dir)

    def is_sweep(self) -> bool:
        return self.index.is_file() and self.sweep_file.is_file()


# ----------------------------------------------------------------------------------------------
# config.yaml, sweep.yaml (read back through hpc.settings.config, which checks them against the schema)
# ----------------------------------------------------------------------------------------------


def drop_unexpanded(run_dir: Path) -> None:
    """submitit's unexpanded '%j' folder beside a run (its executor's folder before the job had an id),
    removed when empty; one with anything in it, or none, is left."""
    with contextlib.suppress(OSError):
        (run_dir.parent / "%j").rmdir()


def write_yaml(path: Path, data: Mapping[str, object]) -> None:
    write_atomic(path, dump_yaml(data))


# ----------------------------------------------------------------------------------------------
# counts (summary.json itself: hpc/core/summary.py)
# ----------------------------------------------------------------------------------------------


def is_count(value: object) -> bool:
    """A rank, world size or step count: a plain int in [0, 2**20)."""
    return type(value) is int and 0 <= value < 1 << 20


# ----------------------------------------------------------------------------------------------
# checkpoints/last.json
# ----------------------------------------------------------------------------------------------


# checkpoints/last.json's layout; a reader refuses another in one line, and one without the field is of the first.
CHECKPOINT_INFO_SCHEMA = 1
Count = Annotated[int, msgspec.Meta(ge=0)]


class CheckpointInfo(msgspec.Struct, kw_only=True):
    """checkpoints/last.json, written with every checkpoint and decoded when read: the step last.pt holds and
    the run's last step; whether the run has nothing left to do (`complete`; None in a file written before
    it said so), its epoch, the batch within it, why it was written, and the file's checksum, size and
    time (the training's checkpoint.py; None for a last.json remade at a resume)."""

    step: Count
    stop_at: Count
    complete: bool | None = None
    epoch: int | None = None
    position: int | None = None
    reason: str | None = None
    sha256: str | None = None
    size: int | None = msgspec.field(default=None, name="bytes")
    written_unix: float | None = msgspec.field(default=None, name="time")
    schema: int = CHECKPOINT_INFO_SCHEMA


JOB_SCHEMA = 1  # job.json's layout


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """job.json: the Slurm job a run directory's run ran in, as its batch shell knew it at its start (None:
    not known there, the profile's then): what `hpc.submit --resume RUN` submits again."""

    nodes: int
    gpus: int  # per node, a rank each (launcher srun)
    profile: str  # the cluster profile
    time_min: int | None = None
    name: str | None = None
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    constraint: str | None = None
    export_all: bool = True  # sbatch's --export: ALL (this environment) or NONE, then `exports`
    exports: dict[str, str] = msgspec.field(default_factory=dict)
    schema: int = JOB_SCHEMA


def write_job_record(paths: RunPaths, record: JobRecord) -> None:
    write_atomic(paths.job, msgspec.json.format(msgspec.json.encode(record), indent=1).decode())


def read_job_record(paths: RunPaths, warn: Warn = ignore) -> JobRecord | None:
    """job.json decoded, or None when absent, not that shape or of another layout (warned)."""
    if not paths.job.exists():
        return None
    data = read_json(paths.job, warn)
    return decoded(data, JobRecord, JOB_SCHEMA, str(paths.job), warn) if data is not None else None


def write_checkpoint_info(paths: RunPaths, info: CheckpointInfo) -> None:
    """What checkpoints/last.pt holds, for readers without torch (hpc.study status, the analysis)."""
    write_atomic(paths.checkpoint_info, msgspec.json.format(msgspec.json.encode(info), indent=2).decode())


def read_checkpoint_info(paths: RunPaths, warn: Warn = ignore) -> CheckpointInfo | None:
    """checkpoints/last.json decoded, or None when absent, not that shape or of another layout (warned)."""
    if not paths.checkpoint_info.exists():
        return None
    info = read_json(paths.checkpoint_info, warn)
    where = str(paths.checkpoint_info)
    return decoded(info, CheckpointInfo, CHECKPOINT_INFO_SCHEMA, where, warn) if info is not None else None


# ----------------------------------------------------------------------------------------------
# metrics.jsonl
# ----------------------------------------------------------------------------------------------


class MetricsRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of metrics.jsonl, written by the training's rank 0 (hpc/training/metrics.py) and decoded when
    read: its kind, step, epoch and time, then the kind's figures (`train`: the loss since the last line, the
    learning rate, images/s; `epoch`: its wall time, images/s, mean training loss, and the evaluation's loss,
    top-1 and top-5 accuracy (%) and images where it ran). A figure a line does not carry is left out."""

    kind: Literal["train", "epoch"]
    step: Count | None = None
    epoch: Count | None = None
    time: float | None = None
    loss: float | None = None
    lr: float | None = None
    images_per_s: float | None = None
    epoch_time_s: float | None = None
    train_loss: float | None = None
    eval_loss: float | None = None
    eval_top1: float | None = None
    eval_top5: float | None = None
    eval_images: int | None = None


_METRICS_LINE = msgspec.json.Decoder(MetricsRecord)


def metrics_line(record: MetricsRecord) -> str:
    """A record as its line: JSON with the standard library's spacing, as the file has always been written
    (a `grep '"kind": "epoch"'` finds it)."""
    return json.dumps(msgspec.to_builtins(record))


def append_metrics(path: Path, record: MetricsRecord) -> None:
    """One JSON record per line, whole or not at all (a failed write is a WriteError naming the file)."""
    append_line(path, metrics_line(record))


def truncate_metrics(path: Path, step: int, epoch: int | None = None) -> int:
    """Keep the records up to a resumed run's checkpoint (every record of a step is written before its
    checkpoint), so the steps redone after a resume are not in the file twice. `epoch` (the checkpoint's)
    orders records of the same step: a checkpoint of an epoch's last step taken before the epoch's end
    drops that end's record (its epoch is the next one), which the resumed run writes again. Returns how
    many records were dropped. This is the rule, in one place: readers may count every record."""
    if not path.is_file():
        return 0
    records = list(read_metrics(path))
    kept = [r for r in records if not _after(r, step, epoch)]
    if len(kept) < len(records) or len(path.read_bytes().splitlines()) != len(records):
        write_atomic(path, "".join(metrics_line(r) + "\n" for r in kept))
    return len(records) - len(kept)


def _after(record: MetricsRecord, step: int, epoch: int | None) -> bool:
    if record.step is None or record.step != step:
        return record.step is not None and record.step > step
    return epoch is not None and record.epoch is not None and record.epoch > epoch


def read_metrics(path: Path) -> Iterator[MetricsRecord]:
    """The records of a run's metrics.jsonl, one at a time, each decoded into MetricsRecord; a line that
    is not one (a line cut off by a kill) is skipped, and a missing file, or one that is no regular file (a
    device such as /dev/zero would be read for ever), has none."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return
        with open(path, "rb") as f:
            for line in f:
                try:
                    yield _METRICS_LINE.decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
    except OSError:
        return


# ----------------------------------------------------------------------------------------------
# index.json
# ----------------------------------------------------------------------------------------------

POINT_KEY = ("data_fraction", "batch_size", "gpus", "nodes")

# index.json's layout. A reader refuses another in one line (a later toolkit's file); an index written
# before the field was added is of the first.
INDEX_SCHEMA = 1

Positive = Annotated[int, msgspec.Meta(gt=0)]
AxisValue = str | int | float | bool  # a sweep axis's value, as sweep.yaml lists it


def point_key(point: Mapping[str, object]) -> tuple[object, ...]:
    """What tells a point from the others: the study's four fields and its other axes' values."""
    values = point.get("values")
    axes = tuple(sorted(values.items())) if isinstance(values, dict) else ()
    return (*(point.get(k, 1 if k == "nodes" else None) for k in POINT_KEY), axes)


class SweepPoint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A point of a sweep's grid as planned (hpc/launch/submission/points.py): the study's four fields and
    the values of its other axes (sweep.axes) where it has any. Recorded as a mapping in task.json and
    summary.json (`point`) and index.json (IndexPoint, with its job)."""

    data_fraction: float
    batch_size: int
    gpus: int
    nodes: int
    values: dict[str, AxisValue] | None = None

    @property
    def key(self) -> tuple[object, ...]:
        """point_key of the point."""
        return point_key(msgspec.structs.asdict(self))


class IndexPoint(msgspec.Struct, kw_only=True):
    """A point of index.json as read: the study's fields, its other axes' values, its job, its run
    directory (a name inside the sweep), the QOS and node share it is charged (site.py), and the job ids
    it had before a resubmission. Decoded strictly, one point at a time: one not this shape is skipped."""

    run_dir: str
    data_fraction: Annotated[float, msgspec.Meta(gt=0)]
    batch_size: Positive
    gpus: Positive
    nodes: Positive = 1
    values: dict[str, AxisValue] = msgspec.field(default_factory=dict)
    job_id: str | int | None = None
    qos: str | None = None
    node_share: Annotated[float, msgspec.Meta(gt=0)] | None = None
    history: list[str | int] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not math.isfinite(self.data_fraction):
            raise ValueError(f"data_fraction {self.data_fraction} is not a positive number")
        place = Path(self.run_dir)
        if not self.run_dir or place.is_absolute() or ".." in place.parts:
            raise ValueError(f"run_dir {self.run_dir[:80]!r} is not a directory name inside the sweep")

    @property
    def key(self) -> tuple[object, ...]:
        """point_key of the point as submitted."""
        return point_key({**{k: getattr(self, k) for k in POINT_KEY}, "values": self.values})

    @property
    def job(self) -> str:
        """Its job id as Slurm says it ('' where none is recorded)."""
        return "" if self.job_id is None else str(self.job_id)


@dataclasses.dataclass(frozen=True)
class SweepIndex:
    """A sweep's index.json as read once: its usable points, and its replica axis (sweep.replicas, as the
    header records the sweep; None where it names none)."""

    points: list[IndexPoint]
    replicas: str | None = None
    metric: str | None = None  # sweep.metric: the script's own metric the report judges by
    mode: str | None = None  # sweep.mode: min or max


def read_sweep_index(path: Path, warn: Warn = ignore) -> SweepIndex:
    """A sweep's index.json, read once; a point with a missing or mistyped field, or a run directory
    outside the sweep directory, is warned about and skipped; an index of another layout is refused."""
    index = read_json(path, warn)
    if index is None:
        return SweepIndex([])
    if not isinstance(index, dict) or not isinstance(index.get("points"), list):
        warn(f"{path}: ignored: expected a mapping with a 'points' list")
        return SweepIndex([])
    why = other_layout(index, INDEX_SCHEMA)
    if why is not None:
        warn(f"{path}: ignored: {why}")
        return SweepIndex([])
    points = []
    for i, point in enumerate(index["points"]):
        try:
            points.append(msgspec.convert(point, IndexPoint))
        except msgspec.ValidationError as e:
            warn(f"{path}: points[{i}] skipped: {with_value(point, str(e))}")
    sweep = index.get("sweep")
    said = sweep if isinstance(sweep, dict) else {}
    replicas, metric, mode = (said.get(key) for key in ("replicas", "metric", "mode"))
    return SweepIndex(
        points,
        replicas if isinstance(replicas, str) else None,
        metric if isinstance(metric, str) else None,
        mode if mode in ("min", "max") else None,
    )


def read_index(path: Path, warn: Warn = ignore) -> list[IndexPoint]:
    """The usable points of a sweep's index.json (read_sweep_index)."""
    return read_sweep_index(path, warn).points


class SweepIndexFile(msgspec.Struct, kw_only=True):
    """index.json as written: the sweep as submitted (sweep.yaml's settings), the cluster's profile, the
    layout, and every point (read back by read_sweep_index, one point at a time)."""

    sweep: JsonObject | None = None
    cluster: str | None = None
    schema: int = INDEX_SCHEMA
    points: list[IndexPoint] = msgspec.field(default_factory=list)


def write_index(sweep: SweepPaths, header: SweepIndexFile, points: list[IndexPoint]) -> None:
    """index.json with `points` merged into the earlier ones (those it can read). A point submitted again
    (`hpc.study resubmit`) replaces its entry; its earlier job ids go to `history`."""
    merged = {p.key: p for p in read_index(sweep.index)} if sweep.index.exists() else {}
    for new in points:
        old = merged.get(new.key)
        history = list(old.history) if old is not None else []
        if old is not None and old.job_id is not None and old.job_id != new.job_id:
            history.append(old.job_id)
        merged[new.key] = msgspec.structs.replace(new, history=history)
    document = msgspec.structs.replace(header, schema=INDEX_SCHEMA, points=list(merged.values()))
    write_atomic(sweep.index, msgspec.json.format(msgspec.json.encode(document), indent=2).decode())


def record_resumed_point(sweep: SweepPaths, run_dir: str, job_id: str) -> bool:
    """A point of the sweep submitted again in its own run directory (hpc.submit --resume): its entry in
    index.json names the new job, its earlier ones in `history`. False where no point runs there."""
    found = [p for p in read_index(sweep.index) if p.run_dir == run_dir]
    said = read_json(sweep.index)
    if not found or not isinstance(said, dict):
        return False
    header = msgspec.convert({k: said.get(k) for k in ("sweep", "cluster")}, SweepIndexFile)
    write_index(sweep, header, [msgspec.structs.replace(found[0], job_id=job_id)])
    return True


# ----------------------------------------------------------------------------------------------
# study.json
# ----------------------------------------------------------------------------------------------


STUDY_SCHEMA = 1  # study.json's layout


class StudyFile(msgspec.Struct, kw_only=True):
    """study.json: the analysis jobs hpc.study submitted for the sweep, oldest first."""

    analysis_jobs: list[str] = msgspec.field(default_factory=list)
    schema: int = STUDY_SCHEMA


def analysis_jobs(sweep: SweepPaths, warn: Warn = ignore) -> list[str]:
    """The sweep's analysis jobs (study.json), oldest first; none where it is missing or cannot be read (warned)."""
    data = read_json(sweep.study, warn) if sweep.study.exists() else None
    said = decoded(data, StudyFile, STUDY_SCHEMA, str(sweep.study), warn) if data is not None else None
    return said.analysis_jobs if said is not None else []


def record_analysis_job(sweep: SweepPaths, job_id: str) -> None:
    """Add an analysis job to study.json (hpc.study: one per run or resubmission); one that cannot be read
    (cut, of another layout) is begun again."""
    record = StudyFile(analysis_jobs=[*analysis_jobs(sweep), job_id])
    write_atomic(sweep.study, msgspec.json.format(msgspec.json.encode(record), indent=2).decode())
