"""The analysis's typed records: what one trace, one rank and one run (a sweep point) measure.

`measure/trace.py` builds `TraceRecord`s, `runs/fold.py` folds them into `RankTotals` and `RunRow`s,
`runs/sweep.py` compares a sweep's runs; everything else reads them by field. Records are frozen: a step that adds to
one (a run's summary, a sweep point's scaling) makes a new one with `dataclasses.replace`.

Output (JSON, CSV, tables) goes through `as_row`, the one place where a record becomes a flat mapping:
`Spread` fields become `<name>_mean` / `<name>_max` columns (`step_time_us_mean_max`: the slowest
rank's mean step time), the column names the README documents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from hpc.core.rundir import AxisValue
from hpc.core.summary import OomRecord


class MetricSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One of a run's own metrics (analysis/read/metrics.py): its last value and step, its lowest and highest,
    how many points it logged, and the file it came from (relative to the run directory)."""

    final: float
    last_step: int
    lowest: float
    highest: float
    points: int
    source: str

    def best(self, mode: str) -> float:
        """Its best value: the lowest for `min` (a loss), else the highest."""
        return self.lowest if mode == "min" else self.highest


@dataclass(kw_only=True, frozen=True)
class CpuTotals:
    """CpuOps's result: profiled steps and their durations, self CPU time, operator calls and the
    operators with the most self time."""

    steps: int = 0
    step_time_us_mean: float | None = None
    step_time_us: list[float] = field(default_factory=list)  # each profiled step, in order
    step_numbers: list[int] = field(default_factory=list)  # N of each ProfilerStep#N (to match ranks' steps)
    cpu_time_us: float = 0.0
    op_calls: dict[str, int] = field(default_factory=dict)
    top_ops: list[dict] = field(default_factory=list)  # name, calls, self_cpu_us, self_device_us
    # `enumerate(DataLoader)` ranges inside the profiled steps (all, without steps); None: no DataLoader
    # in the trace (data.loader: device feeds batches without one)
    dataloader_us: float | None = None
    dataloader_step_us: list[float] | None = None  # of it, each profiled step's (in step order)
    cpu_span_us: float | None = None  # the CPU events' first start to last end
    runtime_us: float | None = None  # host time in runtime calls (cudaLaunchKernel, cudaMemcpyAsync ...)


@dataclass(kw_only=True, frozen=True)
class DeviceTotals:
    """DeviceActivity's result; every field None when the trace has no device activity (a CPU run).
    Definitions: analysis/measure/device.py and analysis/measure/collective.py."""

    cuda_time_us: float | None = None
    kernel_time_us: float | None = None
    memcpy_time_us: float | None = None
    memset_time_us: float | None = None
    gpu_busy_us: float | None = None
    kernel_calls: int | None = None
    graph_kernel_calls: int | None = None  # of kernel_calls, those replayed from a CUDA graph (args "graph id")
    kernel_calls_in_steps: int | None = None  # of kernel_calls, those launched inside the profiled steps
    cuda_time_in_steps_us: float | None = None  # the device time of the events launched inside the steps
    kernel_calls_by_class: dict[str, int] | None = None
    kernel_time_by_class_us: dict[str, float] | None = None  # kernels' summed durations by class
    comm_time_us: float | None = None
    comm_overlap_pct: float | None = None
    temporal_breakdown_us: dict[str, float] | None = None  # computation, communication, memory, idle, span
    idle_breakdown_us: dict[str, float] | None = None  # host_wait, kernel_wait, other (HTA's, over streams)
    steps_breakdown_us: list[dict] | None = None  # the temporal breakdown of each profiled step
    collectives: list[dict] | None = None  # one row per kind: calls, time, bytes, bandwidths, overlap
    collective_launch_us: list[list[float]] | None = None  # per step: each collective's launch, from the step's start
    top_kernels: list[dict] | None = None  # name, calls, total_us, share_pct, class


@dataclass(kw_only=True, frozen=True)
class MemoryPeaks:
    """DeviceMemory's result: peak allocated / reserved bytes on a CUDA device."""

    peak_gpu_mem_bytes: int | None = None
    peak_gpu_reserved_bytes: int | None = None
    gpu_mem_relative_to_window: bool | None = None


