"""Configuration: one frozen dataclass per section, loaded from YAML, command line > YAML > defaults.

A YAML file holds any of the top-level sections `cluster`, `data`, `model`, `train`, `profiler`,
`sweep`. Every key is checked against its dataclass: an unknown key, a wrong type or an impossible
value raises ConfigError whose message names the key, the value and where it came from (the file,
or the command-line flag). No torch import: the submit CLI loads configs too.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from hpc.cli import shown

ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "tiny")
# Installed: the profiles ship as package data in hpc/profiles/ (pyproject.toml maps profiles/ there);
# from a source tree (or an editable install): the repository's profiles/.
PROFILES_DIR = next((p for p in (Path(__file__).resolve().parent / "profiles",
                                 Path(__file__).resolve().parent.parent / "profiles") if p.is_dir()),
                    Path(__file__).resolve().parent.parent / "profiles")


INT64_MAX = 2**63 - 1  # torch seeds, counts and sizes are int64: a larger integer is an input error


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no tags, no code) that also refuses a key given twice in one mapping, where
    safe_load keeps the last one silently."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str):
    """Parse YAML safely and strictly (see _StrictLoader). Raises yaml.YAMLError."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: as safe as yaml.safe_load


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message shown to the user."""


class _Invalid(ValueError):
    """Raised by __post_init__ checks; the loader adds the source and turns it into ConfigError."""

    def __init__(self, key: str, reason: str):
        super().__init__(reason)
        self.key = key
        self.reason = reason


def _check(ok: bool, key: str, reason: str) -> None:
    if not ok:
        raise _Invalid(key, reason)


def _positive(obj: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        _check(value is None or value > 0, key, "must be > 0")


def _non_negative(obj: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        _check(value is None or value >= 0, key, "must be >= 0")


def _at_most(obj: Any, key: str, limit: int, why: str) -> None:
    value = getattr(obj, key)
    _check(value is None or value <= limit, key, f"must be <= {limit} ({why})")


def _one_of(obj: Any, key: str, choices: tuple) -> None:
    _check(getattr(obj, key) in choices, key, f"must be one of {', '.join(map(str, choices))}")


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where jobs run. `scheduler: local` runs on this machine (submitit's local executor)."""

    name: str = "local"
    scheduler: str = "local"  # slurm | local
    gpus_per_node: int = 2  # on a CPU-only machine: ranks per node
    max_nodes: int = 1
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    constraint: Optional[str] = None  # Slurm -C
    qos: Optional[str] = None  # Slurm -q
    account: Optional[str] = None  # Slurm -A
    partition: Optional[str] = None
    time_limit_min: int = 30
    max_time_limit_min: Optional[int] = None
    setup: tuple[str, ...] = ()  # shell lines run before the job (module load ...)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    signal_delay_s: int = 120  # USR2 this long before the time limit
    max_requeues: int = 3

    def __post_init__(self) -> None:
        _one_of(self, "scheduler", ("slurm", "local"))
        _positive(self, "gpus_per_node", "max_nodes", "cpus_per_task", "mem_gb", "time_limit_min",
                  "max_time_limit_min")
        _non_negative(self, "signal_delay_s", "max_requeues")
        if self.max_time_limit_min is not None:
            _check(self.time_limit_min <= self.max_time_limit_min, "time_limit_min",
                   f"exceeds max_time_limit_min={self.max_time_limit_min}")
        _check(self.signal_delay_s < self.time_limit_min * 60, "signal_delay_s",
               f"must be shorter than the time limit ({self.time_limit_min} min)")
        for key in self.env:
            _check(key.replace("_", "").isalnum() and not key[0].isdigit(), "env", f"bad variable name {key!r}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    root: Optional[str] = None  # None: $HPC_DATA, else $SCRATCH/cifar100 (Perlmutter), else ./data
    fraction: float = 1.0  # study: 1, 1/2, 1/10 (class-balanced, the same on every rank)
    loader: str = "device"  # device: whole uint8 set on the device | dataloader: workers + pinned memory
    num_workers: int = 2
    pin_memory: bool = True
    augment: bool = True  # random crop (pad 4) + horizontal flip
    synthesize_if_missing: bool = False  # write a synthetic CIFAR-100-format set when none is found
    synth_train: int = 5000
    synth_test: int = 1000

    def __post_init__(self) -> None:
        _check(0 < self.fraction <= 1, "fraction", "must be in (0, 1]")
        _one_of(self, "loader", ("device", "dataloader"))
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
    arch: str = "resnet152"
    # torchvision: 7x7/2 conv + max-pool, the study's model, 32x32 inputs shrink to 8x8 at once.
    # cifar: 3x3/1 conv, no max-pool: far better accuracy on 32x32, ~16x the FLOPs per image.
    stem: str = "torchvision"
    num_classes: int = 100
    channels_last: str = "auto"  # auto: on CUDA only
    compile: bool = False
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
    batch_size: int = 128
    # per_gpu: each rank takes batch_size images a step (the study's scripts: DataLoader per rank);
    # global: batch_size is split across ranks (must divide by world size x grad_accum_steps).
    batch_scope: str = "per_gpu"
    epochs: int = 1
    max_steps: Optional[int] = None  # stop after this many optimizer steps in total
    lr: Optional[float] = None  # None: lr_per_256 x global batch / 256 (linear scaling rule)
    lr_per_256: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0
    schedule: str = "cosine"  # cosine | multistep | constant
    milestones: tuple[float, ...] = (0.5, 0.75)  # multistep, as fractions of the run
    grad_accum_steps: int = 1
    amp: str = "auto"  # auto: bf16 autocast on CUDA, off on CPU
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    # cuDNN/cuBLAS deterministic algorithms (slower): a resumed run ends bit-identical to an
    # uninterrupted one on a GPU too. The CPU path is deterministic without it.
    deterministic: bool = False
    # One process on a GPU: capture forward + backward + optimizer step as a CUDA graph and replay it
    # (hpc/cudagraph.py). For launch-bound models (ResNet152 on 32x32 images) this is several times faster.
    cuda_graph: bool = False
    # Cap this process's share of the GPU's memory (torch.cuda.set_per_process_memory_fraction), e.g.
    # 0.5 on an 80 GB H100 to see where a 40 GB A100 runs out of memory. None: the whole device.
    cuda_memory_fraction: Optional[float] = None
    log_every_steps: int = 20
    eval: bool = True
    checkpoint_every_steps: int = 0  # 0: at epoch ends, at the end and on SIGTERM/SIGUSR2 only
    collective_timeout_s: int = 300  # a dead peer ends the run instead of hanging it
    ddp_bucket_cap_mb: int = 25
    ddp_gradient_as_bucket_view: bool = True
    ddp_static_graph: bool = False

    def __post_init__(self) -> None:
        _positive(self, "batch_size", "epochs", "max_steps", "lr", "lr_per_256", "grad_accum_steps",
                  "log_every_steps", "collective_timeout_s", "ddp_bucket_cap_mb")
        _non_negative(self, "momentum", "weight_decay", "warmup_epochs", "checkpoint_every_steps", "seed")
        _at_most(self, "batch_size", 2**20, "ResNet152 needs 4.6 GiB at 2048; this would need terabytes")
        _at_most(self, "grad_accum_steps", 2**20, "more micro-batches than any batch holds")
        _at_most(self, "seed", 2**32 - 1, "seeds are 32-bit")
        _at_most(self, "collective_timeout_s", 7 * 24 * 3600, "a week")
        _one_of(self, "batch_scope", ("per_gpu", "global"))
        _one_of(self, "schedule", ("cosine", "multistep", "constant"))
        _one_of(self, "amp", ("auto", "bf16", "off"))
        _one_of(self, "device", ("auto", "cpu", "cuda"))
        _check(all(0 < m < 1 for m in self.milestones), "milestones", "must lie in (0, 1)")
        _check(self.cuda_memory_fraction is None or 0 < self.cuda_memory_fraction <= 1, "cuda_memory_fraction",
               "must be in (0, 1]")


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    enabled: bool = True
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1  # 0: cycle for the whole run
    record_shapes: bool = False
    profile_memory: bool = True
    with_stack: bool = False
    # The profiler's own key_averages() totals per cycle in summary.json, to cross-check the trace
    # analysis. Off by default: building them takes seconds per cycle (~8 s for two ResNet152 steps
    # on an H100 host), more than the rest of the profiler's cost over a whole run.
    key_averages: bool = False
    # Record the CUDA allocator's history and dump it on an out-of-memory error (hpc/oom.py), for
    # PyTorch's memory_viz. Costs a little host time per allocation.
    memory_snapshot: bool = False

    def __post_init__(self) -> None:
        _non_negative(self, "wait", "warmup", "repeat")
        _positive(self, "active")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """The study's grid (seed 003, section 4.2.2): data fraction x batch size x GPU count."""

    name: str = "study"
    data_fractions: tuple[float, ...] = (1.0, 0.5, 0.1)
    batch_sizes: tuple[int, ...] = (128, 512, 1024, 2048)
    gpus: tuple[int, ...] = (1, 2, 4)
    nodes: int = 1

    def __post_init__(self) -> None:
        for key in ("data_fractions", "batch_sizes", "gpus"):
            _check(len(getattr(self, key)) > 0, key, "must not be empty")
        _check(all(0 < f <= 1 for f in self.data_fractions), "data_fractions", "each must be in (0, 1]")
        _check(all(b > 0 for b in self.batch_sizes), "batch_sizes", "each must be > 0")
        _check(all(g > 0 for g in self.gpus), "gpus", "each must be > 0")
        _check(bool(self.name) and "/" not in self.name and self.name not in (".", "..")
               and not self.name.startswith("-") and self.name.isprintable() and len(self.name.encode()) <= 200,
               "name", "names a directory and jobs: non-empty, printable, no '/', not '.' or '..', at most 200 bytes")
        _positive(self, "nodes")


SECTIONS: dict[str, type] = {
    "cluster": ClusterConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "profiler": ProfilerConfig,
    "sweep": SweepConfig,
}
RUN_SECTIONS = ("data", "model", "train", "profiler")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What one training run needs; each component gets only its own section."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    profiler: ProfilerConfig = dataclasses.field(default_factory=ProfilerConfig)

    def to_dict(self) -> dict[str, Any]:
        return {name: _plain(dataclasses.asdict(getattr(self, name))) for name in RUN_SECTIONS}


def _plain(value: Any) -> Any:
    """Tuples to lists, for YAML/JSON output."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------------------------
# Typed construction with provenance
# ----------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _number(value: Any) -> float | None:
    """An int, a float or a fraction string ("1/10" reads better than 0.1 for data fractions)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) < 64:
        try:
            return float(fractions.Fraction(value.strip()))
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
    return None


