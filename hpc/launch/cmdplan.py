"""What `hpc.submit [job options] -- COMMAND [ARG ...]` (and a sweep of a command, `hpc.study run
SWEEP.yaml -- COMMAND`) asks for, as a pure plan, like hpc/launch/plan.py's for the toolkit's own
training: the command checked where it can be (here, or on the login node), each job shape and sweep
point validated, each point's command filled (hpc/spec/command.py), nothing written. No torch import.

A command takes the job options (nodes, GPUs, time, account, profile, ...), the profiler's section
(--config FILE, --set profiler.KEY=VALUE, --no-profile), and, for a sweep, the sweep's grid and a
`command` section (run, args, env). The flags of the toolkit's own training (--batch-size, --arch...)
are refused: a command takes its own arguments after `--`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

from hpc.core.errors import UsageError
from hpc.launch.plan import JobSpec, Plan, Point, job_basics, load_cluster_for, sweep_dir_for, sweep_specs
from hpc.spec.command import CommandSpec, check_command, fill, point_values
from hpc.spec.config import Layers
from hpc.spec.flags import FLAGS, SWITCHES, overrides_from_args
from hpc.spec.schema import CommandConfig, RunConfig, SweepConfig

SECTIONS = ("profiler", "command")  # what --config, --sweep and --set may hold for a command
AXES = {"data_fractions": "fraction", "batch_sizes": "batch"}  # the axes a command's words must use


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the toolkit's own arguments, the command after the first `--`, or None when there is none)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def refuse_training_flags(args: argparse.Namespace) -> None:
    """The toolkit's own training's flags mean nothing to a command: one line naming the first given."""
    for name in [*FLAGS, *(s for s in SWITCHES if s != "no_profile")]:
        if getattr(args, name, None) not in (None, False):
            raise UsageError(
                f"command line: --{name.replace('_', '-')}: a flag of the toolkit's own training (hpc.train); "
                "your command takes its own arguments after --"
            )


def command_layers(args: argparse.Namespace) -> Layers:
    """The profiler and command sections (and the sweep's) from --config, --sweep and --set."""
    layers = Layers()
    if args.config:
        layers.add_file(args.config, only=SECTIONS, flag="--config")
    if args.sweep:
        layers.add_file(args.sweep, only=(*SECTIONS, "sweep"), flag="--sweep")
    for dotted, value, source in overrides_from_args(args):
        if not dotted.startswith("cluster."):
            layers.set(dotted, value, source)
    if args.no_profile:
        layers.set("profiler.enabled", False, "--no-profile")
    return layers


def make_command_plan(args: argparse.Namespace, words: list[str] | None, now: dt.datetime | None = None) -> Plan:
    """The job specs for a command line that runs a command: every shape and point validated."""
    refuse_training_flags(args)
    cluster = load_cluster_for(args, SECTIONS)
    layers = command_layers(args)
    profiler = layers.build("profiler")
    section: CommandConfig = layers.build("command")
    argv = list(words) if words else list(section.run)
    if not argv:
        where = f"; or command.run in {args.sweep}" if args.sweep else ""
        raise UsageError(f"command line: no command: give it after -- (e.g. -- python train.py){where}")
    cwd = Path(section.cwd or Path.cwd()).absolute()
    check_command(argv, cwd, in_image=bool(cluster.image))
    base = CommandSpec(
        tuple(argv),
        str(cwd),
        profiler=dataclasses.asdict(profiler) if profiler.enabled else None,
        stop_grace_s=cluster.stop_grace_s,
    )
    request, runs_dir = job_basics(args, cluster)
    resolved = {
        "command": {**dataclasses.asdict(section), "run": argv, "cwd": str(cwd)},
        "profiler": dataclasses.asdict(profiler),
    }
    if not args.sweep:
        check_unfilled(section, args)
        name = args.name if args.name is not None else base.name
        gpus = args.gpus if args.gpus is not None else cluster.gpus_per_node
        spec = JobSpec(request(args.nodes, gpus, name, "command line"),
                       runs_dir / name / "%j", ((None, _filled(base, section, None)),), False)  # fmt: skip
        return Plan(cluster, (spec,), args.local, RunConfig(), command=resolved)
    sweep = grid_for(layers, section, args.sweep)
    name = args.name if args.name is not None else sweep.name
    sweep_dir = sweep_dir_for(runs_dir, name, now)
    points = [(p, _filled(base, section, p)) for p in grid_points(sweep)]
    specs = sweep_specs(points, request, name, sweep_dir, args.sweep)
    return Plan(cluster, specs, args.local, RunConfig(), sweep, sweep_dir, args.max_parallel, resolved)


def check_unfilled(section: CommandConfig, args: argparse.Namespace) -> None:
    """A point's field in a single job's words has no value: say so before anything runs."""
    for word in (*section.args, *section.env.values()):
        fill(word, {}, f"--config {args.config}: command", final=False)


def _filled(base: CommandSpec, section: CommandConfig, point: Point | None) -> CommandSpec:
    """The point's command: the section's args and env with the point's values (None: a single job)."""
    values = point_values(point) if point is not None else {}
    source = f"sweep point {values}" if point is not None else "command"
    args = tuple(fill(word, values, f"{source}: command.args", final=False) for word in section.args)
    env = {k: fill(v, values, f"{source}: command.env.{k}", final=False) for k, v in section.env.items()}
    return dataclasses.replace(base, args=args, env=env, point=dict(point) if point is not None else None)


def grid_for(layers: Layers, section: CommandConfig, source: str) -> SweepConfig:
    """The sweep's grid for a command: an axis of the study's grid whose field ({fraction}, {batch})
    the command's words never use is one point, not several copies of the same run; one given with
    several values in the sweep file but never used is an error naming it."""
    sweep: SweepConfig = layers.build("sweep")
    used = " ".join((*section.args, *section.env.values()))  # command.run, as the words after --, is verbatim
    changes: dict[str, Any] = {}
    for axis, field in AXES.items():
        if "{" + field in used or len(getattr(sweep, axis)) == 1:
            continue
        if axis in layers.values["sweep"]:
            raise UsageError(
                f"{source}: sweep.{axis} has {len(getattr(sweep, axis))} values but the command never uses "
                f"{{{field}}}: every point would run the same command"
            )
        changes[axis] = getattr(sweep, axis)[:1]
    return dataclasses.replace(sweep, **changes)


def grid_points(sweep: SweepConfig) -> list[Point]:
    """Every (data fraction, batch size, GPUs per node, nodes) point of the grid."""
    return [
        {"data_fraction": fraction, "batch_size": batch, "gpus": gpus, "nodes": nodes}
        for nodes in sweep.nodes
        for gpus in sweep.gpus
        for fraction in sweep.data_fractions
        for batch in sweep.batch_sizes
    ]


def is_command_sweep(path: str | None) -> bool:
    """Whether a sweep file runs a command (it has a command section): `hpc.study resubmit` asks."""
    if not path:
        return False
    from hpc.spec.config import read_yaml

    return "command" in read_yaml(path, "--sweep")
