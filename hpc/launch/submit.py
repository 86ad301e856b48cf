"""Submit training (one task per GPU) to Slurm, or run it here, through submitit: `python -m hpc.submit`.

    python -m hpc.submit --nodes 1 --gpus 4 --account m1234_g --config profiles/smoke.yaml
    python -m hpc.submit --local --gpus 2 --config profiles/quickstart.yaml --wait
    python -m hpc.submit --sweep profiles/study.yaml --account m1234_g --max-parallel 4
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234_g --dry-run      # print the sbatch script
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234_g -- python train.py --epochs 3  # your own

The command line becomes a plan (hpc/launch/plan.py; for your own command after `--`, hpc/launch/
cmdplan.py), printed (--dry-run), run here (--local) or submitted: each point a `TrainJob` (hpc/launch/
job.py) or a `CommandJob` (hpc/launch/cmdjob.py), a sweep one job array per shape, its points recorded
in the sweep's index.json. Job handling is submitit's. No torch import here (fast CLI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, first_missing, run, shown
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, QueueError, UsageError
from hpc.core.rundir import SweepPaths, write_index, write_yaml
from hpc.launch.cmdjob import CommandJob
from hpc.launch.cmdplan import is_command_sweep, make_command_plan, split_command
from hpc.launch.follow import Submitted, interrupts_ignored, wait_for
from hpc.launch.job import TrainJob
from hpc.launch.plan import JobSpec, Plan, make_plan
from hpc.launch.queue import first_line
from hpc.launch.site import node_share
from hpc.launch.slurm import job_python, make_executor, sbatch_text
from hpc.spec.command import CommandSpec
from hpc.spec.flags import add_training_flags

log = logging.getLogger(__name__)

STUDY_RUN = "python -m hpc.study run"


def build_parser(prog: str = "python -m hpc.submit") -> Parser:
    """hpc.submit's command line; as `hpc.study run` (prog STUDY_RUN) the sweep YAML comes first and
    --wait waits for the report."""
    study = prog == STUDY_RUN
    parser = Parser(
        prog=prog,
        description="Submit the study (a sweep's job arrays, then its analysis job) and say where its report will be."
        if study
        else "Submit DDP training (one task per GPU) with submitit: to Slurm by default, here with --local.",
        epilog="Every hpc.train option below is forwarded to the training. Your own command instead: everything "
        "after -- (e.g. -- python train.py --epochs 3), run as given by every rank, profiled (--config's profiler "
        "section, --no-profile). Exit codes: 0 submitted (or, with --wait, all jobs done), 1 a job failed, 2 bad "
        "input, 3 a local run stopped (Ctrl-C), 130 waiting stopped.",
        needs_args=True,
    )
    if study:
        parser.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep: its grid and run sections")
    g = parser.add_argument_group("job")
    g.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    g.add_argument("--gpus", type=int, default=None, help="GPUs per node, one task each (default: the profile's)")
    g.add_argument(
        "--profile", default=None, help="cluster profile name or YAML (default perlmutter; local with --local)"
    )
    g.add_argument(
        "--time", type=int, default=None, metavar="MIN", help="time limit in minutes (default: the profile's)"
    )
    g.add_argument("--account", help="Slurm account (-A); Perlmutter needs one")
    g.add_argument("--qos", help="Slurm QOS (-q), default: the profile's")
    g.add_argument("--partition", help="Slurm partition")
    g.add_argument("--name", help="job name; runs go to RUNS/<name>/<job id>/ (default: the arch)")
    g.add_argument("--runs-dir", help="where run directories go (default: the profile's runs_dir, else ./runs)")
    g.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the job (repeatable; overrides the profile's env)",
    )
    g.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another sbatch option, as --KEY=VALUE in the script (repeatable; e.g. mail-type=END)",
    )
    if study:
        g.add_argument("--analysis-account", help="the analysis job's account (default: --account's CPU allocation)")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch script(s); submit nothing")
    g.add_argument("--local", action="store_true", help="run here with submitit's local executor (no Slurm)")
    if not study:
        g.add_argument("--sweep", help="sweep YAML: submit its grid as job arrays, one per resource shape")
    g.add_argument("--max-parallel", type=int, help="at most N array tasks running at once")
    g.add_argument(
        "--wait",
        action="store_true",
        help="wait for the report" if study else "wait for the job(s), report how they ended",
    )
    t = parser.add_argument_group("training (forwarded to hpc.train)")
    add_training_flags(t)
    return parser


def plan_for(argv: list[str] | None, prog: str = "python -m hpc.submit") -> tuple[Any, Plan]:
    """The parsed options and the plan: your own command's (after `--`, or a sweep with a command
    section) or the toolkit's training."""
    own, words = split_command(sys.argv[1:] if argv is None else list(argv))
    args = build_parser(prog).parse_args(own)
    if words is not None or is_command_sweep(args.sweep):
        return args, make_command_plan(args, words)
    return args, make_plan(args)


