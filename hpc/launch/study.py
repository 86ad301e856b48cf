"""The study in one command, its status, resubmission and cancel: `python -m hpc.study run|status|resubmit|cancel`.

    python -m hpc.study run profiles/study.yaml --account m1234_g --wait   # + any hpc.submit option
    python -m hpc.study status runs/study/sweep-<time>
    python -m hpc.study resubmit runs/study/sweep-<time> --failed --missing --account m1234_g
    python -m hpc.study cancel runs/study/sweep-<time>                     # its arrays and analysis job

`run` validates every point, submits the sweep's job arrays (hpc.submit's plan), then a small analysis
job that depends on them (`--dependency=afterany:...`, resources from the cluster profile's
`analysis_*` keys: on Perlmutter a CPU job of the shared QOS) and writes the tables, figures and
report.html into SWEEP/analysis/. `status` (hpc/launch/status.py) reads squeue (sacct too, where it
works), the run directories and the job logs. `resubmit` submits the chosen points again into the same
sweep (their earlier job ids kept in index.json's `history`), and a new analysis job rebuilds the
report. No torch import here (fast CLI).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

from analysis.api import report
from hpc.core.cli import Parser, command_name, run, suggestion
from hpc.core.ending import Outcome, PointState
from hpc.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, NoArguments, QueueError, UsageError
from hpc.core.rundir import SweepPaths, analysis_jobs, point_key, read_index, record_analysis_job
from hpc.launch.status import existing_sweep, status_command, sweep_status
from hpc.launch.submission.follow import Interrupts
from hpc.launch.submission.plan import Plan, make_plan
from hpc.launch.submission.points import split_command
from hpc.launch.submission.queue import QueueWatch, ask_slurm, queued
from hpc.launch.submission.site import accounts, charge_lines
from hpc.launch.submission.slurm import analysis_parameters, sbatch_text
from hpc.launch.submission.submit import (
    STUDY_RESUBMIT,
    STUDY_RUN,
    build_parser,
    execute,
    make_executor,
    plan_for,
    print_plan,
    settle,
    submission,
)
from hpc.settings.schema import ClusterConfig

log = logging.getLogger(__name__)

COMMANDS = ("run", "status", "resubmit", "cancel")


class AnalysisJob:
    """The submitted callable: analyses the sweep directory into SWEEP/analysis (tables, figures, report)."""

    def __init__(self, sweep_dir: str):
        self.sweep_dir = sweep_dir

    def __call__(self) -> str:
        report(Path(self.sweep_dir), fmt="md")
        return str(SweepPaths(Path(self.sweep_dir)).report)


def submit_analysis(cluster: ClusterConfig, sweep_dir: Path, array_ids: list[str], account: str | None) -> str:
    """Submit the analysis job after every array has ended (afterany: failed points are results too)."""
    sweep = SweepPaths(sweep_dir)
    params = analysis_parameters(cluster, account, "afterany:" + ":".join(array_ids), sweep_dir.parent.name)
    with submission(sweep.analysis_jobs / "%j", "the analysis job", params):
        job = make_executor(params, sweep.analysis_jobs / "%j", local=False).submit(AnalysisJob(str(sweep_dir)))
    record_analysis_job(sweep, job.job_id)
    return str(job.job_id)


def submit_and_analyse(plan: Plan, account: str | None, wait: bool) -> int:
    """Submit the plan (hpc.submit's), then the analysis job after it; print where everything lands."""
    assert plan.sweep_dir is not None  # a study's plan is a sweep's
    sweep = SweepPaths(plan.sweep_dir)
    local_failures = execute(plan, wait=False)  # --local: every point has run when this returns
    if plan.local and local_failures == EXIT_PREEMPTED:  # stopped by Ctrl-C: its line says how to go on
        return local_failures
    if plan.local:
        report(plan.sweep_dir)
        log.info(f"sweep:  {plan.sweep_dir}\nreport: {sweep.report}")
        return EXIT_FAILED if local_failures else EXIT_OK
    submitted = {point.key for spec in plan.specs for point, _ in spec.points if point is not None}
    arrays = sorted({p.job.split("_")[0] for p in read_index(sweep.index) if p.key in submitted and p.job})
    try:
        analysis_id = submit_analysis(plan.cluster, plan.sweep_dir, arrays, account)
    except (QueueError, UsageError) as e:
        raise type(e)(
            f"{e}; the arrays {' '.join(arrays)} are submitted (index.json): once they end, "
            f"python -m analysis {plan.sweep_dir} --report writes the report"
        ) from None
    log.info(
        f"sweep:    {plan.sweep_dir}\narrays:   {' '.join(arrays)}\nanalysis: job {analysis_id} "
        f"(after the arrays)\nreport:   {sweep.report} (when job {analysis_id} has run)\n"
        f"status:   python -m hpc.study status {plan.sweep_dir}"
    )
    return wait_for_report(sweep, analysis_id) if wait else 0


def wait_for_report(sweep: SweepPaths, analysis_id: str, poll_s: float = 3.0) -> int:
    """Block until the analysis job has left the queue (a controller that does not answer is waited
    through); print the sweep table and each point's verdict; 1 when no report came."""
    watch = QueueWatch()
    with Interrupts() as interrupts:  # Ctrl-C stops the waiting, not the sweep: say so, in one line
        while not watch.left(analysis_id):
            if interrupts.signum is not None:
                log.warning(
                    f"hpc: stopped waiting ({interrupts.name}); the sweep runs on in Slurm: "
                    f"python -m hpc.study status {sweep.root}"
                )
                return EXIT_INTERRUPTED
            time.sleep(poll_s)
    if not sweep.report.exists():
        log.error(f"hpc.study: the analysis job {analysis_id} ended without {sweep.report}; see {sweep.analysis_jobs}")
        return EXIT_FAILED
    print_report_tables(sweep)
    return EXIT_OK


def print_report_tables(sweep: SweepPaths) -> None:
    """The sweep table, each point's verdict in words (why.md's first section) and where the report is."""
    print(sweep.sweep_table.read_text(), end="")
    if sweep.why_table.is_file():
        print("\n" + sweep.why_table.read_text().split("\n## ", 1)[0].strip())
    print(f"report: {sweep.report}")


def run_command(argv: list[str]) -> int:
    """`run SWEEP.yaml [hpc.submit options]`: hpc.submit's command line, its --wait meaning "until the
    report exists"."""
    request, plan = plan_for(argv, STUDY_RUN)
    analysis_account = accounts(plan.cluster, request.account, request.analysis_account)[1]
    if request.dry_run:
        print_plan(plan)
        print(
            f"# then the analysis job, after the arrays (job ids known once they are submitted)\n"
            f"{analysis_sbatch_text(plan, analysis_account)}",
            end="",
        )
        print("\n".join(["# what the points can be charged:", *plan_charges(plan)]))
        return EXIT_OK
    return submit_and_analyse(plan, analysis_account, request.wait)


def plan_charges(plan: Plan) -> list[str]:
    """Per QOS: the points and the most node-hours they can be charged (hpc/launch/submission/site.py)."""
    shapes = [
        (
            spec.charge.qos or "-",
            len(spec.points),
            spec.request.nodes,
            spec.request.gpus,
            spec.request.time_min,
        )
        for spec in plan.specs
    ]
    return charge_lines(plan.cluster, shapes)


def analysis_sbatch_text(plan: Plan, account: str | None) -> str:
    """The analysis job's sbatch script as submitit would write it, with placeholder array ids."""
    assert plan.sweep_dir is not None
    params = analysis_parameters(plan.cluster, account, "afterany:<array ids>", plan.sweep_dir.parent.name)
    return sbatch_text(params, SweepPaths(plan.sweep_dir).analysis_jobs / "%j")


def resubmit_command(argv: list[str]) -> int:
    """Submit the failed and/or missing points again into the same sweep, and a new analysis job."""
    p = build_parser(STUDY_RESUBMIT)  # hpc.study run's options, parsed once with the choice of points
    p.description = "Submit chosen points of a sweep again (into it), then a new analysis job."
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="the sweep's directory, as hpc.study run printed it")
    p.add_argument(
        "--failed",
        action="store_true",
        help="points that failed or timed out (they start afresh, in a new run directory)",
    )
    p.add_argument("--missing", action="store_true", help="points never run (no run directory, not queued)")
    own, words = split_command(argv)
    args = p.parse_args(own)  # the choice of points; the rest is the request
    request = settle(args, STUDY_RESUBMIT, os.environ)
    sweep_dir = existing_sweep(args.sweep_dir)
    if not (args.failed or args.missing):
        raise UsageError("hpc.study resubmit: say which points: --failed, --missing or both")
    wanted: set[Outcome | PointState] = {Outcome.FAILED, PointState.TIMEOUT} if args.failed else set()
    wanted |= {PointState.MISSING} if args.missing else set()
    points, problem = sweep_status(sweep_dir)
    if problem is not None:  # a point that looks failed or missing may be running: never submit it twice
        raise QueueError(f"{problem}; not resubmitting while the queue cannot be read (a point may still be running)")
    keys = {point_key(r) for r in points if r["state"] in wanted}
    if not keys:
        print(f"hpc.study: no {' or '.join(sorted(wanted))} points in {sweep_dir}")
        return EXIT_OK
    request = dataclasses.replace(request, sweep=str(SweepPaths(sweep_dir).sweep_file))  # as it was submitted
    plan = make_plan(request, words, into=(sweep_dir, keys))
    if request.dry_run:
        print_plan(plan)
        return EXIT_OK
    print(f"resubmitting {sum(len(s.points) for s in plan.specs)} point(s) into {sweep_dir}")
    analysis_account = accounts(plan.cluster, request.account, request.analysis_account)[1]
    return submit_and_analyse(plan, analysis_account, request.wait)


