"""The configuration schema: one frozen dataclass per section (cluster, data, model, train,
profiler, sweep), the checks on their values, which keys may change on resume (marked on the fields),
and the section lists, derived here once. Loading (YAML, layers, provenance, messages) is
hpc/settings/config.py; nothing here reads a file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.cli import name_problem
from hpc.core.files import JsonObject, plain
from hpc.settings.cluster import ClusterConfig
from hpc.settings.fields import Invalid as _Invalid
from hpc.settings.fields import at_most as _at_most
from hpc.settings.fields import check as _check
from hpc.settings.fields import non_negative as _non_negative
from hpc.settings.fields import one_of as _one_of
from hpc.settings.fields import positive as _positive
from hpc.settings.fields import resumable
from hpc.settings.profranks import SETTINGS, is_setting

__all__ = ["ClusterConfig", "_Invalid", "resumable"]  # also read from here by config.py

ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "tiny")


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------


def may_change_on_resume(section: str, key: str) -> bool:
    cls = SECTIONS.get(section)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    return key in fields and fields[key].metadata.get("resumable", False)


DATA_SOURCES = ("cifar100", "synthetic")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    root: str | None = resumable(None)  # None: $HPC_DATA, else $SCRATCH/cifar100 (Perlmutter), else ./data
    fraction: float = 1.0  # study: 1, 1/2, 1/10 (class-balanced, the same on every rank)
    loader: str = "device"  # device: whole uint8 set on the device | dataloader: workers + pinned memory
    num_workers: int = resumable(2)  # DataLoader worker processes per rank (loader: dataloader)
    pin_memory: bool = resumable(True)  # page-locked batches for faster copies to the GPU (loader: dataloader)
    augment: bool = True  # random crop (pad 4) + horizontal flip
    # cifar100: the real set must be under root (a root without it, or with a synthetic one, is an error).
    # synthetic: a synthetic set in CIFAR-100's format, written under root when none is there; said so in
    # the run's first line, summary.json and every figure's title.
    source: str = "cifar100"
    synth_train: int = 5000  # the synthetic set's size (source: synthetic)
    synth_test: int = 1000  # the synthetic test set's size

    def __post_init__(self) -> None:
        _check(0 < self.fraction <= 1, "fraction", "must be in (0, 1]")
        _one_of(self, "loader", ("device", "dataloader"))
        _one_of(self, "source", DATA_SOURCES)
        _non_negative(self, "num_workers")
        _positive(self, "synth_train", "synth_test")
        _check(self.root is None or self.root.strip() != "", "root", "must not be empty (leave it out for the default)")
        _check(self.synth_train >= 100, "synth_train", "must be >= 100 (one image per class)")
        _at_most(self, "synth_train", 1_000_000, "3 GB of images; the real training set has 50,000")
        _at_most(self, "synth_test", 1_000_000, "3 GB of images; the real test set has 10,000")
        _at_most(self, "num_workers", 256, "one process each")

    def resolved_root(self, env: Mapping[str, str] = os.environ) -> Path:
        if self.root:
            return Path(os.path.expandvars(self.root)).expanduser()
        if env.get("HPC_DATA"):
            return Path(env["HPC_DATA"]).expanduser()
        if env.get("SCRATCH"):
            return Path(env["SCRATCH"]) / "cifar100"
        return Path("data")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str = "resnet152"  # resnet18|resnet34|resnet50|resnet101|resnet152 (torchvision's), or tiny (tests)
    # torchvision: 7x7/2 conv + max-pool, the study's model, 32x32 inputs shrink to 8x8 at once.
    # cifar: 3x3/1 conv, no max-pool: far better accuracy on 32x32, ~16x the FLOPs per image.
    stem: str = "torchvision"
    num_classes: int = 100  # the classifier's outputs (CIFAR-100: 100)
    channels_last: str = "auto"  # auto: on CUDA only
    compile: bool = False  # torch.compile the model
    # true: each residual branch's last BatchNorm starts at zero, so every block starts as the identity
    # (Goyal et al. 2017). ResNet152 from scratch then falls in loss from the first steps at lr 0.1
    # (without it, on the CPU, loss rose from 5.7 to 7.3 in 10 steps at lr 0.02); ResNet-18 on the
    # quickstart's 126 steps learns far slower with it (eval top-1 12% against 99.8%). Off by default,
    # as in torchvision and the study.
    zero_init_residual: bool = False

    def __post_init__(self) -> None:
        _check(self.arch in ARCHS, "arch", f"unknown arch; known: {', '.join(ARCHS)}")
        _one_of(self, "stem", ("torchvision", "cifar"))
        _one_of(self, "channels_last", ("auto", "on", "off"))
        _positive(self, "num_classes")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 128  # images per optimizer step, per GPU or global (batch_scope)
    # per_gpu: each rank takes batch_size images a step (the study's scripts: DataLoader per rank);
    # global: batch_size is split across ranks (must divide by world size x grad_accum_steps).
    batch_scope: str = "per_gpu"
    epochs: int = 1  # passes over the (fraction of the) training set
    max_steps: int | None = resumable(None)  # stop after this many optimizer steps in total
    lr: float | None = None  # None: lr_per_256 x global batch / 256 (linear scaling rule)
    lr_per_256: float = 0.1  # the learning rate per 256 images of global batch, when lr is not given
    momentum: float = 0.9  # SGD's momentum
    nesterov: bool = True  # Nesterov momentum
    weight_decay: float = 5e-4  # SGD's L2 weight decay
    warmup_epochs: float = 1.0  # linear learning-rate warm-up, in epochs, before the schedule
    schedule: str = "cosine"  # cosine | multistep | constant
    milestones: tuple[float, ...] = (0.5, 0.75)  # multistep, as fractions of the run
    grad_accum_steps: int = 1  # micro-batches per optimizer step (batch_size split among them)
    amp: str = "auto"  # auto: bf16 autocast on CUDA, off on CPU
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0  # seed for init, data order and augmentation
    # cuDNN/cuBLAS deterministic algorithms (slower): a resumed run ends bit-identical to an
    # uninterrupted one on a GPU too. The CPU path is deterministic without it.
    deterministic: bool = False
    # Capture forward + backward (DDP's all-reduce included) + optimizer step once as a CUDA graph and
    # replay it (hpc/training/graph/cudagraph.py): launch-bound models (ResNet152 on 32x32 images) run several
    # times faster. auto: on where it can run (CUDA, NCCL >= 2.9.6, whole steps, static shapes), else
    # eager with a line saying why; true: on, or stop naming what prevents it; false: eager.
    cuda_graph: bool | str = "auto"
    # Before the first counted step a graphed run checks its graph against an eager step from the same
    # state (hpc/training/graph/graphcheck.py); a check that takes longer than this on any rank is a failed
    # one (auto: every rank runs eager; true: the run stops).
    graph_check_timeout_s: int = resumable(300)
    # cuDNN autotuning (cudnn.benchmark) times every algorithm for each new input shape, seconds per
    # shape for ResNet152's convolutions. step: tune the step's own batch shape only; a smaller last
    # batch and evaluation's batches take cuDNN's heuristics (one epoch meets each once, so tuning them
    # costs more than it saves). all: tune every shape (torch's benchmark mode). off: heuristics only.
    # train.deterministic turns tuning off whatever this says.
    cudnn_autotune: str = "step"
    # Cap this process's share of the GPU's memory (torch.cuda.set_per_process_memory_fraction), e.g.
    # 0.5 on an 80 GB H100 to see where a 40 GB A100 runs out of memory. None: the whole device.
    cuda_memory_fraction: float | None = resumable(None)
    log_every_steps: int = resumable(20)  # a progress line and a metrics.jsonl record every N steps
    eval: bool = resumable(True)  # evaluate on the test set after each epoch
    checkpoint_every_steps: int = resumable(0)  # 0: at epoch ends, at the end and on SIGTERM/SIGUSR2 only
    collective_timeout_s: int = 300  # a dead peer ends the run instead of hanging it
    ddp_bucket_cap_mb: int = 25  # DDP's gradient bucket size, MB (larger: fewer, bigger all-reduces)
    ddp_gradient_as_bucket_view: bool = True  # DDP's gradients as views into its buckets (saves a copy)
    ddp_static_graph: bool = False  # DDP's static_graph: the same parameters take part in every step

    def __post_init__(self) -> None:
        _positive(
            self,
            "batch_size",
            "epochs",
            "max_steps",
            "lr",
            "lr_per_256",
            "grad_accum_steps",
            "log_every_steps",
            "collective_timeout_s",
            "graph_check_timeout_s",
            "ddp_bucket_cap_mb",
        )
        _non_negative(self, "momentum", "weight_decay", "warmup_epochs", "checkpoint_every_steps", "seed")
        _at_most(self, "batch_size", 2**20, "ResNet152 needs 4.6 GiB at 2048; this would need terabytes")
        _at_most(self, "grad_accum_steps", 2**20, "more micro-batches than any batch holds")
        _at_most(self, "seed", 2**32 - 1, "seeds are 32-bit")
        _at_most(self, "collective_timeout_s", 7 * 24 * 3600, "a week")
        _at_most(self, "graph_check_timeout_s", 24 * 3600, "a day")
        _one_of(self, "batch_scope", ("per_gpu", "global"))
        _one_of(self, "schedule", ("cosine", "multistep", "constant"))
        _one_of(self, "amp", ("auto", "bf16", "off"))
        _one_of(self, "device", ("auto", "cpu", "cuda"))
        _one_of(self, "cudnn_autotune", ("step", "all", "off"))
        _check(self.cuda_graph in (True, False, "auto"), "cuda_graph", "must be one of auto, true, false")
        _check(all(0 < m < 1 for m in self.milestones), "milestones", "must lie in (0, 1)")
        _check(
            self.cuda_memory_fraction is None or 0 < self.cuda_memory_fraction <= 1,
            "cuda_memory_fraction",
            "must be in (0, 1]",
        )


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    enabled: bool = resumable(True)  # profile with torch.profiler (a trace per rank per cycle)
    wait: int = resumable(1)  # steps skipped before each profiling cycle (torch.profiler.schedule)
    warmup: int = resumable(1)  # steps traced but thrown away, before the recorded ones
    active: int = resumable(3)  # steps recorded in each cycle's trace
    repeat: int = resumable(1)  # 0: cycle for the whole run
    record_shapes: bool = resumable(False)  # operators' input shapes in the trace
    profile_memory: bool = resumable(True)  # allocations and peak memory in the trace
    with_stack: bool = resumable(False)  # Python stacks in the trace (larger traces)
    # The profiler's own key_averages() totals per cycle in summary.json, to cross-check the trace
    # analysis. Off by default: building them takes seconds per cycle (~8 s for two ResNet152 steps
    # on an H100 host), more than the rest of the profiler's cost over a whole run.
    key_averages: bool = resumable(False)
    # Record the CUDA allocator's history and dump it on an out-of-memory error (hpc/training/oom.py), for
    # PyTorch's memory_viz. Costs a little host time per allocation.
    memory_snapshot: bool = resumable(False)
    # Peak memory by category (parameters, gradients, optimizer state, activations, other) per cycle in
    # summary.json, from torch's memory profiler (hpc/training/memcat.py). It turns on record_shapes,
    # profile_memory and with_stack for the cycle and builds its graph when the cycle ends.
    memory_categories: bool = resumable(False)
    # Detach CUPTI when a cycle ends (kineto's TEARDOWN_CUPTI=1, on CUDA >= 12.6 where PyTorch deems it
    # safe with CUDA graphs). Kineto leaves CUPTI attached by default, and every later kernel launch then
    # still pays for its callbacks: 10-20% slower steps after the window (pytorch/pytorch#144455).
    detach_cupti: bool = resumable(True)
    # Which ranks record traces: all, auto (all up to 16 ranks, beyond: each node's first rank and the two
    # slowest), leaders, or a list such as "0,13" (hpc/settings/profranks.py says why 16).
    ranks: str | int | tuple[int, ...] = resumable("auto")  # kept as text: "auto", "0,13"

    def __post_init__(self) -> None:
        _non_negative(self, "wait", "warmup", "repeat")
        _positive(self, "active")
        listed = self.ranks if isinstance(self.ranks, tuple) else (self.ranks,) if isinstance(self.ranks, int) else None
        if listed is not None:  # `ranks: 13` or `ranks: [0, 13]` in YAML, as the text "0,13"
            object.__setattr__(self, "ranks", ",".join(str(r) for r in listed))
        _check(
            is_setting(str(self.ranks)),
            "ranks",
            f"must be {', '.join(SETTINGS)} or a comma-separated list of ranks (e.g. 0,13)",
        )


# An axis the study's own lists already sweep: named, with the list that does.
STUDY_AXES = {
    "data.fraction": "data_fractions",
    "train.batch_size": "batch_sizes",
    "fraction": "data_fractions",
    "batch": "batch_sizes",
    "gpus": "gpus",
    "nodes": "nodes",
}
AXIS_SECTIONS = ("data", "model", "train", "profiler")  # a swept key's section: the training's run sections


def axis_problem(axis: str, values: tuple[object, ...]) -> str | None:
    """What is wrong with a sweep axis (None: nothing); its key is checked against the sections where it
    is used, its values' types at each point."""
    if axis in STUDY_AXES:
        return f"swept by the study's own list: sweep.{STUDY_AXES[axis]}"
    section, dot, key = axis.partition(".")
    if dot and (section not in AXIS_SECTIONS or not key.isidentifier()):
        return f"a config key is SECTION.KEY with a section of {', '.join(AXIS_SECTIONS)}"
    if not dot and not axis.isidentifier():
        return "a placeholder's name is a word of letters, digits and _ ({lr}), a config key SECTION.KEY"
    if not values:
        return "needs at least one value"
    if not all(isinstance(v, (str, int, float, bool)) for v in values):
        return "each value must be a number, a string or true/false"
    if len({(type(v), v) for v in values}) < len(values):
        return "a value is listed twice (the same point twice)"
    return None


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """The study's grid (seed 003, section 4.2.2): data fraction x batch size x GPU count, and node count."""

    name: str = "study"  # the sweep's name: runs go to RUNS/<name>/sweep-<time>/
    data_fractions: tuple[float, ...] = (1.0, 0.5, 0.1)  # fractions of the training set ({fraction})
    batch_sizes: tuple[int, ...] = (128, 512, 1024, 2048)  # batch sizes per GPU ({batch})
    gpus: tuple[int, ...] = (1, 2, 4)  # per node
    nodes: tuple[int, ...] = (1,)  # multi-node scaling of the same study: e.g. [1, 2, 4]
    # What else researchers sweep, each with its values: a key of the training's config (train.lr,
    # model.arch, train.cuda_graph, data.num_workers, profiler.active) or a placeholder that a command's
    # words use ({lr}, {seed}: `axes: {lr: [0.1, 0.01]}`). Also on the command line: --axis train.lr=0.1,0.01.
    axes: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    combine: str = "grid"  # grid: every combination of the axes; zip: their i-th values together (equal lengths)
    max_points: int = 1000  # a bigger sweep is refused: a mistyped list must not become thousands of jobs
    # The axis whose values are repetitions of the same point (seed): the report folds them into a mean
    # and a spread, and says whether a difference between points is beyond that run-to-run noise.
    replicas: str | None = None
    # The script's own metric the report judges the points by: a name its loggers write (val_loss, eval_loss,
    # epoch/eval_top1). None: the first evaluation's loss or accuracy found, else the first training's.
    metric: str | None = None
    mode: str | None = None  # min or max: which is better; None: min for a loss (or an error), max otherwise

    def __post_init__(self) -> None:
        _one_of(self, "combine", ("grid", "zip"))
        if self.mode is not None:
            _one_of(self, "mode", ("min", "max"))
        _positive(self, "max_points")
        for axis, values in self.axes.items():
            _check(axis_problem(axis, values) is None, "axes", f"{axis}: {axis_problem(axis, values)}")
        _check(self.replicas is None or self.replicas in self.axes, "replicas", "must name one of sweep.axes")
        lengths = {len(v) for v in self.axes.values()}
        _check(self.combine == "grid" or len(lengths) <= 1, "axes", "combine: zip takes lists of one length")
        for key in ("data_fractions", "batch_sizes", "gpus", "nodes"):
            _check(len(getattr(self, key)) > 0, key, "must not be empty")
        _check(all(0 < f <= 1 for f in self.data_fractions), "data_fractions", "each must be in (0, 1]")
        _check(all(b > 0 for b in self.batch_sizes), "batch_sizes", "each must be > 0")
        _check(all(g > 0 for g in self.gpus), "gpus", "each must be > 0")
        _check(all(n > 0 for n in self.nodes), "nodes", "each must be > 0")
        _check(name_problem(self.name) is None, "name", name_problem(self.name) or "")