def main(argv: list[str] | None = None) -> int:
    args, plan = plan_for(argv)
    if args.dry_run:
        print_plan(plan)
        return EXIT_OK
    return execute(plan, wait=args.wait)


def print_plan(plan: Plan) -> None:
    """--dry-run: the sbatch script of every spec (what submitit would hand to sbatch), submitting nothing;
    for your own command, what each rank runs."""
    for spec in plan.specs:
        if plan.local:
            what = f"{len(spec.points)} point(s), one at a time" if spec.array else "one job"
            print(f"# --local: {what}, {spec.request.gpus} task(s) each, through submitit's local executor")
        elif spec.array:
            print(f"# array of {len(spec.points)} points at {spec.request.nodes} node(s) x {spec.request.gpus} GPU(s)")
        for point, payload in spec.points if plan.command is not None else ():
            words = " ".join(shlex.quote(w) for w in payload.words(spec.folder))
            print(f"# {'each rank runs:' if point is None else f'point {point}:'} {words}")
        if not plan.local:
            text = sbatch_text(
                plan.parameters(spec),
                spec.folder,
                job_python(plan.cluster),
                map_count=len(spec.points) if spec.array else None,
            )
            print(text, end="" if not spec.array else "\n")


# sbatch's words when Slurm itself turns a job down (its accounting enforces accounts, QOS and their limits):
# the user's input, not a controller that failed.
REFUSALS = (
    "Invalid account",
    "Invalid qos",
    "violates accounting/QOS policy",
    "Invalid partition",
    "Requested time limit is invalid",
    "Invalid feature specification",
    "Requested node configuration is not available",
)


@contextlib.contextmanager
def submission(folder: Path, what: str, params: dict[str, Any] | None = None) -> Iterator[None]:
    """sbatch through submitit, as one line when it fails, and what submitit wrote for it (its pickle, its
    script, folders it made) removed again: a UsageError when Slurm refused the job (REFUSALS), naming the
    job's account, QOS and partition (`params`) and Slurm's words; else a QueueError with sbatch's reason."""
    import submitit

    parent = folder.parent  # submitit writes a job's files beside its "%j" folder until it has an id
    made = first_missing(parent, "job folder")
    before = set(parent.iterdir()) if made is None else set()
    told = io.StringIO()  # submitit prints sbatch's stderr itself before raising: keep it for the one line
    try:
        with contextlib.redirect_stderr(told):
            yield
    except (submitit.core.utils.FailedJobError, OSError, subprocess.SubprocessError) as e:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        else:
            for leftover in set(parent.iterdir()) - before:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        text = str(e) or told.getvalue()
        if any(words in text for words in REFUSALS):
            raise refused(what, text, params or {}) from None
        raise QueueError(f"sbatch could not submit {what} ({first_line(text)})") from None


def refused(what: str, sbatch_said: str, params: dict[str, Any]) -> UsageError:
    said = "; ".join(line.strip().removeprefix("sbatch: error: ") for line in sbatch_said.splitlines() if line.strip())
    given = ", ".join(
        f"--{key} {shown(str(params[key]))}" for key in ("account", "qos", "partition") if params.get(key)
    )
    return UsageError(f"Slurm refused {what} ({given or 'no account, QOS or partition given'}): {said[:300]}")


