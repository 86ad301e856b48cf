"""Submit training (one task per GPU) to Slurm, or run it here, through submitit: `python -m hpc.submit`.

    python -m hpc.submit --nodes 1 --gpus 4 --account m1234 --config profiles/smoke.yaml
    python -m hpc.submit --local --gpus 2 --config profiles/quickstart.yaml --wait
    python -m hpc.submit --sweep profiles/study.yaml --account m1234 --max-parallel 4
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234 --dry-run      # print the sbatch script

The command line becomes a plan (hpc/launch/plan.py), printed (--dry-run), run here (--local) or
submitted: each point a `TrainJob` (hpc/launch/job.py), a sweep one job array per shape, its points
recorded in the sweep's index.json. Job handling is submitit's. No torch import here (fast CLI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, run
from hpc.core.rundir import RunPaths, SweepPaths, write_index, write_yaml
from hpc.launch.flags import add_training_flags
from hpc.launch.job import TrainJob
from hpc.launch.plan import JobSpec, Plan, Point, make_plan
from hpc.launch.queue import left_queue
from hpc.launch.slurm import make_executor, sbatch_text


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m hpc.submit",
        description="Submit DDP training (one task per GPU) with submitit: to Slurm by default, here with --local.",
        epilog="Every hpc.train option below is forwarded to the training. Exit codes: 0 submitted (or, with "
        "--wait, all jobs done), 1 a job failed, 2 bad input.",
    )
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
    g.add_argument("--runs-dir", default="runs", help="where run directories go (default ./runs)")
    g.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the job (repeatable; overrides the profile's env)",
    )
    g.add_argument("--dry-run", action="store_true", help="print the sbatch script(s); submit nothing")
    g.add_argument("--local", action="store_true", help="run here with submitit's local executor (no Slurm)")
    g.add_argument("--sweep", help="sweep YAML: submit its grid as job arrays, one per resource shape")
    g.add_argument("--max-parallel", type=int, help="at most N array tasks running at once")
    g.add_argument("--wait", action="store_true", help="wait for the job(s) and report how they ended")
    t = parser.add_argument_group("training (forwarded to hpc.train)")
    add_training_flags(t)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = make_plan(args)
    if args.dry_run:
        print_plan(plan)
        return 0
    return execute(plan, wait=args.wait)


def print_plan(plan: Plan) -> None:
    """--dry-run: the sbatch script of every spec (what submitit would hand to sbatch), submitting nothing."""
    for spec in plan.specs:
        if plan.local:
            what = f"{len(spec.points)} point(s), one at a time" if spec.array else "one job"
            print(f"# --local: {what}, {spec.request.gpus} task(s) each, through submitit's local executor")
            continue
        if spec.array:
            print(f"# array of {len(spec.points)} points at {spec.request.nodes} node(s) x {spec.request.gpus} GPU(s)")
        print(
            sbatch_text(plan.parameters(spec), spec.folder, map_count=len(spec.points) if spec.array else None),
            end="" if not spec.array else "\n",
        )


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path
    logs: tuple[Path, Path]  # stdout, stderr of task 0
    job: Any  # submitit's Job
    point: Point | None = None

    @classmethod
    def of(cls, job: Any, point: Point | None) -> Submitted:
        return cls(job.job_id, Path(job.paths.folder), (Path(job.paths.stdout), Path(job.paths.stderr)), job, point)

    def describe(self) -> str:
        return f"job {self.job_id}: run dir {self.run_dir}\n  logs: {', '.join(str(p) for p in self.logs)}"

    def ended(self) -> bool:
        """Whether the job has ended: submitit's done() here; on Slurm its result file or squeue (see
        hpc/launch/queue.py: without slurmdbd submitit's own done() waits forever on a killed job)."""
        if not _is_slurm_job(self.job):
            return bool(self.job.done())
        return self.job.paths.result_pickle.exists() or left_queue(self.job_id)


def _is_slurm_job(job: Any) -> bool:
    from submitit.slurm.slurm import SlurmJob

    return isinstance(job, SlurmJob)


def execute(plan: Plan, wait: bool) -> int:
    """Submit every spec: here one point at a time (each waited for), on Slurm each spec at once (an
    array for a sweep). Returns 0, or 1 when a job that was waited for failed."""
    if plan.sweep_dir is not None and plan.sweep is not None:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(
            SweepPaths(plan.sweep_dir).sweep_file, {"sweep": dataclasses.asdict(plan.sweep), **plan.base.to_dict()}
        )
    subs: list[Submitted] = []
    failures = 0
    for spec in plan.specs:
        executor = make_executor(plan.parameters(spec), spec.folder, plan.cluster.max_requeues, plan.local)
        if plan.local:  # this machine: one point at a time, followed as it runs
            for point in spec.points:
                subs.extend(submit_points(plan, executor, (point,), spec))
                failures += wait_for(subs[-1:], follow=True)
                _drop_placeholder(spec.folder)
                record_index(plan, subs)
            continue
        subs.extend(submit_points(plan, executor, spec.points, spec))
        record_index(plan, subs)
    if plan.sweep_dir is not None:
        print(f"sweep: {len(subs)} points, index {SweepPaths(plan.sweep_dir).index}")
    if wait and not plan.local:
        failures = wait_for(subs)
        for spec in plan.specs:
            _drop_placeholder(spec.folder)
    return 1 if failures else 0