@dataclass(kw_only=True, frozen=True)
class TraceRecord(CpuTotals, DeviceTotals, MemoryPeaks):
    """One trace file (one rank, one profiling cycle): its identity, then what the three accumulators
    measured (the fields of CpuTotals, DeviceTotals, MemoryPeaks). Definitions: analysis/measure/trace.py."""

    file: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    events: int = 0
    bad_events: int = 0
    cpu_time_us_per_step: float | None = None
    cuda_time_us_per_step: float | None = None
    kernel_calls_per_step: float | None = None
    comm_time_us_per_step: float | None = None
    peak_cpu_mem_bytes: int | None = None  # from the run's summary.json (the trace does not hold it)
    key_averages: dict[str, float | int | None] | None = None  # the profiler's own totals of the same cycle
    point: TracePoint | None = None
    device_name: str | None = None  # the trace's first device (deviceProperties), where recorded
    verdict: Verdict | None = None  # what bounds this trace


class Verdict(msgspec.Struct, frozen=True):
    """What bounds a trace or a run (analysis/explain/verdict.py `judge`): its class and the next one, each
    class's measured share (0..1), the numbers behind it in one sentence, the remedy, and `line`, all of it
    in one line (`bound [+ secondary]: evidence; remedy: ...`), as the report and runs.json say it."""

    bound: str
    secondary: str | None
    shares: dict[str, float]
    evidence: str
    remedy: str | None
    line: str


class TracePoint(msgspec.Struct, frozen=True):
    """The sweep point a trace belongs to (analysis/runs/sweep.py): the study's fields and the point's values
    of the sweep's other axes in words (`swept`: lr=0.1, seed=1)."""

    data_fraction: float
    batch_size: int
    gpus: int
    swept: str | None = None


def per_step(value: float | None, steps: int) -> float | None:
    return value / steps if (value is not None and steps) else None


N = TypeVar("N", int, float)  # a count or a measure


def in_steps(launched: N | None, window: N | None) -> N | None:
    """What the steps launched where the trace says (it has steps), else the window's total."""
    return window if launched is None else launched


@dataclass(frozen=True)
class RankTotals:
    """One rank's traces folded together: counts and times summed over its cycles, peaks maxed; with
    the rank's optimizer steps per epoch (from its summary), per-epoch values."""

    rank: int | None
    steps: int = 0
    steps_per_epoch: int | None = None
    cpu_time_us: float | None = None
    cuda_time_us: float | None = None
    gpu_busy_us: float | None = None
    kernel_calls: int | None = None
    # what the profiled steps launched (the per-step figures' basis; see analysis/measure/device.py)
    cuda_time_in_steps_us: float | None = None
    kernel_calls_in_steps: int | None = None
    comm_time_us: float | None = None
    step_time_us_mean: float | None = None
    peak_gpu_mem_bytes: int | None = None
    peak_gpu_reserved_bytes: int | None = None
    peak_cpu_mem_bytes: int | None = None
    computation_us: float | None = None  # temporal breakdown, summed over cycles
    communication_us: float | None = None
    memory_us: float | None = None
    idle_us: float | None = None
    span_us: float | None = None

    def _per_step(self, value):
        return per_step(value, self.steps)

    def _per_epoch(self, value):
        each = per_step(value, self.steps)
        return each * self.steps_per_epoch if each is not None and self.steps_per_epoch else None

    cpu_time_us_per_step = property(lambda self: self._per_step(self.cpu_time_us))
    cuda_time_us_per_step = property(lambda self: self._per_step(self.cuda_time_in_steps_us))
    kernel_calls_per_step = property(lambda self: self._per_step(self.kernel_calls_in_steps))
    computation_us_per_step = property(lambda self: self._per_step(self.computation_us))
    communication_us_per_step = property(lambda self: self._per_step(self.communication_us))
    memory_us_per_step = property(lambda self: self._per_step(self.memory_us))
    cpu_time_us_per_epoch = property(lambda self: self._per_epoch(self.cpu_time_us))
    cuda_time_us_per_epoch = property(lambda self: self._per_epoch(self.cuda_time_in_steps_us))
    kernel_calls_per_epoch = property(lambda self: self._per_epoch(self.kernel_calls_in_steps))
    idle_share = property(
        lambda self: self.idle_us / self.span_us if self.idle_us is not None and self.span_us else None
    )


