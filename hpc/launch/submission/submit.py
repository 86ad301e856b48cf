"""Submit a job (one task per GPU) to Slurm, or run it here, through submitit: `python -m hpc.submit`.

    python -m hpc.submit --nodes 1 --gpus 4 --account m1234_g --config profiles/smoke.yaml
    python -m hpc.submit --local --gpus 2 --config profiles/quickstart.yaml --wait
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234_g --dry-run      # print the sbatch script
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234_g -- python train.py --epochs 3  # your own
    python -m hpc.study run profiles/study.yaml --account m1234_g --max-parallel 4  # a sweep: hpc.study's

A submission reads top to bottom: the command line is parsed here, becomes a plan (hpc/launch/submission/plan.py:
the cluster, each job's request, the task every rank runs, the sbatch parameters and text), is printed
(--dry-run), or written and submitted here (each point a `TaskJob`, hpc/launch/submission/job.py; a sweep one job
array per shape, its points in the sweep's index.json), then followed (hpc/launch/submission/follow.py). The
toolkit's training and your own command take the same road. Job handling is submitit's. No torch import
here (fast CLI).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from hpc.core.cli import Parser, first_missing, run, shown
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, QueueError, UsageError
from hpc.core.gpusample import count_here
from hpc.core.logs import TO_STDERR
from hpc.core.owner import make_dirs
from hpc.core.proc import identity
from hpc.core.rundir import (
    IndexPoint,
    RunPaths,
    SweepIndexFile,
    SweepPaths,
    read_job_record,
    record_resumed_point,
    write_index,
    write_yaml,
)
from hpc.core.stop import interrupts_ignored
from hpc.launch.batch import allocation_here, allocation_step, allocation_words, run_in_allocation
from hpc.launch.submission.follow import Submitted, wait_for
from hpc.launch.submission.plan import JobSpec, Plan, make_plan
from hpc.launch.submission.points import split_command
from hpc.launch.submission.queue import first_line
from hpc.launch.submission.request import Allocation, SubmitRequest
from hpc.launch.submission.sbatchflags import (
    ATTACHED_ONLY,
    SLURM_GROUP,
    add_slurm_options,
    job_options,
    merge_sbatch_words,
)
from hpc.settings.cluster import ranks_per_node
from hpc.settings.flags import TRAINING_FLAGS, add_training_flags, overrides_from_args
from hpc.settings.rankcommand import SUBMITTER_VARIABLE, words_for

log = logging.getLogger(__name__)

STUDY_RUN = "python -m hpc.study run"
STUDY_RESUBMIT = "python -m hpc.study resubmit"


def study_prog(prog: str) -> bool:
    """Whether the command line is hpc.study's (run or resubmit) rather than hpc.submit's."""
    return prog in (STUDY_RUN, STUDY_RESUBMIT)


def build_parser(prog: str = "python -m hpc.submit") -> Parser:
    """hpc.submit's command line; as `hpc.study run` (prog STUDY_RUN) the sweep YAML comes first and
    --wait waits for the report; as `hpc.study resubmit` the sweep is its directory's (a value, set by
    the caller) and the caller adds its own choice of points."""
    study = study_prog(prog)
    parser = Parser(
        prog=prog,
        description="Submit the study (a sweep's job arrays, then its analysis job) and say where its report will be."
        if study
        else "Submit DDP training (one task per GPU) with submitit: to Slurm by default, here with --local.",
        epilog="Every hpc.train option below is forwarded to the training. Your own command instead: everything "
        "after -- (e.g. -- python train.py --epochs 3), run as given by every rank, profiled (--config's profiler "
        "section, --no-profile). Exit codes: 0 submitted (or, with --wait, all jobs done), 1 a job failed, 2 bad "
        "input, 3 a run stopped, preempted or cancelled before its end (the same with --local and --wait), 130 "
        "waiting stopped.",
        needs_args=True,
        unknown_hint=newer_sbatch_option,
    )
    if prog == STUDY_RUN:
        parser.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep: its grid and run sections")
        parser.add_argument(
            "--axis",
            action="append",
            default=[],
            metavar="KEY=V1,V2",
            help="one more axis of the sweep, as sweep.axes: a config key (--axis train.lr=0.1,0.01) or a "
            "placeholder the command uses (--axis seed=1,2,3 for {seed}); repeat it for more",
        )
    add_job_options(parser)
    add_submission_options(parser.add_argument_group("submission"), study)
    add_training_flags(parser.add_argument_group("training (forwarded to hpc.train)"))
    return parser


def newer_sbatch_option(word: str) -> str:
    """What an unknown --option may be: an sbatch option newer than the toolkit's table knows."""
    if not word.startswith("--"):
        return ""
    return f"; an sbatch option the toolkit does not know goes as --sbatch {word[2:].split('=')[0]}=VALUE"


