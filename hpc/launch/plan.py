"""What a submission command line asks for, as a pure plan: every job shape and every point validated,
nothing written or submitted. A single job is a sweep of one point; a sweep is one job array per job
shape (nodes x GPUs per node). `hpc.submit` and `hpc.study` print, run or submit plans. No torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.core.cli import check_name, check_output_dir
from hpc.core.errors import UsageError
from hpc.launch.site import accounts
from hpc.launch.slurm import JobRequest, local_parameters, parse_exports, slurm_parameters
from hpc.spec.config import Layers, check_request, load_cluster, require_section
from hpc.spec.flags import overrides_from_args
from hpc.spec.schema import RUN_SECTIONS, ClusterConfig, RunConfig, SweepConfig

Point = dict[str, Any]  # data_fraction, batch_size, gpus, nodes


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One submission: a job shape and the runs it carries."""

    request: JobRequest
    folder: Path  # submitit's folder, with %j for the job id: each run directory
    # (point, what it runs: its run config, or your own command's CommandSpec); point None: a single job
    points: tuple[tuple[Point | None, Any], ...]
    array: bool  # submitted as a job array (a sweep), or as a plain job


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a command line asks for, validated, before anything is submitted or written."""

    cluster: ClusterConfig
    specs: tuple[JobSpec, ...]
    local: bool
    base: RunConfig
    sweep: SweepConfig | None = None
    sweep_dir: Path | None = None
    max_parallel: int | None = None
    command: dict[str, Any] | None = None  # your own command's sections (command, profiler), as resolved

    def parameters(self, spec: JobSpec) -> dict[str, Any]:
        """submitit's executor parameters for a spec: Slurm's, or the local executor's with --local."""
        if self.local:
            return local_parameters(self.cluster, spec.request)
        return slurm_parameters(self.cluster, spec.request, self.max_parallel, spec.folder, self.command is not None)

    def sweep_file(self) -> dict[str, Any]:
        """sweep.yaml: the sweep and what its points run (the run sections, or the command's)."""
        assert self.sweep is not None
        return {"sweep": dataclasses.asdict(self.sweep), **(self.command or self.base.to_dict())}


def load_cluster_for(args: argparse.Namespace, sections: tuple[str, ...] = RUN_SECTIONS) -> ClusterConfig:
    """The cluster profile (with --set cluster.* values), checked against what the command line asks;
    --set may name the cluster section and `sections` (and the sweep's, with --sweep)."""
    overrides = overrides_from_args(args)
    for dotted, _, source in overrides:
        require_section(dotted, sections + ("cluster",) + (("sweep",) if args.sweep else ()), source)
    cluster = load_cluster(
        args.profile or ("local" if args.local else "perlmutter"), [o for o in overrides if o[0].startswith("cluster.")]
    )
    if args.local and cluster.max_nodes < args.nodes:
        raise UsageError(f"command line: --nodes {args.nodes}: --local runs on this machine only (1 node)")
    if args.max_parallel is not None and args.max_parallel < 1:
        raise UsageError(f"command line: --max-parallel {args.max_parallel}: must be >= 1")
    if not args.local and cluster.scheduler != "slurm":
        raise UsageError(f"profile {cluster.name!r}: scheduler is {cluster.scheduler!r}; use --local")
    if not args.local and not args.dry_run and not shutil.which("sbatch"):
        raise UsageError("sbatch not found on this machine: submit from a Slurm login node, or run here with --local")
    return cluster


def run_layers(args: argparse.Namespace) -> Layers:
    """The run sections (and the sweep's) from --config, --sweep and the training flags."""
    layers = Layers()
    if args.config:
        layers.add_file(args.config, flag="--config")
    if args.sweep:
        layers.add_file(args.sweep, flag="--sweep")
    for dotted, value, source in overrides_from_args(args):
        if not dotted.startswith("cluster."):  # the cluster profile takes those
            layers.set(dotted, value, source)
    return layers


Request = Callable[[int, int, str, str], JobRequest]


def job_basics(args: argparse.Namespace, cluster: ClusterConfig) -> tuple[Request, Path]:
    """What every job of a command line shares: a maker of checked job requests (nodes, GPUs per node,
    job name, where the shape came from), and the runs directory."""
    time_min = args.time if args.time is not None else cluster.time_limit_min
    if args.name is not None:
        check_name(args.name, "command line: --name")
    exports, sbatch = parse_exports(args.export), parse_exports(args.sbatch, "--sbatch")
    account = check_account(cluster, args.account, needed=not (args.dry_run or args.local))
    runs_dir = runs_dir_for(args.runs_dir, cluster).absolute()
    check_output_dir(runs_dir, "command line: --runs-dir")

    def request(nodes: int, gpus: int, job_name: str, source: str) -> JobRequest:
        check_request(cluster, nodes, gpus, time_min, source=source)
        return JobRequest(nodes, gpus, time_min, job_name, account, args.qos, args.partition, exports, sbatch)

    return request, runs_dir