def cancel_command(argv: list[str]) -> int:
    """scancel every job of a sweep still in the queue: its arrays and its analysis jobs. A person's stop:
    final, never requeued."""
    p = Parser(
        prog=command_name("python -m hpc.study cancel"),
        description="Cancel a sweep: scancel its job arrays and its analysis job; final, never requeued.",
        needs_args=True,
    )
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="the sweep's directory, as hpc.study run printed it")
    sweep = SweepPaths(existing_sweep(p.parse_args(argv).sweep_dir))
    jobs = [*sorted({p.job.split("_")[0] for p in read_index(sweep.index) if p.job}), *analysis_jobs(sweep)]
    listed = queued(jobs)
    live = [j for j in jobs if any(k == j or k.startswith(f"{j}_") for k in listed)]
    if not live:
        print(f"hpc.study: no job of {sweep.root} is in the queue: nothing to cancel")
        return EXIT_OK
    said = ask_slurm(["scancel", *live])
    if said.returncode != 0:
        words = " ".join((said.stdout + said.stderr).split()) or f"exit {said.returncode}"
        raise QueueError(f"scancel {' '.join(live)}: {words}")
    print(f"hpc.study: cancelled (scancel) job(s) {' '.join(live)}: final, never requeued")
    print(f"status: {command_name('python -m hpc.study status')} {sweep.root}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.replace("python -m hpc.study", command_name("python -m hpc.study")))
        return EXIT_OK
    if not argv:
        prog = command_name("python -m hpc.study")
        raise NoArguments(f"usage: {prog} {{{','.join(COMMANDS)}}} ...\n{prog}: no command given (see {prog} --help)")
    if argv[0] not in COMMANDS:
        raise UsageError(
            f"command line: {argv[0]!r}: expected one of {', '.join(COMMANDS)}{suggestion(argv[0], COMMANDS)}"
        )
    commands = {"run": run_command, "status": status_command, "resubmit": resubmit_command, "cancel": cancel_command}
    return commands[argv[0]](argv[1:])


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.study`, or its console script): errors as one line, exit 2."""
    return run("hpc.study", main, argv)
