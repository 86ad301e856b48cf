"""What a submission's points run, as data: the sweep's grid (one loop, the study's and a command's), and
each point's task (hpc/settings/rankcommand.py): the toolkit's training on the point's run config, or a user's
command (`hpc.submit [job options] -- COMMAND [ARG ...]`, or a sweep's `command` section) with the
point's values filled in. Nothing written; no torch import.

A command takes the job options, the profiler's section (--config FILE, --set profiler.KEY=VALUE,
--no-profile) and, for a sweep, the grid and a `command` section (run, args, env); the flags of the
toolkit's own training (--batch-size, --arch...) are refused: a command takes its own arguments after
`--`. The training takes its run sections (--config, --sweep, the training flags).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from hpc.core.ending import RankCommand
from hpc.core.errors import UsageError
from hpc.core.rundir import AxisValue, SweepPoint
from hpc.launch.submission.request import SubmitRequest
from hpc.settings.config import Layers, parse_override, read_yaml
from hpc.settings.rankcommand import (
    BATCH_VARIABLE,
    check_command,
    fill,
    fill_named,
    job_name,
    metrics_template,
    point_values,
    training_command,
    user_command,
)
from hpc.settings.schema import ClusterConfig, CommandConfig, SweepConfig

COMMAND_SECTIONS = ("profiler", "command")  # what --config, --sweep and --set may hold for a command
AXES = {"data_fractions": "fraction", "batch_sizes": "batch"}  # the axes a command's words must use


@dataclasses.dataclass(frozen=True)
class Points:
    """What every point of a command line runs: each point's task (None: a single job), the name a job
    takes by default, the grid (None: a single job), and the sections sweep.yaml records."""

    task_for: Callable[[SweepPoint | None], RankCommand]
    name: str
    sweep: SweepConfig | None
    sections: Mapping[str, object]


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the toolkit's own arguments, the command after the first `--`, or None when there is none)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def is_command_sweep(path: str | None) -> bool:
    """Whether a sweep file runs a command (it has a command section)."""
    return bool(path) and "command" in read_yaml(str(path), "--sweep")


def axis_values(sweep: SweepConfig) -> list[dict[str, AxisValue]]:
    """The sweep's own axes' values at each point (one empty mapping without any): their grid, or zipped."""
    names = list(sweep.axes)
    values = list(sweep.axes.values())
    if not names:  # no axes of its own: one point per shape, whether zipped or not (zip() of nothing is empty)
        return [{}]
    # strict: equal lengths, which SweepConfig checked for zip (so strict=False is the same: not mutated)
    rows = zip(*values, strict=True) if sweep.combine == "zip" else itertools.product(*values)  # pragma: no mutate
    return [dict(zip(names, row, strict=True)) for row in rows]  # pragma: no mutate


def grid_points(sweep: SweepConfig, source: str = "sweep") -> list[SweepPoint]:
    """Every (data fraction, batch size, GPUs per node, nodes) point of the grid, with the values of the
    sweep's other axes (`values`) where it has any; more than sweep.max_points is refused, in one line."""
    study = len(sweep.nodes) * len(sweep.gpus) * len(sweep.data_fractions) * len(sweep.batch_sizes)
    others = axis_values(sweep)
    if study * len(others) > sweep.max_points:
        raise UsageError(
            f"{source}: {study * len(others)} points ({study} of the study's lists x {len(others)} of sweep.axes) "
            f"is more than sweep.max_points = {sweep.max_points}; set sweep.max_points to submit them"
        )
    return [
        SweepPoint(data_fraction=fraction, batch_size=batch, gpus=gpus, nodes=nodes, values=v or None)
        for nodes in sweep.nodes
        for gpus in sweep.gpus
        for fraction in sweep.data_fractions
        for batch in sweep.batch_sizes
        for v in others
    ]