def make_plan(args: argparse.Namespace, now: dt.datetime | None = None) -> Plan:
    """The job specs for a command line: every shape and every point validated, nothing written."""
    cluster = load_cluster_for(args)
    layers = run_layers(args)
    base = layers.run_config()  # validates the run config before anything is submitted
    sweep = layers.build("sweep") if args.sweep else None
    request, runs_dir = job_basics(args, cluster)
    name = args.name if args.name is not None else (sweep.name if sweep else base.model.arch)
    if sweep is None:
        gpus = args.gpus if args.gpus is not None else cluster.gpus_per_node
        spec = JobSpec(request(args.nodes, gpus, name, "command line"), runs_dir / name / "%j", ((None, base),), False)
        return Plan(cluster, (spec,), args.local, base)
    sweep_dir = sweep_dir_for(runs_dir, name, now)
    specs = sweep_specs(sweep_points(sweep, layers), request, name, sweep_dir, args.sweep)
    return Plan(cluster, specs, args.local, base, sweep, sweep_dir, args.max_parallel)


def sweep_dir_for(runs_dir: Path, name: str, now: dt.datetime | None) -> Path:
    return runs_dir / name / (now or dt.datetime.now()).strftime("sweep-%Y%m%d-%H%M%S")


def check_account(cluster: ClusterConfig, account: str | None, needed: bool) -> str | None:
    """The GPU jobs' account, checked against the profile's rule (hpc/launch/site.py) before anything is
    submitted; a profile with a rule needs one to submit (a dry run does not)."""
    account, _ = accounts(cluster, account, None)
    if needed and account is None and cluster.account_suffix:
        raise UsageError(
            f"command line: --account: profile {cluster.name!r} needs one, a GPU allocation's (it ends with "
            f"{cluster.account_suffix!r})"
        )
    return account


def runs_dir_for(flag: str | None, cluster: ClusterConfig) -> Path:
    """--runs-dir, else the profile's runs_dir (Perlmutter: on $SCRATCH), else ./runs. A profile path whose
    variable is not set here (no $SCRATCH on a laptop) falls back to ./runs."""
    if flag is not None:
        return Path(flag)
    if cluster.runs_dir:
        expanded = os.path.expanduser(os.path.expandvars(cluster.runs_dir))
        if "$" not in expanded:
            return Path(expanded)
    return Path("runs")


def sweep_specs(
    points: list[tuple[Point, Any]],
    request: Request,
    name: str,
    sweep_dir: Path,
    source: str,
) -> tuple[JobSpec, ...]:
    """One job array per job shape (nodes x GPUs per node) of the points; every shape is checked
    (`request`) before anything is submitted."""
    by_shape: dict[tuple[int, int], list[tuple[Point | None, Any]]] = {}
    for point, cfg in points:
        by_shape.setdefault((point["nodes"], point["gpus"]), []).append((point, cfg))
    return tuple(
        JobSpec(
            request(
                nodes,
                gpus,
                f"{name}-{nodes}n{gpus}g" if nodes > 1 else f"{name}-{gpus}gpu",
                f"{source}: sweep.nodes={nodes}, sweep.gpus={gpus}",
            ),
            sweep_dir / "%j",
            tuple(group),
            True,
        )
        for (nodes, gpus), group in by_shape.items()
    )


def sweep_points(sweep: SweepConfig, layers: Layers) -> list[tuple[Point, RunConfig]]:
    """Every (data fraction, batch size, GPUs per node, nodes) point with its validated run config."""
    points = []
    for nodes in sweep.nodes:
        for gpus in sweep.gpus:
            for fraction in sweep.data_fractions:
                for batch in sweep.batch_sizes:
                    layers.set("data.fraction", fraction, f"sweep point fraction={fraction:g}")
                    layers.set("train.batch_size", batch, f"sweep point batch={batch}")
                    points.append(
                        (
                            {"data_fraction": fraction, "batch_size": batch, "gpus": gpus, "nodes": nodes},
                            layers.run_config(),
                        )
                    )
    return points