def submit_points(plan: Plan, executor: Any, points: tuple[Any, ...], spec: JobSpec) -> list[Submitted]:
    """Submit the points' TrainJobs (as one array for a sweep's spec) and say where each runs."""
    with executor.batch() if spec.array and not plan.local else contextlib.nullcontext():
        jobs = [
            executor.submit(
                TrainJob(
                    cfg.to_dict(),
                    plan.cluster.max_requeues,
                    plan.cluster.launcher,
                    spec.request.gpus,
                    plan.cluster.max_restarts,
                )
            )
            for _, cfg in points
        ]
    subs = [Submitted.of(job, point) for job, (point, _) in zip(jobs, points, strict=False)]
    for sub in subs:
        print(sub.describe(), flush=True)
    return subs


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


RUN_NUMBERS = [
    "rank",
    "steps",
    "cpu_time_us",
    "cuda_time_us",
    "kernel_calls",
    "peak_gpu_mem_bytes",
    "peak_cpu_mem_bytes",
]


def print_run_numbers(run_dir: Path) -> None:
    """The run's numbers from its own traces, per rank: what a local run ends with (no torch import)."""
    from analysis.discover import print_warnings
    from analysis.fold import analyze_run
    from analysis.tables import render

    warnings: list[str] = []
    traces, run = analyze_run(run_dir, warnings)
    print_warnings(warnings)
    if traces:
        print(f"profiled steps, per rank (python -m analysis {run_dir} for more):")
        print(render(sorted(traces, key=lambda r: (r.rank is None, r.rank or 0)), RUN_NUMBERS, "table"), end="")
    if run is not None and run.verdict:
        print(f"verdict: {run.verdict['line']}")


class _LogFollower:
    """Echoes what jobs' rank 0 writes to stdout, as it comes (local runs), without submitit's lines."""

    def __init__(self, subs: list[Submitted]):
        self.subs = subs
        self.offsets: dict[Path, int] = {}

    def echo(self) -> None:
        for sub in self.subs:
            log = sub.logs[0]
            if log.exists():
                with open(log, errors="replace") as f:
                    f.seek(self.offsets.get(log, 0))
                    text = f.read()
                    self.offsets[log] = f.tell()
                sys.stdout.write(
                    "".join(line for line in text.splitlines(keepends=True) if not line.startswith("submitit "))
                )
                sys.stdout.flush()


def wait_for(subs: list[Submitted], poll_s: float = 2.0, follow: bool = False) -> int:
    """Wait until every job has ended; report each: its status, or FAILED with its log. With follow,
    rank 0's output is echoed as it comes (local runs). Returns 1 when a job failed, else 0."""
    pending = list(subs)
    follower = _LogFollower(subs)
    while pending:
        pending = [sub for sub in pending if not sub.ended()]
        if follow:
            follower.echo()
        if pending:
            time.sleep(poll_s if not follow else 0.5)
    return 1 if sum(not report_result(sub, poll_s, follow) for sub in subs) else 0


def report_result(sub: Submitted, poll_s: float, follow: bool) -> bool:
    """Print how an ended job ended; False when it failed."""
    try:
        if not sub.job.paths.result_pickle.exists():
            time.sleep(poll_s)  # a result written as the job left the queue
        if not sub.job.paths.result_pickle.exists():
            raise RuntimeError("no result: the job was killed or failed outside Python")
        result = sub.job.results()[0]  # task 0's; every task returns the same kind of record
    except Exception as e:  # submitit re-raises the job's own exception here, whatever it is
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        print(
            f"job {sub.job_id}: FAILED ({lines[-1] if lines else type(e).__name__}); see {sub.logs[0]}", file=sys.stderr
        )
        return False
    if follow and result.get("status") == "done":
        print_run_numbers(sub.run_dir)
    paths = RunPaths(sub.run_dir)
    print(
        f"job {sub.job_id}: {result.get('status')}\n  run:     {sub.run_dir}\n"
        f"  traces:  {paths.traces}\n  summary: {paths.summary}"
    )
    return True


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.submit`, or its console script): errors as one line, exit 2."""
    return run("hpc.submit", main, argv)