def add_job_options(parser: Parser) -> None:
    """The job's shape and where it runs: GPUs per node, the cluster profile, the runs directory; then sbatch's
    options with sbatch's meaning (hpc/launch/submission/sbatchflags.py)."""
    g = parser.add_argument_group("job")
    g.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs per node, one task each (as --gpus-per-node; sbatch's --gpus counts the job's; default: the "
        "profile's; --local: 2)",
    )
    g.add_argument(
        "--profile", default=None, help="cluster profile name or YAML (default perlmutter; local with --local)"
    )
    g.add_argument("--runs-dir", help="where run directories go (default: the profile's runs_dir, else ./runs)")
    add_slurm_options(parser.add_argument_group("Slurm", SLURM_GROUP))
    parser.attached_only = ATTACHED_ONLY


def add_submission_options(g: argparse._ArgumentGroup, study: bool) -> None:
    """How the plan is used: printed, run here, swept, waited for."""
    if study:
        g.add_argument("--analysis-account", help="the analysis job's account (default: --account's CPU allocation)")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch script(s); submit nothing")
    g.add_argument("--local", action="store_true", help="run here with submitit's local executor (no Slurm)")
    if not study:  # one way to submit a sweep: hpc.study run (its arrays, then its report)
        g.add_argument(
            "--resume",
            metavar="RUN",
            help="submit run directory RUN's task again, in RUN, as its job ran (RUN/job.json; options given here "
            "win): a stopped or cancelled run resumes from its checkpoint",
        )
        g.add_argument("--sweep", help=argparse.SUPPRESS)
        g.add_argument(
            "--new-job",
            action="store_true",
            help="inside an interactive allocation (salloc), submit a new job instead of running in it",
        )
    g.add_argument("--max-parallel", type=int, help="at most N array tasks running at once")
    g.add_argument(
        "-W",
        "--wait",
        action="store_true",
        help="wait for the report" if study else "wait for the job(s), report how they ended",
    )


LOCAL_RANKS = 2  # --local without --gpus on a machine without a GPU: two CPU ranks, as the quickstart runs


def parse_options(
    own: list[str], prog: str = "python -m hpc.submit", environ: Mapping[str, str] | None = None
) -> SubmitRequest:
    """The command line's own options (before `--`), parsed and settled (`settle`)."""
    return settle(build_parser(prog).parse_args(own), prog, environ)


