"""Configuration loading: YAML files and --set values, layered (command line > YAML > defaults),
each value typed and checked against the schema (hpc/settings/schema.py) with its provenance. The
`python -m hpc.config` command that prints them is hpc/launch/configcli.py.

A YAML file holds any of the top-level sections `cluster`, `data`, `model`, `train`, `profiler`,
`sweep`. Every key is checked against its dataclass: an unknown key, a wrong type or an impossible
value raises ConfigError whose message names the key, the value and where it came from (the file,
or the command-line flag). No torch import: the submit CLI loads configs too.
"""

from __future__ import annotations

import dataclasses
import fractions
import logging
import math
import os
import stat
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import msgspec
import yaml

from hpc.core.cli import inspect_path, shown, suggestion
from hpc.core.errors import ConfigError
from hpc.core.files import load_yaml_text
from hpc.settings.schema import (
    RUN_SECTIONS,
    SECTIONS,
    ClusterConfig,
    CommandConfig,
    DataConfig,
    ModelConfig,
    ProfilerConfig,
    RunConfig,
    SweepConfig,
    TrainConfig,
    _Invalid,
)

log = logging.getLogger(__name__)

# Installed: the profiles ship as package data in hpc/profiles/ (pyproject.toml maps profiles/ there);
# from a source tree (or an editable install): the repository's profiles/.
_HPC = Path(__file__).resolve().parent.parent
PROFILES_DIR = next((p for p in (_HPC / "profiles", _HPC.parent / "profiles") if p.is_dir()), _HPC.parent / "profiles")


MAX_CONFIG_BYTES = 2**20  # a config or profile is a few hundred bytes; a larger file is something else
INT64_MAX = 2**63 - 1  # torch seeds, counts and sizes are int64: a larger integer is an input error


# ----------------------------------------------------------------------------------------------
# Typed construction with provenance
# ----------------------------------------------------------------------------------------------


def _expected(tp: object) -> str:
    """What an annotation asks for, in a person's words (the error's "expected ...")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in args if a is not type(None))
    if origin is tuple:
        return f"a list of {args[0].__name__}"
    if origin is dict:
        return "a mapping of names to scalar values"
    # every type the schema's fields use (tests/unit/settings/test_config_messages.py walks them all)
    words: dict[object, str] = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}
    return words[tp]


def _wants(tp: object, kind: type) -> bool:
    return tp is kind or kind in typing.get_args(tp)


def _prepared(value: object, tp: object) -> object:
    """The value as msgspec should see it: a fraction string read as a number where a number is wanted
    ("1/10" reads better than 0.1 for data fractions), a mapping's scalars as the strings it holds."""
    if typing.get_origin(tp) is tuple and isinstance(value, (list, tuple)):
        return [_prepared(v, typing.get_args(tp)[0]) for v in value]
    if typing.get_origin(tp) is dict and isinstance(value, dict):
        scalar = (str, int, float, bool)
        return {
            k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, scalar) else v
            for k, v in value.items()
        }
    if _wants(tp, float) and isinstance(value, str) and len(value) < 64:
        try:
            return float(fractions.Fraction(value.strip()))
        except (ValueError, ZeroDivisionError, OverflowError):
            return value
    return value


def _out_of_range(value: object) -> str | None:
    """What msgspec lets through that a run cannot take: a number torch cannot hold, a NUL in a string."""
    if isinstance(value, (tuple, list)):
        return next((e for e in map(_out_of_range, value) if e), None)
    if isinstance(value, dict):
        return next((e for e in map(_out_of_range, value.values()) if e), None)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return f"an integer within +-{INT64_MAX}"
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if isinstance(value, str) and "\0" in value:
        return "a string without NUL characters"
    return None


def typed_value(value: object, tp: Any) -> object:
    """`value` as the annotation `tp` types it (msgspec.convert, strict: no true for 1, no "3" for 3);
    raise TypeError(what was expected) when it does not fit."""
    try:
        typed = msgspec.convert(_prepared(value, tp), tp)  # strict, msgspec's default
    except msgspec.ValidationError:
        raise TypeError(_expected(tp)) from None
    except UnicodeEncodeError:  # bytes of no encoding, passed on by the shell as surrogates
        raise TypeError(f"{_expected(tp)} of valid UTF-8 text") from None
    if problem := _out_of_range(typed):
        raise TypeError(problem)
    return typed