def parse_axis(text: str) -> tuple[str, list[object]]:
    """--axis KEY=V1,V2,...: the axis and its values, each read as YAML reads a scalar (0.1, true, resnet18)."""
    name, eq, raw = text.partition("=")
    if not eq or not name.strip() or not raw.strip():
        raise UsageError(f"--axis {text!r}: expected KEY=V1,V2 (e.g. --axis train.lr=0.1,0.01 or --axis seed=1,2,3)")
    return name.strip(), [parse_override(f"v={word}")[1] for word in raw.split(",")]


def layers_for(request: SubmitRequest, sections: tuple[str, ...] | None) -> Layers:
    """The sections a task takes (None: any; and the sweep's) from --config, --sweep and the flags."""
    layers = Layers()
    if request.config:
        layers.add_file(request.config, only=sections, flag="--config")
    if request.sweep:
        layers.add_file(request.sweep, only=(*sections, "sweep") if sections else None, flag="--sweep")
    for dotted, value, source in request.overrides:
        if not dotted.startswith("cluster."):  # the cluster profile takes those
            layers.set(dotted, value, source)
    for text in request.axes:  # hpc.study run's: over the sweep file's own axes
        name, values = parse_axis(text)
        earlier = layers.values["sweep"].get("axes")
        axes = {**(earlier if isinstance(earlier, dict) else {}), name: values}
        layers.set("sweep.axes", axes, f"--axis {text}")
    if sections == COMMAND_SECTIONS and request.no_profile:
        layers.set("profiler.enabled", False, "--no-profile")
    return layers


def training_points(request: SubmitRequest, cluster: ClusterConfig) -> Points:
    """The toolkit's training at every point: the run config with the point's data fraction and batch."""
    layers = layers_for(request, None)
    base = layers.run_config()  # validates the run config before anything is submitted
    watch: CommandConfig = layers.build("command")  # the training's task reads its hang bound only
    others = {
        k for k, v in dataclasses.asdict(watch).items() if k != "hang_timeout_s" and v != CommandConfig().__dict__[k]
    }
    if others:
        raise UsageError(
            f"command.{sorted(others)[0]}: a key of a user's command; the toolkit's training takes only "
            "command.hang_timeout_s of that section"
        )
    hang_timeout_s = watch.hang_timeout_s
    sweep = layers.build("sweep") if request.sweep else None
    named = [axis for axis in (sweep.axes if sweep else ()) if "." not in axis]
    if named:
        raise UsageError(
            f"{request.sweep}: sweep.axes.{named[0]}: a placeholder fills a command's words; the toolkit's training "
            f"sweeps its config keys (e.g. train.lr, train.seed, model.arch)"
        )
    cwd = os.getcwd()

    def task_for(point: SweepPoint | None) -> RankCommand:
        cfg = base
        if point is not None:
            layers.set("data.fraction", point.data_fraction, f"sweep point fraction={point.data_fraction:g}")
            layers.set("train.batch_size", point.batch_size, f"sweep point batch={point.batch_size}")
            for key, value in (point.values or {}).items():
                layers.set(key, value, f"sweep point {key}={value}")
            cfg = layers.run_config()
        return training_command(cfg.to_dict(), cwd, base.model.arch, cluster.stop_grace_s, point, hang_timeout_s)

    return Points(task_for, sweep.name if sweep else base.model.arch, sweep, base.to_dict())


def refuse_training_flags(request: SubmitRequest) -> None:
    """The toolkit's own training's flags mean nothing to a command: one line naming the first given."""
    if request.training_flags:
        flag = "--" + request.training_flags[0].replace("_", "-")
        raise UsageError(
            f"command line: {flag}: a flag of the toolkit's own training (hpc.train); your command takes its own "
            "arguments after --"
        )