def settle(args: argparse.Namespace, prog: str, environ: Mapping[str, str] | None) -> SubmitRequest:
    """The parsed options as one request: `--sbatch KEY=VALUE` onto its flag and sbatch's options checked;
    inside an interactive allocation (`environ`'s) hpc.submit's job runs there (`allocation`; not with
    --local or --new-job), its shape the allocation's unless given; --local's ranks, unless given, this
    machine's GPUs or two. What was chosen so goes to `notes`, said once the plan holds (bad input stays
    one line)."""
    merge_sbatch_words(args)
    if getattr(args, "resume", None):
        as_before(args)
    notes = []
    here = allocation_here(environ) if environ is not None and not args.local else None
    if here is not None and study_prog(prog):
        notes.append(f"inside allocation {here.job_id} (salloc): the sweep's arrays go to Slurm as jobs of their own")
    allocation = here if not study_prog(prog) and not getattr(args, "new_job", False) else None
    nodes, gpus = args.nodes, args.gpus
    if allocation is not None:
        nodes = allocation.nodes if nodes is None else nodes
        gpus = allocation.gpus if gpus is None else gpus
        given = [f for f, v in (("-A", args.account), ("-q", args.qos), ("-p", args.partition), ("-t", args.time)) if v]
        if given:
            notes.append(f"{', '.join(given)}: the allocation's own (salloc's); --new-job submits a job with them")
    if args.local and gpus is None and not study_prog(prog):  # a sweep's points have their own GPUs
        found = count_here(os.environ if environ is None else environ)
        gpus = found or LOCAL_RANKS
        here_has = f"this machine's {found} GPU(s)" if found else f"no GPU here: {LOCAL_RANKS} CPU ranks"
        notes.append(f"--local: {gpus} rank(s) (no --gpus; {here_has})")
    return SubmitRequest(
        nodes=1 if nodes is None else nodes,  # -N's default: unset until here, where an allocation's may stand in
        gpus=gpus,
        time=args.time,
        name=args.name,
        options=job_options(args, os.environ),
        profile=args.profile,
        runs_dir=args.runs_dir,
        config=args.config,
        sweep=getattr(args, "sweep", None),  # hpc.study resubmit's is its directory's, set by the caller
        axes=tuple(getattr(args, "axis", None) or ()),
        overrides=tuple(overrides_from_args(args)),
        training_flags=tuple(name for name in TRAINING_FLAGS if getattr(args, name, None) not in (None, False)),
        no_profile=args.no_profile,
        local=args.local,
        dry_run=args.dry_run,
        wait=args.wait,
        max_parallel=args.max_parallel,
        analysis_account=getattr(args, "analysis_account", None),
        allocation=allocation,
        resume=getattr(args, "resume", None),
        notes=tuple(notes),
    )


def as_before(args: argparse.Namespace) -> None:
    """--resume RUN: the options not given here as RUN's job had them (RUN/job.json; none there: the profile's)."""
    paths = RunPaths(Path(args.resume))
    if not paths.task.is_file():  # said by the plan, in its words
        return
    job = read_job_record(paths, lambda line: log.warning(f"hpc: {line}"))
    if job is None:
        return
    for name, value in (
        ("nodes", job.nodes),
        ("gpus", job.gpus),
        ("time", job.time_min),
        ("name", job.name),
        ("account", job.account),
        ("qos", job.qos),
        ("partition", job.partition),
        ("constraint", job.constraint),
        ("profile", job.profile),
    ):
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if not args.export and (job.exports or not job.export_all):
        args.export = ["ALL" if job.export_all else "NONE", *(f"{k}={v}" for k, v in job.exports.items())]


def plan_for(
    argv: list[str] | None, prog: str = "python -m hpc.submit", into: Any = None
) -> tuple[SubmitRequest, Plan]:
    """The request and its plan (your own command's after `--`, or the toolkit's training); `into`:
    make_plan's (a resubmission)."""
    own, words = split_command(sys.argv[1:] if argv is None else list(argv))
    request = parse_options(own, prog, os.environ)
    if not study_prog(prog) and request.sweep is not None:
        raise UsageError(
            f"--sweep {request.sweep}: a sweep is submitted by python -m hpc.study run {request.sweep} "
            "(its job arrays, then the analysis job that writes its report)"
        )
    plan = make_plan(request, words, into=into)
    for note in request.notes:  # the plan holds: what was chosen for the user is said
        log.info(f"hpc: {note}", extra=TO_STDERR)
    return request, plan


def main(argv: list[str] | None = None) -> int:
    request, plan = plan_for(argv)
    if request.allocation is not None:
        return in_allocation(plan, request.allocation, request.dry_run)
    if request.dry_run:
        print_plan(plan)
        return EXIT_OK
    return execute(plan, wait=request.wait)