@dataclasses.dataclass(frozen=True)
class CommandConfig:
    """A sweep of your own command (hpc/settings/rankcommand.py): `run`, the command as given (or the words after
    `--`, which win), then `args` and `env` with each point's values filled in: {batch}, {fraction},
    {gpus}, {nodes}, {ranks}, and {run_dir} (the point's run directory, known when it starts)."""

    run: tuple[str, ...] = ()  # the command, as given (the words after -- win)
    args: tuple[str, ...] = ()  # words after it, each point's values filled in ({batch}, {run_dir}...)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # variables for it, values filled in too
    cwd: str | None = None  # where it starts (default: where it is submitted from)
    # A rank that makes no optimizer step for this long (after its first), or whose process is stopped
    # this long, is named and ends the job (hpc/launch/rank/hang.py), busy or not. None (the default): the
    # run's own bounds: stopped a minute is frozen; silent 10x its longest step gap (60-90 s) and idle (no
    # CPU, no disk) is hung, while a rank busy in an evaluation or a checkpoint never is. The one key of the
    # runner's watch, for the toolkit's training too (train.collective_timeout_s is torch's collectives' own).
    hang_timeout_s: int | None = None
    # Where your script writes its metrics when not under its run directory (a folder or a file, read as the
    # report reads the run directory): the point's values filled ({lr}, {seed}) and {run_dir}; relative to
    # cwd. Not set: the run directory alone ($HPC_RUN_DIR), where the toolkit looks anyway.
    metrics: str | None = None

    def __post_init__(self) -> None:
        _positive(self, "hang_timeout_s")
        _check(self.metrics is None or self.metrics.strip() != "", "metrics", "must not be empty")
        _at_most(self, "hang_timeout_s", 7 * 24 * 3600, "a week")
        for key in self.env:
            _check(key.replace("_", "").isalnum() and not key[0].isdigit(), "env", f"bad variable name {key!r}")


SECTIONS: dict[str, type] = {
    "cluster": ClusterConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "profiler": ProfilerConfig,
    "sweep": SweepConfig,
    "command": CommandConfig,
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What one training run needs; each component gets only its own section."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    profiler: ProfilerConfig = dataclasses.field(default_factory=ProfilerConfig)

    def sections(self) -> dict[str, JsonObject]:
        """Each run section as plain values, by name."""
        return {name: plain(dataclasses.asdict(getattr(self, name))) for name in RUN_SECTIONS}

    def to_dict(self) -> JsonObject:
        out: JsonObject = {}
        out.update(self.sections())
        return out


# The sections one training run reads: RunConfig's fields, in its order.
RUN_SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))
