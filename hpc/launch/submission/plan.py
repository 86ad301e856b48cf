"""What a submission command line asks for, as a pure plan, assembled here in one place: the cluster
profile, each job's request (nodes x GPUs per node, checked), the task every rank of each point runs
(hpc/launch/submission/points.py: the toolkit's training or a user's command), and each job's submitit parameters
and sbatch text, computed once. A single job is a sweep of one point; a sweep is one job array per job
shape. Nothing written or submitted: `hpc.submit` and `hpc.study` print, run or submit plans. No torch
import.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from hpc.core.cli import check_name, check_output_dir
from hpc.core.ending import RankCommand
from hpc.core.errors import UsageError
from hpc.core.files import JsonObject
from hpc.core.rundir import JobRecord, SweepPoint
from hpc.launch.batch import BatchJob, Step, step_preview
from hpc.launch.submission.job import TaskJob
from hpc.launch.submission.points import (
    COMMAND_SECTIONS,
    Points,
    command_points,
    grid_points,
    is_command_sweep,
    refuse_training_flags,
    training_points,
)
from hpc.launch.submission.request import Allocation, SubmitRequest
from hpc.launch.submission.sbatchflags import ACCT_GATHER_PROFILE, JobOptions
from hpc.launch.submission.site import Charge, accounts, node_share
from hpc.launch.submission.slurm import (
    JobRequest,
    Parameters,
    batch_python,
    local_parameters,
    rank_python,
    sbatch_text,
    slurm_parameters,
)
from hpc.placement.affinity import usable_cpus
from hpc.settings.config import check_request, load_cluster, require_section
from hpc.settings.rankcommand import read_task
from hpc.settings.schema import RUN_SECTIONS, ClusterConfig, SweepConfig

PointCommand = tuple[SweepPoint | None, RankCommand]  # a point (None: a single job) and what its ranks run


@dataclasses.dataclass(frozen=True)
class Shape:
    """The jobs of one shape (nodes x GPUs per node): their request, submitit's folder, their points."""

    request: JobRequest
    folder: Path  # submitit's folder, with %j for the job id: each run directory
    points: tuple[PointCommand, ...]
    array: bool  # submitted as a job array (a sweep), or as a plain job


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One submission: a job shape, the points it carries with the task each runs, and how it is
    submitted (submitit's parameters, and the sbatch text they make on Slurm; None with --local)."""

    request: JobRequest
    folder: Path  # submitit's folder, with %j for the job id: each run directory
    points: tuple[PointCommand, ...]
    array: bool  # submitted as a job array (a sweep), or as a plain job
    parameters: Parameters  # submitit's, for this shape
    sbatch: str | None
    charge: Charge  # what index.json says each point ran in, for the report's node-hours (site.py)
    jobs: tuple[BatchJob | TaskJob, ...]  # what submitit runs for each point, in the points' order: in its batch
    # shell on Slurm (its one srun step); --local, in every task
    python: str  # the python each rank's runner runs (this one; a container's own `python`)
    step: str | None = None  # the srun step its batch shell runs, as a dry run says it (None with --local)
    shell: str | None = None  # what submitit's script execs as the job's batch shell (None with --local)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a command line asks for, validated, before anything is submitted or written."""

    cluster: ClusterConfig
    specs: tuple[JobSpec, ...]
    local: bool
    sweep: SweepConfig | None = None
    sweep_dir: Path | None = None
    sweep_file: JsonObject | None = None  # sweep.yaml: the sweep and what its points run, as resolved
    resumed: Path | None = None  # --resume RUN: the run directory submitted again


Request = Callable[[int, int, str, str], JobRequest]


def make_plan(
    request: SubmitRequest,
    words: list[str] | None,
    now: dt.datetime | None = None,
    into: tuple[Path, set[tuple[object, ...]]] | None = None,
) -> Plan:
    """The plan of a command line (`words`: the command after `--`, None for the training or a sweep's
    own command section): every shape and every point validated, nothing written. `into`: a sweep
    directory that exists, and the keys of its points to submit again there (`hpc.study resubmit`)."""
    if request.resume is not None:
        return resume_plan(request, words)
    command = words is not None or is_command_sweep(request.sweep)
    if command:
        refuse_training_flags(request)
    cluster = load_cluster_for(request, COMMAND_SECTIONS if command else (*RUN_SECTIONS, "command"))
    work: Points = command_points(request, cluster, words) if command else training_points(request, cluster)
    job, runs_dir = job_basics(request, cluster)
    name = request.name if request.name is not None else work.name
    if work.sweep is None:
        gpus = request.gpus if request.gpus is not None else cluster.gpus_per_node
        single = ((None, work.task_for(None)),)
        shapes = [Shape(job(request.nodes, gpus, name, "command line"), runs_dir / name / "%j", single, False)]
        sweep_dir = None
    else:
        source = request.sweep or "sweep"
        sweep_dir = runs_dir / name / (now or dt.datetime.now()).strftime("sweep-%Y%m%d-%H%M%S")
        grid = grid_points(work.sweep, source)
        if into is not None:
            sweep_dir, keys = into
            grid = [p for p in grid if p.key in keys]
        shapes = sweep_shapes([(p, work.task_for(p)) for p in grid], job, name, sweep_dir, source)
    specs = tuple(job_spec(cluster, request.local, request.max_parallel, shape) for shape in shapes)
    record: JsonObject | None = (
        {"sweep": dataclasses.asdict(work.sweep), **work.sections} if work.sweep is not None else None
    )
    return Plan(cluster, specs, request.local, work.sweep, sweep_dir, record)


def resume_plan(request: SubmitRequest, words: list[str] | None) -> Plan:
    """--resume RUN: RUN's own task (task.json) as one job in RUN itself (submitit's folder, no %j), whose
    run starts from what RUN holds (the training's checkpoint; a script's own)."""
    run_dir = Path(str(request.resume)).absolute()
    where = f"command line: --resume {request.resume}"
    if words is not None or request.config is not None or request.sweep is not None or request.overrides:
        given = "a command after --" if words is not None else "--config, --sweep or a training option"
        raise UsageError(f"{where}: {given}: a resumed run runs its own task again ({run_dir / 'task.json'})")
    task = read_task(run_dir / "task.json", where)
    if task is None:
        raise UsageError(f"{where}: no task.json there: not a run directory of the toolkit")
    cluster = load_cluster_for(request, COMMAND_SECTIONS)
    job, _ = job_basics(request, cluster)
    gpus = request.gpus if request.gpus is not None else cluster.gpus_per_node
    shape = Shape(job(request.nodes, gpus, request.name or task.name, where), run_dir, ((None, task),), False)
    return Plan(cluster, (job_spec(cluster, request.local, None, shape),), request.local, resumed=run_dir)


def job_spec(
    cluster: ClusterConfig,
    local: bool,
    max_parallel: int | None,
    shape: Shape,
) -> JobSpec:
    """A job of the plan with its parameters, sbatch text and charge, made once."""
    request = shape.request
    folder = shape.folder
    points = shape.points
    array = shape.array
    if local:
        params, text = local_parameters(cluster, request, os.environ, len(usable_cpus())), None
    else:
        params = slurm_parameters(cluster, request, max_parallel)
        text = sbatch_text(params, folder, map_count=len(points) if array else None)
    qos = params.get("qos")
    charge = Charge(
        qos=qos if isinstance(qos, str) else None, node_share=node_share(cluster, request.nodes, request.gpus)
    )
    python = rank_python(cluster)
    step = Step(cluster.launcher, request.nodes, request.gpus, None, python=python)
    record = job_record(cluster, request, params)
    jobs: tuple[BatchJob | TaskJob, ...] = tuple(
        TaskJob(task, cluster.launcher, request.gpus, cluster.max_restarts)
        if local
        else BatchJob(task, cluster, step, record)
        for _, task in points
    )
    preview = None if local else step_preview(cluster, folder, step, request.options.exports.sbatch_value())
    shell = None if local else batch_python()
    return JobSpec(request, folder, points, array, params, text, charge, jobs, python, preview, shell)


def job_record(cluster: ClusterConfig, request: JobRequest, params: Parameters) -> JobRecord:
    """job.json of the job's runs: its shape and the options sbatch was given (what --resume submits again)."""

    def given(key: str) -> str | None:
        value = params.get(key)
        return value if isinstance(value, str) else None

    return JobRecord(
        nodes=request.nodes,
        gpus=request.gpus,
        profile=cluster.name,
        time_min=request.time_min,
        name=request.name,
        account=given("account"),
        qos=given("qos"),
        partition=given("partition"),
        constraint=given("constraint"),
        export_all=request.options.exports.inherit,
        exports=dict(request.options.exports.values),
    )


def load_cluster_for(request: SubmitRequest, sections: tuple[str, ...]) -> ClusterConfig:
    """The cluster profile (with --set cluster.* values), checked against what the command line asks;
    --set may name the cluster section and `sections` (and the sweep's, with --sweep)."""
    profile, overrides = request.profile, request.overrides
    if profile and ACCT_GATHER_PROFILE.fullmatch(profile) and not os.path.exists(profile):
        raise UsageError(
            f"command line: --profile {profile}: here --profile names the cluster profile (perlmutter, local or "
            f"a YAML); sbatch's --profile (acct_gather_profile) goes as --sbatch profile={profile}"
        )
    for dotted, _, source in overrides:
        require_section(dotted, sections + ("cluster",) + (("sweep",) if request.sweep else ()), source)
    cluster = load_cluster(
        profile or ("local" if request.local else "perlmutter"), [o for o in overrides if o[0].startswith("cluster.")]
    )
    if request.local and cluster.max_nodes < request.nodes:
        raise UsageError(f"command line: --nodes {request.nodes}: --local runs on this machine only (1 node)")
    if request.max_parallel is not None and request.max_parallel < 1:
        raise UsageError(f"command line: --max-parallel {request.max_parallel}: must be >= 1")
    if not request.local and cluster.scheduler != "slurm":
        raise UsageError(f"profile {cluster.name!r}: scheduler is {cluster.scheduler!r}; use --local")
    if not request.local and not request.dry_run and request.allocation is None and not shutil.which("sbatch"):
        raise UsageError("sbatch not found on this machine: submit from a Slurm login node, or run here with --local")
    return cluster


def job_basics(request: SubmitRequest, cluster: ClusterConfig) -> tuple[Request, Path]:
    """What every job of a command line shares: a maker of checked job requests (nodes, GPUs per node,
    job name, where the shape came from), and the runs directory."""
    time_min = request.time if request.time is not None else cluster.time_limit_min
    if request.name is not None:
        check_name(request.name, "command line: --name")
    asked, here = request.options, request.allocation
    if request.local or here is not None:
        refuse_for_a_run_here(asked, here)
    account = check_account(cluster, asked.account, needed=not (request.dry_run or request.local or here))
    asked = dataclasses.replace(asked, account=account)
    runs_dir = runs_dir_for(request.runs_dir, cluster).absolute()
    check_output_dir(runs_dir, "command line: --runs-dir")

    def job(nodes: int, gpus: int, job_name: str, source: str) -> JobRequest:
        check_request(cluster, nodes, gpus, time_min, source=source)
        return JobRequest(nodes, gpus, time_min, job_name, asked)

    return job, runs_dir


def refuse_for_a_run_here(asked: JobOptions, allocation: Allocation | None) -> None:
    """--local runs here, now, in this environment; inside an allocation the run takes the allocation as it
    is: an option only a new Slurm job acts on is one line, not ignored."""
    where = (
        f"inside allocation {allocation.job_id} the run takes it as it is; --new-job submits a new job"
        if allocation is not None
        else "--local runs on this machine, now"
    )
    slurm_only = asked.slurm_only()
    if slurm_only is not None:
        raise UsageError(f"command line: {slurm_only}: an option for a new Slurm job; {where}")
    if not asked.exports.inherit:
        raise UsageError(
            "command line: --export without ALL: sbatch would start a new job in a fresh login environment; the "
            "run here starts in this one: say --export ALL,NAME=VALUE"
        )


def check_account(cluster: ClusterConfig, account: str | None, needed: bool) -> str | None:
    """The GPU jobs' account, checked against the profile's rule (hpc/launch/submission/site.py) before anything is
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


def sweep_shapes(
    points: list[tuple[SweepPoint, RankCommand]], request: Request, name: str, sweep_dir: Path, source: str
) -> list[Shape]:
    """One job array per job shape (nodes x GPUs per node) of the points; every shape is checked
    (`request`) before anything is submitted."""
    by_shape: dict[tuple[int, int], list[PointCommand]] = {}
    for point, task in points:
        by_shape.setdefault((point.nodes, point.gpus), []).append((point, task))
    return [
        Shape(
            request(
                nodes,
                gpus,
                f"{name}-{nodes}n{gpus}g" if nodes > 1 else f"{name}-{gpus}gpu",
                f"{source}: sweep.nodes={nodes}, sweep.gpus={gpus}",
            ),
            sweep_dir / "%j",
            tuple(group),
            array=True,
        )
        for (nodes, gpus), group in by_shape.items()
    ]