def in_allocation(plan: Plan, here: Allocation, dry_run: bool) -> int:
    """The plan's one job as a step of the interactive allocation this runs in (hpc/launch/batch.py)."""
    (spec,) = plan.specs
    ((_, task),) = spec.points
    step = allocation_step(here, plan.cluster, spec.request.nodes, spec.request.gpus, os.environ)
    exports = spec.request.options.exports.values
    if dry_run:
        print_allocation_step(*allocation_words(task, spec.folder.parent, plan.cluster, step, exports, dry_run=True))
        return EXIT_OK
    return run_in_allocation(task, spec.folder.parent, plan.cluster, step, exports)


def print_allocation_step(task_words: list[str], step_words: list[str], env: Mapping[str, str]) -> None:
    """--dry-run inside an allocation: what each rank runs and the srun step that would run it."""
    print(f"# inside allocation {env.get('SLURM_JOB_ID')}: one srun step\n# each rank runs: {shlex.join(task_words)}")
    print(shlex.join(step_words))


def print_plan(plan: Plan) -> None:
    """--dry-run: what each rank of every job runs, and its sbatch script (what submitit would hand to
    sbatch), submitting nothing."""
    for spec in plan.specs:
        if plan.local:
            what = f"{len(spec.points)} point(s), one at a time" if spec.array else "one job"
            print(f"# --local: {what}, {spec.request.gpus} task(s) each, through submitit's local executor")
        elif spec.array:
            print(f"# array of {len(spec.points)} points at {spec.request.nodes} node(s) x {spec.request.gpus} GPU(s)")
        for point, task in spec.points:
            words = " ".join(shlex.quote(w) for w in words_for(task, spec.folder, spec.python))
            print(f"# {'each rank runs:' if point is None else f'point {point}:'} {words}")
        if spec.step is not None:
            print(f"# the job's batch shell runs one step: {spec.step}")
        if spec.sbatch is not None:
            print(spec.sbatch, end="" if not spec.array else "\n")


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
    make_dirs(parent, "job folder")  # the owner's, before submitit writes into it
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


def make_executor(params: dict[str, Any], folder: Path, local: bool, shell: str | None = None) -> Any:
    """submitit's executor for the parameters: here (LocalExecutor) or on Slurm (SlurmExecutor; `shell`: what a
    run's job execs as its batch shell, hpc/launch/submission/slurm.py `batch_python`; None: submitit's own).
    Its own requeue (max_num_timeout) stays unused: our jobs are not its Checkpointables, and a Slurm job's
    requeue is the batch shell's (hpc/launch/requeue.py)."""
    import submitit

    executor: Any
    if local:
        executor = submitit.LocalExecutor(folder=folder)
    else:
        executor = submitit.SlurmExecutor(folder=folder, python=shell)
    executor.update_parameters(**params)
    return executor


def execute(plan: Plan, wait: bool) -> int:
    """Write and submit every spec, then follow: here one point at a time (each followed as it runs), on
    Slurm each spec at once (an array for a sweep). Returns 0, 1 when a job that was waited for failed, 3
    when a local run was stopped (Ctrl-C, SIGTERM: hpc/launch/submission/follow.py), 130 when waiting was. An sbatch
    that fails is one line (QueueError): a new sweep directory with nothing submitted into it is removed,
    and an index.json lists only what was submitted."""
    made = first_missing(plan.sweep_dir, "sweep directory") if plan.sweep_dir is not None else None
    if plan.sweep_dir is not None and plan.sweep_file is not None:
        make_dirs(plan.sweep_dir, "sweep directory")
        write_yaml(SweepPaths(plan.sweep_dir).sweep_file, plan.sweep_file)
    done: list[Submitted] = []
    try:
        code = submit_specs(plan, done)
    except (QueueError, UsageError) as e:  # sbatch failed, or Slurm refused the job
        if made is not None and not done:
            shutil.rmtree(made, ignore_errors=True)
        before = f"; before it: job(s) {' '.join(d.job_id for d in done)}" if done else ""
        raise type(e)(f"{e}{before or '; nothing was submitted'}") from None
    if plan.sweep_dir is not None:
        log.info(f"sweep: {len(done)} points, index {SweepPaths(plan.sweep_dir).index}")
    if plan.resumed is not None and done and SweepPaths(plan.resumed.parent).index.exists():
        if record_resumed_point(SweepPaths(plan.resumed.parent), plan.resumed.name, done[0].job_id):
            log.info(f"sweep point: {SweepPaths(plan.resumed.parent).index} follows job {done[0].job_id} now")
    if wait and not plan.local:
        code = wait_for(done, echo=len(done) == 1)  # one run: its rank 0 as it comes, as --local shows it
    return code