class Consistency(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a candidate is slower than the others step by step (analysis/runs/ranks.py's rule): the steps
    compared, those it was above the others' median in, its median excess and the run's spread (the values'
    unit), whether that holds, and if not, why, in words."""

    steps_compared: int
    steps_above: int | None = None
    excess: float | None = None
    spread: float | None = None
    holds: bool = False
    why_not: str | None = None


class SlowRank(Consistency, frozen=True, kw_only=True):
    """The straggler by every rank's own work (analysis/runs/ranks.py slow_rank): who and where, its own work
    and the others' median, its node's other ranks', whether its node is the slow one, the step, and the part
    of each step the others wait for it; with the rule's evidence (Consistency's fields)."""

    rank: int
    node: str
    own_s: float
    median_own_s: float
    ranks_measured: int
    node_others_own_s: float | None = None
    slow_node: bool = False
    step_s: float | None = None
    wait_share: float | None = None


def max_present(values: Iterable[N | None]) -> N | None:
    """The largest of the values that are there (None: none is)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def mean_present(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are there (None: none is)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What summary.json knows of a run's model, for compute's share of the device's peak: forward FLOPs
    per image, the per-GPU batch, the device, whether it trained in bf16 or graphed, and whether it was a
    user's script (None: no summary to say)."""

    flops_per_image: float | None = None
    batch_size_per_gpu: int | None = None
    device_name: str | None = None
    bf16: bool = False
    graphed: bool = False
    script: bool | None = None


@dataclass(frozen=True)
class Spread:
    """A per-rank quantity across a run's ranks: its mean and its largest value (None: no rank has it)."""

    mean: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: list) -> Spread:
        return cls(mean_present(values), max_present(values))


# RankTotals fields (and properties) a RunRow spreads over ranks, in its column order.
SPREAD_FIELDS = (
    "cpu_time_us",
    "cuda_time_us",
    "gpu_busy_us",
    "kernel_calls",
    "comm_time_us",
    "step_time_us_mean",
    "cpu_time_us_per_step",
    "cuda_time_us_per_step",
    "kernel_calls_per_step",
    "peak_gpu_mem_bytes",
    "peak_gpu_reserved_bytes",
    "peak_cpu_mem_bytes",
    "cpu_time_us_per_epoch",
    "cuda_time_us_per_epoch",
    "kernel_calls_per_epoch",
    "computation_us_per_step",
    "communication_us_per_step",
    "memory_us_per_step",
    "idle_share",
)


@dataclass(frozen=True)
class RunRow:
    """One run (a sweep point): what it was, how it ended, and its ranks' numbers spread over ranks."""

    run_dir: str
    traces: int = 0
    ranks: int = 0
    outcome: str | None = None  # done | stopped | oom
    arch: str | None = None
    step_mode: str | None = None  # eager | graph (train.cuda_graph): graphed and eager sweeps side by side
    graph_check: str | None = None  # passed | failed on rank R: a graphed run's check before its first step
    graph_check_cause: str | None = None  # what failed (then the run went eager), in the trainer's words
    data_fraction: float | None = None
    batch_size_per_gpu: int | None = None
    gpus: int | None = None
    swept: str | None = None  # the point's values of the sweep's other axes (sweep.axes): lr=0.1, seed=1
    series: str | None = None  # the same but its replica axis (sweep.replicas): lr=0.1, what a figure's line is
    replica: str | None = None  # its value of the replica axis (seed=1): folded into a mean and a spread
    values: dict[str, AxisValue] | None = None  # the point's values of sweep.axes, by key (a figure's x)
    job_id: str | None = None
    images_per_s: float | None = None
    rank_imbalance: float | None = None  # slowest rank's mean step time / fastest rank's
    speedup: float | None = None  # against the 1-GPU point of the same fraction and batch
    scaling_efficiency: float | None = None
    oom: OomRecord | None = None  # hpc/training/oom.py's record, for outcome "oom"
    nodes: int | None = None
    epoch_time_s: float | None = None  # measured: the mean of metrics.jsonl's epoch records
    step_skew_us: float | None = None  # mean over profiled steps of (slowest rank's step - fastest rank's)
    straggler_rank: int | None = None  # the rank that launched a collective last most often
    straggler_share: float | None = None  # ... and the share of collectives it was last at
    slowest_step: str | None = None  # "rank R on NODE": the rank whose profiled steps took longest
    # every rank's own work per step from summary.json, profiled or not (analysis/runs/ranks.py's slow_rank)
    slow_rank: SlowRank | None = None
    slowest_step_not_named: str | None = None  # why the profiled steps name no slowest rank (no consistency)
    separate_copies: str | None = None  # why its ranks never waited for each other (analysis/runs/ranks.py)
    gpu_line: str | None = None  # what NVML saw of each GPU during the run (summary.json's gpus), in words
    profiled_ranks: list[int] | None = None  # the ranks whose traces were read (profiler.ranks)
    allreduce_busbw_GBps: float | None = None  # measured, mean over ranks
    allreduce_bytes_per_step: float | None = None  # gradient bytes all-reduced per step (DDP), measured
    loss_us: dict[str, float] | None = None  # where the step time went against the 1-GPU point (runs/sweep.py)
    predicted_efficiency: float | None = None  # the scaling model fed with this run's measurements
    verdict: Verdict | None = None  # what bounds the run, over all its ranks
    scaling_note: str | None = None  # a multi-GPU point: why it falls short of linear (analysis/explain/verdict.py)
    device_kind: str | None = None  # cpu | cuda: what its ranks trained on (summary.json), for the words
    data_source: str | None = None  # cifar100 | synthetic (summary.json's data_source)
    train_images: int | None = None  # the training images of its data fraction
    wall_time_s: float | None = None  # rank 0's training loop, from summary.json
    qos: str | None = None  # the QOS a sweep point ran in (index.json)
    node_hours: float | None = None  # wall time x the nodes it was charged for (a shared node: its share)
    # torch's memory profiler at the largest categorised peak of any rank and cycle (profiler.memory_categories):
    # parameters, gradients, optimizer_state, activations, other (bytes); and that peak
    peak_mem_by_category: dict[str, int] | None = None
    peak_mem_categorised_bytes: int | None = None
    # the script's own metrics (loss, accuracy) as its loggers wrote them, by name (analysis/read/metrics.py)
    metrics: dict[str, MetricSummary] | None = None
    metric_wanted: str | None = None  # sweep.metric: the metric its sweep is judged by, where set
    metric_mode: str | None = None  # sweep.mode: min or max, where set
    cpu_time_us: Spread = field(default_factory=Spread)
    cuda_time_us: Spread = field(default_factory=Spread)
    gpu_busy_us: Spread = field(default_factory=Spread)
    kernel_calls: Spread = field(default_factory=Spread)
    comm_time_us: Spread = field(default_factory=Spread)
    step_time_us_mean: Spread = field(default_factory=Spread)
    cpu_time_us_per_step: Spread = field(default_factory=Spread)
    cuda_time_us_per_step: Spread = field(default_factory=Spread)
    kernel_calls_per_step: Spread = field(default_factory=Spread)
    peak_gpu_mem_bytes: Spread = field(default_factory=Spread)
    peak_gpu_reserved_bytes: Spread = field(default_factory=Spread)
    peak_cpu_mem_bytes: Spread = field(default_factory=Spread)
    cpu_time_us_per_epoch: Spread = field(default_factory=Spread)
    cuda_time_us_per_epoch: Spread = field(default_factory=Spread)
    kernel_calls_per_epoch: Spread = field(default_factory=Spread)
    computation_us_per_step: Spread = field(default_factory=Spread)
    communication_us_per_step: Spread = field(default_factory=Spread)
    memory_us_per_step: Spread = field(default_factory=Spread)
    idle_share: Spread = field(default_factory=Spread)

    @property
    def shape(self) -> tuple[int, int]:
        """(nodes, GPUs per node): what a figure draws one line for."""
        return (self.nodes or 1, self.gpus or 0)

    @property
    def on_cpu(self) -> bool:
        return self.device_kind == "cpu"


def ranks_words(count: int | None, on_cpu: bool) -> str:
    """`2 GPUs`, `1 GPU`, or `2 CPU ranks` where the ranks trained on CPUs (a laptop, the test cluster)."""
    noun = "CPU rank" if on_cpu else "GPU"
    return f"{count} {noun}{'s' if count != 1 else ''}"


def data_words(fraction: float | None, source: str | None, images: int | None) -> str:
    """What a run trained on, as its titles say: `half of CIFAR-100`, a synthetic set and its size, or
    your own script's data (`script`: the toolkit does not know it)."""
    if source == "script":
        return "the script's own data" + (f", fraction {fraction:g}" if fraction not in (None, 1) else "")
    if source == "synthetic":
        size = f" ({images:,} images)" if images else ""
        return f"a synthetic CIFAR-100-format set{size}" + (
            f", fraction {fraction:g}" if fraction not in (None, 1) else ""
        )
    words = {0.1: "one-tenth of CIFAR-100", 0.5: "half of CIFAR-100", 1.0: "the full CIFAR-100"}
    return words.get(fraction or 0.0, f"data fraction {fraction:g}" if fraction is not None else "CIFAR-100")


def as_row(record: Any) -> dict[str, Any]:  # a dataclass record, or a plain row
    """A record as one flat mapping (JSON, CSV, tables): a Spread field `x` becomes `x_mean` and `x_max`.
    Mappings pass through, so tables can mix records with plain rows."""
    if isinstance(record, dict):
        return record
    row: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, Spread):
            row[f"{f.name}_mean"], row[f"{f.name}_max"] = value.mean, value.max
        else:
            row[f.name] = msgspec.to_builtins(value) if isinstance(value, (msgspec.Struct, dict)) else value
    return row