def build_section(name: str, raw: Mapping[str, object], sources: Mapping[str, str]) -> object:
    """Build section `name` from raw values; `sources[key]` says where each value came from."""
    cls = SECTIONS[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        where = sources.get(key, "defaults")
        if key not in fields:
            hint = suggestion(str(key), fields) or "; python -m hpc.config [--profile P] prints every key"
            raise ConfigError(f"{where}: unknown key {name}.{shown(key)[1:-1]}{hint}")
        try:
            values[key] = typed_value(value, hints[key])
        except TypeError as e:
            raise ConfigError(f"{where}: {name}.{key} = {shown(value)}: expected {e}") from None
    try:
        return cls(**values)
    except _Invalid as e:
        where = sources.get(e.key, "defaults")
        value = raw.get(e.key, getattr(cls, e.key, None))  # as given, not as coerced
        other = f" ({name}.{e.other} from {sources.get(e.other, 'defaults')})" if e.other else ""
        raise ConfigError(f"{where}: {name}.{e.key} = {shown(value)}: {e.reason}{other}") from None


def packaged_profiles() -> list[str]:
    """The cluster profiles shipped (local, perlmutter): the packaged files with a cluster section."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if "\ncluster:" in "\n" + p.read_text())


def resolve_profile_path(name_or_path: str, source: str = "--profile") -> Path:
    """A name is a packaged profile ('perlmutter' -> profiles/perlmutter.yaml, wherever the command runs); a
    file is read only when given as a path (a '/' or a .yaml name: `--profile ./mine.yaml`). A file in the
    current directory named as a packaged profile is not read, and said in one line: on a shared machine a
    file planted where a user submits from would otherwise replace the profile, its setup lines with it."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        return path
    packaged = PROFILES_DIR / f"{name_or_path}.yaml"
    if not packaged.is_file():
        raise ConfigError(
            f"{source} {shown(name_or_path)}: no packaged profile of that name ({', '.join(packaged_profiles())}); "
            f"a file of yours is given as a path, e.g. {source} ./{name_or_path}.yaml"
        )
    here = [name for name in (name_or_path, f"{name_or_path}.yaml") if inspect_path(Path(name), source) is not None]
    if here:
        log.warning(
            f"hpc: ./{here[0]} is not read: {source} {name_or_path} is the packaged profile ({packaged}); "
            f"to use the file, give it as a path: {source} ./{here[0]}"
        )
    return packaged


def read_yaml(path: str | os.PathLike[str], flag: str = "") -> dict[str, dict[str, object]]:
    """Read a profile/config file and check its top level. Raises ConfigError naming the file (after the
    flag that gave it, when one did: `--profile /x: is a directory`)."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    status = inspect_path(path, flag or "config file")
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise ConfigError(f"{where}: is a directory, not a config file")
    if status is not None and not stat.S_ISREG(status.st_mode):  # /dev/zero would be read for ever
        raise ConfigError(f"{where}: not a regular file (a device or a pipe), not a config file")
    try:
        with open(path, "rb") as f:  # a byte past the bound tells a larger file (so would 2: not mutated)
            data = f.read(MAX_CONFIG_BYTES + 1)  # pragma: no mutate
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{where}: more than {MAX_CONFIG_BYTES // 2**20} MiB: not a config file")
        text = data.decode()  # UTF-8, Python's default
    except OSError as e:
        raise ConfigError(f"{where}: cannot read config file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where}: not a text (UTF-8) file: byte {e.start} is {e.object[e.start : e.start + 1]!r}"
        ) from None
    try:
        loaded = load_yaml_text(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a config file") from None
    except ValueError as e:  # e.g. an integer of over 4300 digits
        raise ConfigError(f"{where}: not a usable value ({' '.join(str(e).split())[:120]})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {kind}")
    sections: dict[str, dict[str, object]] = loaded
    for section, body in sections.items():
        if section not in SECTIONS:
            hint = suggestion(str(section), SECTIONS) or f" (known: {', '.join(SECTIONS)})"
            raise ConfigError(f"{path}: unknown section {shown(section)}{hint}")
        if body is None:
            sections[section] = {}
        elif not isinstance(body, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping, got {shown(body)}")
    return sections


class Layers:
    """Raw values per section with where each came from; later layers override earlier ones."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, object]] = {name: {} for name in SECTIONS}
        self.sources: dict[str, dict[str, str]] = {name: {} for name in SECTIONS}

    def add_file(self, path: str | os.PathLike[str], only: tuple[str, ...] | None = None, flag: str = "") -> Layers:
        for section, body in read_yaml(path, flag).items():
            if only is not None and section not in only:
                raise ConfigError(f"{path}: section {section!r} is not used here (expected {', '.join(only)})")
            for key, value in body.items():
                self.set(f"{section}.{key}", value, str(path))
        return self

    def set(self, dotted: str, value: object, source: str) -> Layers:
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise ConfigError(f"{source}: {dotted!r} is not SECTION.KEY (sections: {', '.join(SECTIONS)})")
        self.values[section][key] = value
        self.sources[section][key] = source
        return self

    def said_by(self, dotted: str, config: str | None) -> str:
        """Where the value of `dotted` came from, as a message begins: its `--set ...`, else `--config FILE`."""
        section, _, key = dotted.partition(".")
        source = self.sources.get(section, {}).get(key, "")
        return f"--config {config}" if config and not source.startswith("--set") else source or "--set"

    @overload
    def build(self, section: Literal["cluster"]) -> ClusterConfig: ...
    @overload
    def build(self, section: Literal["data"]) -> DataConfig: ...
    @overload
    def build(self, section: Literal["model"]) -> ModelConfig: ...
    @overload
    def build(self, section: Literal["train"]) -> TrainConfig: ...
    @overload
    def build(self, section: Literal["profiler"]) -> ProfilerConfig: ...
    @overload
    def build(self, section: Literal["sweep"]) -> SweepConfig: ...
    @overload
    def build(self, section: Literal["command"]) -> CommandConfig: ...
    def build(self, section: str) -> object:
        """Section `section` of the layers, typed as its class (SECTIONS)."""
        return build_section(section, self.values[section], self.sources[section])

    def run_config(self) -> RunConfig:
        data, model, train = self.build("data"), self.build("model"), self.build("train")
        return RunConfig(data=data, model=model, train=train, profiler=self.build("profiler"))


def set_source(text: str) -> str:
    """How a --set value is named in messages: the flag and its text, cut."""
    return "--set " + (text if len(text) <= 100 else text[:97] + "...")


def parse_override(text: str, source: str = "--set") -> tuple[str, object]:
    """'train.lr=0.1' -> ('train.lr', 0.1); the value is read as YAML (numbers, booleans, lists)."""
    key, eq, raw = text.partition("=")
    if not eq:
        raise ConfigError(f"{source} {text!r}: expected SECTION.KEY=VALUE")
    try:
        value = load_yaml_text(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError, ValueError):  # ValueError: an integer of over 4300 digits
        value = raw
    return key.strip(), value


def load_run_config(config_path: str | None, overrides: Sequence[tuple[str, object, str]] = ()) -> RunConfig:
    """defaults < YAML file < command line. `overrides`: (dotted key, value, source flag). Only the run
    sections: a cluster or sweep value here would be silently ignored, so it is an error."""
    layers = Layers()
    if config_path:
        layers.add_file(config_path, only=RUN_SECTIONS, flag="--config")
    for dotted, value, source in overrides:
        require_section(dotted, RUN_SECTIONS, source)
        layers.set(dotted, value, source)
    return layers.run_config()


def require_section(dotted: str, allowed: tuple[str, ...], source: str) -> None:
    section = dotted.partition(".")[0]
    if section in SECTIONS and section not in allowed:
        raise ConfigError(f"{source}: section {section!r} is not used here (this command reads {', '.join(allowed)})")


def load_cluster(profile: str, overrides: Sequence[tuple[str, object, str]] = ()) -> ClusterConfig:
    layers = Layers().add_file(resolve_profile_path(profile), only=("cluster",), flag="--profile")
    for dotted, value, source in overrides:
        layers.set(dotted, value, source)
    cluster: ClusterConfig = layers.build("cluster")
    return cluster


def run_config_from_dict(data: Mapping[str, object], source: str) -> RunConfig:
    """Rebuild a RunConfig from a saved config.yaml (or any mapping of run sections)."""
    layers = Layers()
    for section, body in data.items():
        if section not in RUN_SECTIONS:
            continue
        if body is not None and not isinstance(body, Mapping):
            raise ConfigError(f"{source}: section {section!r} must be a mapping, got {shown(body)}")
        for key, value in (body or {}).items():
            layers.set(f"{section}.{key}", value, source)
    return layers.run_config()


def check_request(
    cluster: ClusterConfig, nodes: int, gpus: int, time_limit_min: int | None, source: str = "command line"
) -> None:
    """A job shape the cluster can run, or ConfigError naming the bad value."""
    if nodes < 1:
        raise ConfigError(f"{source}: --nodes {nodes}: must be >= 1")
    if nodes > cluster.max_nodes:
        raise ConfigError(f"{source}: --nodes {nodes}: profile {cluster.name!r} allows at most {cluster.max_nodes}")
    if gpus < 1:
        raise ConfigError(f"{source}: --gpus {gpus}: must be >= 1")
    if gpus > cluster.gpus_per_node:
        per_node = cluster.gpus_per_node
        way = "--gpus counts GPUs per node here (as --gpus-per-node)"
        if gpus % nodes == 0 and gpus <= per_node * nodes:  # the GPUs spread evenly over the nodes fit
            way += (
                f"; {gpus} GPUs over {nodes} nodes, as sbatch's --gpus counts them, is --gpus-per-node {gpus // nodes}"
            )
        else:
            way += f"; more GPUs: --nodes {math.ceil(gpus / per_node)} --gpus-per-node {per_node}"
        raise ConfigError(f"{source}: --gpus {gpus}: profile {cluster.name!r} has {per_node} GPUs per node; {way}")
    if time_limit_min is not None:
        if time_limit_min < 1:
            raise ConfigError(f"{source}: --time {time_limit_min}: must be >= 1 minute")
        if cluster.max_time_limit_min is not None and time_limit_min > cluster.max_time_limit_min:
            raise ConfigError(
                f"{source}: --time {time_limit_min}: profile {cluster.name!r} allows at most "
                f"{cluster.max_time_limit_min} min"
            )
        if cluster.signal_delay_s >= time_limit_min * 60:
            raise ConfigError(
                f"{source}: --time {time_limit_min}: must exceed the {cluster.signal_delay_s} s warning signal"
            )