def submit_specs(plan: Plan, done: list[Submitted]) -> int:
    """Submit every spec (adding to `done` as they go); here each point followed as it runs, and a stopped
    one ends the sweep. The exit code of what was followed (see execute)."""
    failures = 0
    for n, spec in enumerate(plan.specs, 1):
        what = f"{'array' if spec.array else 'job'} {n} of {len(plan.specs)}"
        with submission(spec.folder, what, spec.parameters) if not plan.local else contextlib.nullcontext():
            executor = make_executor(spec.parameters, spec.folder, plan.local, spec.shell)
            if not plan.local:
                done.extend(submit_points(plan, executor, range(len(spec.points)), spec))
        if not plan.local:
            record_index(plan, done)
        for i in range(len(spec.points)) if plan.local else ():  # this machine: a point at a time, followed
            with interrupts_ignored():  # submitit's controller must not see Ctrl-C (follow.py)
                done.extend(submit_points(plan, executor, range(i, i + 1), spec))
            record_index(plan, done)
            code = wait_for(done[-1:], follow=True)  # which drops submitit's '%j' placeholder once it ended
            if code == EXIT_PREEMPTED:
                return code
            failures += code
    return EXIT_FAILED if failures else EXIT_OK


def submit_points(plan: Plan, executor: Any, points: range, spec: JobSpec) -> list[Submitted]:
    """Submit the points' jobs (`points`: their places in the spec; as one array for a sweep's spec) and
    say where each runs."""
    if plan.local:  # its ranks' runners stop their tasks when this process is gone (hpc/launch/rank/runner.py)
        os.environ[SUBMITTER_VARIABLE] = identity() or ""
    with executor.batch() if spec.array and not plan.local else contextlib.nullcontext():
        jobs = [executor.submit(spec.jobs[i]) for i in points]
    ranks = spec.request.nodes * ranks_per_node(plan.cluster.launcher, spec.request.gpus)
    made = []
    for job, i in zip(jobs, points, strict=True):
        point, command = spec.points[i]
        paths = job.paths
        logs = (Path(paths.stdout), Path(paths.stderr))
        made.append(
            Submitted(job.job_id, Path(paths.folder), logs, job, point, spec.charge, ranks, command.is_training)
        )
        log.info(f"job {job.job_id}: run dir {paths.folder}\n  logs: {', '.join(str(p) for p in logs)}")
    return made


def record_index(plan: Plan, done: list[Submitted]) -> None:
    """The sweep's index.json: every point submitted so far, with its job id and run directory."""
    if plan.sweep_dir is None or plan.sweep is None:
        return
    header = SweepIndexFile(sweep=dataclasses.asdict(plan.sweep), cluster=plan.cluster.name)
    points = [
        msgspec.convert(
            {
                **msgspec.to_builtins(s.point),
                **msgspec.to_builtins(s.charge),
                "job_id": s.job_id,
                "run_dir": s.run_dir.name,
            },
            IndexPoint,
        )
        for s in done
        if s.point is not None
    ]
    write_index(SweepPaths(plan.sweep_dir), header, points)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.submit`, or its console script): errors as one line, exit 2."""
    return run("hpc.submit", main, argv)