def execute(plan: Plan, wait: bool) -> int:
    """Submit every spec: here one point at a time (each waited for), on Slurm each spec at once (an
    array for a sweep). Returns 0, 1 when a job that was waited for failed, 3 when a local run was
    stopped (Ctrl-C, SIGTERM: hpc/launch/follow.py), 130 when waiting was. An sbatch that fails is one
    line (QueueError): a new sweep directory with nothing submitted into it is removed, and an
    index.json lists only what was submitted."""
    made = first_missing(plan.sweep_dir, "sweep directory") if plan.sweep_dir is not None else None
    if plan.sweep_dir is not None and plan.sweep is not None:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(SweepPaths(plan.sweep_dir).sweep_file, plan.sweep_file())
    subs: list[Submitted] = []
    try:
        code = submit_specs(plan, subs)
    except (QueueError, UsageError) as e:  # sbatch failed, or Slurm refused the job
        if made is not None and not subs:
            shutil.rmtree(made, ignore_errors=True)
        done = f"; before it: job(s) {' '.join(s.job_id for s in subs)}" if subs else "; nothing was submitted"
        raise type(e)(f"{e}{done}") from None
    if plan.sweep_dir is not None:
        log.info(f"sweep: {len(subs)} points, index {SweepPaths(plan.sweep_dir).index}")
    if wait and not plan.local:
        code = wait_for(subs)
        for spec in plan.specs:
            _drop_placeholder(spec.folder)
    return code


def submit_specs(plan: Plan, subs: list[Submitted]) -> int:
    """Submit every spec (adding to `subs` as they go); here each point waited for, and a stopped one ends
    the sweep. The exit code of what was waited for (see execute)."""
    failures = 0
    for n, spec in enumerate(plan.specs, 1):
        what = f"{'array' if spec.array else 'job'} {n} of {len(plan.specs)}"
        params = plan.parameters(spec)
        with submission(spec.folder, what, params) if not plan.local else contextlib.nullcontext():
            executor = make_executor(
                params, spec.folder, plan.cluster.max_requeues, plan.local, job_python(plan.cluster)
            )
            if not plan.local:
                subs.extend(submit_points(plan, executor, spec.points, spec))
        if plan.local:  # this machine: one point at a time, followed as it runs
            for point in spec.points:
                with interrupts_ignored():  # submitit's controller must not see Ctrl-C (follow.py)
                    subs.extend(submit_points(plan, executor, (point,), spec))
                code = wait_for(subs[-1:], follow=True)
                _drop_placeholder(spec.folder)
                record_index(plan, subs)
                if code == EXIT_PREEMPTED:
                    return code
                failures += code
        else:
            record_index(plan, subs)
    return EXIT_FAILED if failures else EXIT_OK


def submit_points(plan: Plan, executor: Any, points: tuple[Any, ...], spec: JobSpec) -> list[Submitted]:
    """Submit the points' TrainJobs (as one array for a sweep's spec) and say where each runs."""
    with executor.batch() if spec.array and not plan.local else contextlib.nullcontext():
        jobs = [executor.submit(job_for(plan, payload, spec)) for _, payload in points]
    req = spec.request
    ranks = req.nodes * req.gpus
    # what index.json says each point ran in, for the report's node-hours (hpc/launch/site.py)
    charge = {"qos": plan.parameters(spec).get("qos"), "node_share": node_share(plan.cluster, req.nodes, req.gpus)}
    subs = [
        Submitted.of(job, {**point, **charge} if point else None, ranks, plan.command is not None)
        for job, (point, _) in zip(jobs, points, strict=False)
    ]
    for sub in subs:
        log.info(sub.describe())
    return subs


def job_for(plan: Plan, payload: Any, spec: JobSpec) -> TrainJob | CommandJob:
    """What each task of a point runs: the toolkit's training (a RunConfig) or your own command."""
    cluster = plan.cluster
    kind = CommandJob if isinstance(payload, CommandSpec) else TrainJob
    return kind(payload.to_dict(), cluster.max_requeues, cluster.launcher, spec.request.gpus, cluster.max_restarts)


def record_index(plan: Plan, subs: list[Submitted]) -> None:
    """The sweep's index.json: every point submitted so far, with its job id and run directory."""
    if plan.sweep_dir is None or plan.sweep is None:
        return
    header = {"sweep": dataclasses.asdict(plan.sweep), "cluster": plan.cluster.name}
    write_index(
        SweepPaths(plan.sweep_dir),
        header,
        [{**(s.point or {}), "job_id": s.job_id, "run_dir": s.run_dir.name} for s in subs],
    )


def _drop_placeholder(folder: Path) -> None:
    """submitit's local executor leaves the unexpanded '%j' folder behind, empty (its job process
    creates it again at start, so this runs once the job has ended)."""
    with contextlib.suppress(OSError):  # not there, or not empty: leave it
        folder.rmdir()


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.submit`, or its console script): errors as one line, exit 2."""
    return run("hpc.submit", main, argv)