def _coerce(value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; raise TypeError(expected) when it does not fit."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0])
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError("a boolean (true/false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT64_MAX:
            return value
        raise TypeError("an integer" if not isinstance(value, int) or isinstance(value, bool)
                        else f"an integer within +-{INT64_MAX}")
    if tp is float:
        number = _number(value)
        if number is None:
            raise TypeError("a number")
        if not math.isfinite(number):
            raise TypeError("a finite number")
        return number
    if tp is str:
        if isinstance(value, str) and "\0" not in value:
            return value
        raise TypeError("a string" if not isinstance(value, str) else "a string without NUL characters")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"a list of {_type_name(args[0])}")
        return tuple(_coerce(v, args[0]) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError("a mapping of strings")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None:
                raise TypeError("a mapping of names to scalar values")
            out[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
        return out
    raise TypeError(_type_name(tp))  # pragma: no cover - every annotation above is handled


def build_section(name: str, raw: Mapping[str, Any], sources: Mapping[str, str]) -> Any:
    """Build section `name` from raw values; `sources[key]` says where each value came from."""
    cls = SECTIONS[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        where = sources.get(key, "defaults")
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {name}.{shown(key)[1:-1]} (known: {', '.join(sorted(fields))})")
        try:
            values[key] = _coerce(value, hints[key])
        except TypeError as e:
            raise ConfigError(f"{where}: {name}.{key} = {shown(value)}: expected {e}") from None
    try:
        return cls(**values)
    except _Invalid as e:
        where = sources.get(e.key, "defaults")
        value = raw.get(e.key, getattr(cls, e.key, None))  # as given, not as coerced
        raise ConfigError(f"{where}: {name}.{e.key} = {shown(value)}: {e.reason}") from None


def resolve_profile_path(name_or_path: str) -> Path:
    """'perlmutter' -> profiles/perlmutter.yaml; a path is taken as it is."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists() or os.sep in name_or_path:
        return path
    return PROFILES_DIR / f"{name_or_path}.yaml"


def read_yaml(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Read a profile/config file and check its top level. Raises ConfigError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text (UTF-8) file: byte {e.start} is {e.object[e.start:e.start + 1]!r}") from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config file") from None
    except ValueError as e:  # e.g. an integer of over 4300 digits
        raise ConfigError(f"{path}: not a usable value ({' '.join(str(e).split())[:120]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(data).__name__}")
    for section, body in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section {shown(section)} (known: {', '.join(SECTIONS)})")
        if body is None:
            data[section] = {}
        elif not isinstance(body, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping, got {shown(body)}")
    return data


class Layers:
    """Raw values per section with where each came from; later layers override earlier ones."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        self.sources: dict[str, dict[str, str]] = {name: {} for name in SECTIONS}

    def add_file(self, path: str | os.PathLike, only: tuple[str, ...] | None = None) -> "Layers":
        for section, body in read_yaml(path).items():
            if only is not None and section not in only:
                raise ConfigError(f"{path}: section {section!r} is not used here (expected {', '.join(only)})")
            for key, value in body.items():
                self.set(f"{section}.{key}", value, str(path))
        return self

    def set(self, dotted: str, value: Any, source: str) -> "Layers":
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise ConfigError(f"{source}: {dotted!r} is not SECTION.KEY (sections: {', '.join(SECTIONS)})")
        self.values[section][key] = value
        self.sources[section][key] = source
        return self

    def build(self, section: str) -> Any:
        return build_section(section, self.values[section], self.sources[section])

    def run_config(self) -> RunConfig:
        return RunConfig(**{name: self.build(name) for name in RUN_SECTIONS})


def set_source(text: str) -> str:
    """How a --set value is named in messages: the flag and its text, cut."""
    return "--set " + (text if len(text) <= 100 else text[:97] + "...")


def parse_override(text: str, source: str = "--set") -> tuple[str, Any]:
    """'train.lr=0.1' -> ('train.lr', 0.1); the value is read as YAML (numbers, booleans, lists)."""
    key, eq, raw = text.partition("=")
    if not eq:
        raise ConfigError(f"{source} {text!r}: expected SECTION.KEY=VALUE")
    try:
        value = load_yaml_text(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError, ValueError):  # ValueError: an integer of over 4300 digits
        value = raw
    return key.strip(), value


def load_run_config(config_path: str | None, overrides: list[tuple[str, Any, str]] = ()) -> RunConfig:
    """defaults < YAML file < command line. `overrides`: (dotted key, value, source flag). Only the run
    sections: a cluster or sweep value here would be silently ignored, so it is an error."""
    layers = Layers()
    if config_path:
        layers.add_file(config_path, only=RUN_SECTIONS)
    for dotted, value, source in overrides:
        require_section(dotted, RUN_SECTIONS, source)
        layers.set(dotted, value, source)
    return layers.run_config()


def require_section(dotted: str, allowed: tuple[str, ...], source: str) -> None:
    section = dotted.partition(".")[0]
    if section in SECTIONS and section not in allowed:
        raise ConfigError(f"{source}: section {section!r} is not used here (this command reads "
                          f"{', '.join(allowed)})")


def load_cluster(profile: str, overrides: list[tuple[str, Any, str]] = ()) -> ClusterConfig:
    layers = Layers().add_file(resolve_profile_path(profile), only=("cluster",))
    for dotted, value, source in overrides:
        layers.set(dotted, value, source)
    return layers.build("cluster")


def run_config_from_dict(data: Mapping[str, Any], source: str) -> RunConfig:
    """Rebuild a RunConfig from a saved config.yaml (or any mapping of run sections)."""
    layers = Layers()
    for section, body in data.items():
        if section not in RUN_SECTIONS:
            continue
        for key, value in (body or {}).items():
            layers.set(f"{section}.{key}", value, source)
    return layers.run_config()


def check_request(cluster: ClusterConfig, nodes: int, gpus: int, time_limit_min: int | None,
                  source: str = "command line") -> None:
    """A job shape the cluster can run, or ConfigError naming the bad value."""
    if nodes < 1:
        raise ConfigError(f"{source}: --nodes {nodes}: must be >= 1")
    if nodes > cluster.max_nodes:
        raise ConfigError(f"{source}: --nodes {nodes}: profile {cluster.name!r} allows at most {cluster.max_nodes}")
    if gpus < 1:
        raise ConfigError(f"{source}: --gpus {gpus}: must be >= 1")
    if gpus > cluster.gpus_per_node:
        raise ConfigError(f"{source}: --gpus {gpus}: profile {cluster.name!r} has {cluster.gpus_per_node} GPUs per node")
    if time_limit_min is not None:
        if time_limit_min < 1:
            raise ConfigError(f"{source}: --time {time_limit_min}: must be >= 1 minute")
        if cluster.max_time_limit_min is not None and time_limit_min > cluster.max_time_limit_min:
            raise ConfigError(f"{source}: --time {time_limit_min}: profile {cluster.name!r} allows at most "
                              f"{cluster.max_time_limit_min} min")
        if cluster.signal_delay_s >= time_limit_min * 60:
            raise ConfigError(f"{source}: --time {time_limit_min}: must exceed the {cluster.signal_delay_s} s "
                              "warning signal")


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=None)


def write_atomic(path: str | os.PathLike, text: str | bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    from hpc.cli import Parser

    parser = Parser(
        prog="python -m hpc.config",
        description="Check config files and print the resolved configuration (defaults < YAML < --set).",
    )
    parser.add_argument("--config", help="run config YAML (data/model/train/profiler sections)")
    parser.add_argument("--profile", help="cluster profile: a name in profiles/ or a YAML path")
    parser.add_argument("--sweep", help="sweep YAML (a sweep section plus run sections)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one value (repeatable)")
    parser.add_argument("--exports", action="store_true",
                        help="with --profile: print the profile's environment as shell lines that keep any value "
                             "already set (for sbatch scripts: eval \"$(python -m hpc.config --profile P --exports)\")")
    args = parser.parse_args(argv)
    if args.exports:
        if not args.profile:
            raise ConfigError("command line: --exports needs --profile")
        import shlex

        cluster = load_cluster(args.profile)
        for key, value in cluster.env.items():
            print(f'[ -n "${{{key}+x}}" ] || export {key}={shlex.quote(value)}')
        return 0
    overrides = [(*parse_override(s), set_source(s)) for s in args.set]
    for dotted, _, source in overrides:
        require_section(dotted, RUN_SECTIONS + (("cluster",) if args.profile else ()) + (("sweep",) if args.sweep else ()),
                        source)
    out: dict[str, Any] = {}
    if args.profile:
        out["cluster"] = dataclasses.asdict(load_cluster(args.profile, [o for o in overrides if o[0].startswith("cluster.")]))
    run_overrides = [o for o in overrides if not o[0].startswith(("cluster.", "sweep."))]
    if args.sweep:
        layers = Layers().add_file(args.sweep)
        for dotted, value, source in overrides:
            if not dotted.startswith("cluster."):
                layers.set(dotted, value, source)
        out["sweep"] = dataclasses.asdict(layers.build("sweep"))
        out.update(layers.run_config().to_dict())
    else:
        out.update(load_run_config(args.config, run_overrides).to_dict())
    print(dump_yaml(out), end="")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.config`, or its console script): errors as one line, exit 2."""
    from hpc.cli import run

    return run("hpc.config", main, argv)


if __name__ == "__main__":
    import sys

    from hpc import config  # the imported module, so its error classes are the ones hpc.cli catches

    sys.exit(config.cli())