def command_points(request: SubmitRequest, cluster: ClusterConfig, words: list[str] | None) -> Points:
    """A user's command at every point: its words verbatim, the section's args and env filled."""
    layers = layers_for(request, COMMAND_SECTIONS)
    profiler = layers.build("profiler")
    section: CommandConfig = layers.build("command")
    argv = list(words) if words else list(section.run)
    if not argv:
        where = f"; or command.run in {request.sweep}" if request.sweep else ""
        raise UsageError(f"command line: no command: give it after -- (e.g. -- python train.py){where}")
    cwd = Path(section.cwd or Path.cwd()).absolute()
    check_command(argv, cwd, in_image=bool(cluster.image))
    sections = {
        "command": {**dataclasses.asdict(section), "run": argv, "cwd": str(cwd)},
        "profiler": dataclasses.asdict(profiler),
    }
    sweep = grid_for(layers, section, argv, request.sweep) if request.sweep else None
    if sweep is None:
        check_unfilled(section, layers, request.config)

    def task_for(point: SweepPoint | None) -> RankCommand:
        values = point_values(point) if point is not None else {}
        source = f"sweep point {values}" if point is not None else "command"
        for key, value in (point.values if point is not None and point.values else {}).items():
            if "." in key:  # profiler.KEY: what the hook records at this point
                layers.set(key, value, f"sweep point {key}={value}")
        hook = dataclasses.asdict(layers.build("profiler"))  # enabled false: the hook counts and watches only
        words = [fill_named(word, values, f"{source}: the command") for word in argv] if point else argv
        filled = tuple(fill(word, values, f"{source}: command.args", final=False) for word in section.args)
        env = {k: fill(v, values, f"{source}: command.env.{k}", final=False) for k, v in section.env.items()}
        if point is not None and "{batch" in " ".join((*argv, *section.args, *section.env.values())):
            env[BATCH_VARIABLE] = str(point.batch_size)  # the batch an out-of-memory record names
        metrics = metrics_template(section.metrics, values, f"{source}: command.metrics")
        return user_command(
            words, str(cwd), hook, cluster.stop_grace_s, filled, env, point, section.hang_timeout_s, metrics
        )

    return Points(task_for, sweep.name if sweep else job_name(argv), sweep, sections)


def check_unfilled(section: CommandConfig, layers: Layers, config: str | None) -> None:
    """A point's field in a single job's words has no value: say so before anything runs, naming where the
    words came from (--config FILE, or their --set)."""
    for key, words in (("args", section.args), ("env", tuple(section.env.values()))):
        for word in words:
            fill(word, {}, f"{layers.said_by(f'command.{key}', config)}: command", final=False)
    metrics_template(section.metrics, {}, f"{layers.said_by('command.metrics', config)}: command.metrics")


def grid_for(layers: Layers, section: CommandConfig, argv: list[str], source: str) -> SweepConfig:
    """The sweep's grid for a command: an axis of the study's grid whose field ({fraction}, {batch})
    the command's words never use is one point, not several copies of the same run; one given with
    several values in the sweep file but never used is an error naming it, as is a placeholder axis the
    words never use or a config key outside the profiler's section (a command reads no run config)."""
    sweep: SweepConfig = layers.build("sweep")
    used = " ".join((*argv, *section.args, *section.env.values()))
    for axis in sweep.axes:
        if "." in axis and not axis.startswith("profiler."):
            key = axis.rpartition(".")[2]
            raise UsageError(
                f"{source}: sweep.axes.{axis}: a command reads no run config; sweep its own arguments with a "
                f"placeholder (axes: {{{key}: [...]}} and --{key} {{{key}}} in its words), or a profiler key"
            )
        if "." not in axis and not re.search(r"\{" + re.escape(axis) + r"[:}]", used):
            raise UsageError(
                f"{source}: sweep.axes.{axis}: the command never uses {{{axis}}}: every point would run the same "
                "command"
            )
    one: set[str] = set()  # the axes cut to their first value
    for axis, field in AXES.items():
        if "{" + field in used or len(getattr(sweep, axis)) == 1:
            continue
        if axis in layers.values["sweep"]:
            raise UsageError(
                f"{source}: sweep.{axis} has {len(getattr(sweep, axis))} values but the command never uses "
                f"{{{field}}}: every point would run the same command"
            )
        one.add(axis)
    fractions, batches = sweep.data_fractions, sweep.batch_sizes
    return dataclasses.replace(
        sweep,
        data_fractions=fractions[:1] if "data_fractions" in one else fractions,
        batch_sizes=batches[:1] if "batch_sizes" in one else batches,
    )
