"""Submit training (one task per GPU) to Slurm, or run it here, through submitit: `python -m hpc.submit`.

    python -m hpc.submit --nodes 1 --gpus 4 --account m1234 --config profiles/smoke.yaml
    python -m hpc.submit --local --gpus 2 --config profiles/quickstart.yaml --wait
    python -m hpc.submit --sweep profiles/study.yaml --account m1234 --max-parallel 4
    python -m hpc.submit --nodes 2 --gpus 4 --account m1234 --dry-run      # print the sbatch script

Cluster details (profile -> sbatch parameters, setup lines, environment) live in this module only;
job handling is submitit's. The submitted callable, TrainJob, runs hpc.train in each task; on
SIGUSR2 (`--signal=USR2@<delay>`, Slurm's warning before the time limit or a preemption) training
finishes its step, writes checkpoints/last.pt, and rank 0 hands over to submitit's handler, which
calls TrainJob.checkpoint() and requeues the job; the requeued job resumes from the checkpoint.
USR2 rather than USR1: NCCL and some MPI stacks claim USR1. No torch import here (fast CLI).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc.cli import Parser, UsageError, check_name, check_output_dir
from hpc.config import (RUN_SECTIONS, ClusterConfig, ConfigError, Layers, RunConfig, SweepConfig, check_request,
                        dump_yaml, load_cluster, require_section, run_config_from_dict, write_atomic)
from hpc.train import add_training_flags, overrides_from_args

# ----------------------------------------------------------------------------------------------
# What is asked for
# ----------------------------------------------------------------------------------------------


def _check_text(flag: str, value: str | None) -> None:
    """Names and paths reach #SBATCH lines and shell text: quoting handles the rest, not line breaks."""
    if value is None:
        return
    if value == "" or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"command line: {flag} {value!r}: must be non-empty, without control characters or line breaks")


@dataclasses.dataclass(frozen=True)
class JobRequest:
    nodes: int
    gpus: int  # per node; one task per GPU
    time_min: int
    name: str
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    exports: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name, "command line: --name")
        for flag, value in (("--account", self.account), ("--qos", self.qos), ("--partition", self.partition)):
            _check_text(flag, value)
        for key, value in self.exports.items():
            if not key.replace("_", "").isalnum() or key[0].isdigit():
                raise ConfigError(f"command line: --export {key}=...: {key!r} is not a variable name")
            if "\n" in value or "\0" in value:
                raise ConfigError(f"command line: --export {key}: value must be one line")


def setup_lines(cluster: ClusterConfig, req: JobRequest) -> list[str]:
    """The profile's setup lines, then its environment and the user's --export values, quoted."""
    env = {**cluster.env, **req.exports}
    return list(cluster.setup) + [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def slurm_parameters(cluster: ClusterConfig, req: JobRequest) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one job shape: the sbatch script is a function of these."""
    torchrun = cluster.launcher == "torchrun"  # one task per node: torchrun starts the per-GPU workers
    params = {
        "job_name": req.name,
        "nodes": req.nodes,
        "ntasks_per_node": 1 if torchrun else req.gpus,
        "gpus_per_node": req.gpus,
        "cpus_per_task": cluster.cpus_per_task * (req.gpus if torchrun else 1),
        "time": req.time_min,
        "constraint": cluster.constraint,
        "qos": req.qos or cluster.qos,
        "account": req.account or cluster.account,
        "partition": req.partition or cluster.partition,
        "mem": f"{cluster.mem_gb}GB" if cluster.mem_gb else None,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": setup_lines(cluster, req),
        # One dead rank ends the step at once instead of leaving the others in a collective.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    return {k: v for k, v in params.items() if v is not None}


def make_executor(cluster: ClusterConfig, req: JobRequest, folder: Path, local: bool, python: str | None = None,
                  max_parallel: int | None = None):
    import submitit

    if local:
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=cluster.max_requeues, python=python)
        executor.update_parameters(nodes=1, tasks_per_node=1 if cluster.launcher == "torchrun" else req.gpus,
                                   gpus_per_node=req.gpus,
                                   timeout_min=req.time_min, signal_delay_s=cluster.signal_delay_s,
                                   setup=setup_lines(cluster, req))
        return executor
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=cluster.max_requeues, python=python)
    executor.update_parameters(**slurm_parameters(cluster, req))
    if max_parallel:
        executor.update_parameters(array_parallelism=max_parallel)
    return executor


def sbatch_text(executor, map_count: int | None = None) -> str:
    """Exactly the script submitit would hand to sbatch (same function, same parameters)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = dict(executor.parameters)
    if map_count is not None:
        params["map_count"] = map_count
    return _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)


# ----------------------------------------------------------------------------------------------
# What runs in every task
# ----------------------------------------------------------------------------------------------


class TrainJob:
    """The submitted callable: runs hpc.train in this task (srun: one task per GPU) or torchrun in this
    task (torchrun: one task per node); checkpointable for submitit's requeue."""

    def __init__(self, run_config: dict, max_requeues: int, launcher: str = "srun", nproc_per_node: int = 1,
                 max_restarts: int = 0):
        self.run_config = run_config
        self.max_requeues = max_requeues
        self.launcher, self.nproc_per_node, self.max_restarts = launcher, nproc_per_node, max_restarts

    def __call__(self) -> dict:
        import submitit

        from hpc.distenv import from_environ
        from hpc.oom import EXIT_OOM
        from hpc.train import check_resumable, prepare_run_dir, train_or_oom
        from hpc.trainer import EXIT_PREEMPTED

        submitit_on_usr2 = signal.getsignal(signal.SIGUSR2)  # submitit's requeue handler
        job = submitit.JobEnvironment()
        run_dir = prepare_run_dir(Path(job.paths.folder))
        cfg = run_config_from_dict(self.run_config, "submitted config")
        check_resumable(run_dir, cfg)
        if self.launcher == "torchrun":
            code = self.run_torchrun(run_dir, job.job_id)
        else:
            code = train_or_oom(cfg, run_dir, from_environ(os.environ))
        if code == EXIT_OOM:  # a result of this point, not a failure of the job: the sweep goes on
            return {"status": "oom", "run_dir": str(run_dir)}
        if code != EXIT_PREEMPTED:
            return {"status": "done", "run_dir": str(run_dir)}
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if job.global_rank == 0 and restarts < self.max_requeues and callable(submitit_on_usr2):
            submitit_on_usr2(signal.SIGUSR2, None)  # checkpoint() below, scontrol requeue, exit
        return {"status": "stopped", "run_dir": str(run_dir), "restarts": restarts}

    def run_torchrun(self, run_dir: Path, job_id: str) -> int:
        """torchrun with a worker per GPU running hpc.train on this run directory; a worker that dies
        restarts the group, which resumes from the last checkpoint. SIGUSR2 is passed on to torchrun
        (and so to the workers, which checkpoint). Returns hpc.train's exit code for the run."""
        from hpc.distenv import master_port_for_job, slurm_torchrun_args, torchrun_args, torchrun_forwards_signals
        from hpc.oom import EXIT_OOM
        from hpc.trainer import EXIT_PREEMPTED

        config = run_dir / "submitted.yaml"
        write_atomic(config, dump_yaml(self.run_config))
        args = (slurm_torchrun_args(os.environ, self.nproc_per_node, self.max_restarts) if os.environ.get("SLURM_JOB_ID")
                else torchrun_args(1, self.nproc_per_node, f"127.0.0.1:{master_port_for_job(job_id)}", job_id,
                                   self.max_restarts, torchrun_forwards_signals()))
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args, "-m", "hpc.train",
                                 "--config", str(config), "--run-dir", str(run_dir)])
        stopped = []
        previous = signal.signal(signal.SIGUSR2, lambda signum, frame: (stopped.append(signum), proc.send_signal(signum)))
        try:
            rc = proc.wait()
        finally:
            signal.signal(signal.SIGUSR2, previous)
        summary = _read_summary(run_dir)
        if summary.get("outcome") == "oom":
            return EXIT_OOM
        if rc == 0:
            return 0
        if stopped and (run_dir / "checkpoints" / "last.pt").exists():
            return EXIT_PREEMPTED
        raise RuntimeError(f"torchrun exited {rc} after {self.max_restarts} restart(s) at most; see the log above")

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        # The training state is in the run directory already; resubmitting the same job resumes it.
        return submitit.helpers.DelayedSubmission(self)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


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
    g.add_argument("--profile", default=None, help="cluster profile name or YAML (default perlmutter; local with --local)")
    g.add_argument("--time", type=int, default=None, metavar="MIN", help="time limit in minutes (default: the profile's)")
    g.add_argument("--account", help="Slurm account (-A); Perlmutter needs one")
    g.add_argument("--qos", help="Slurm QOS (-q), default: the profile's")
    g.add_argument("--partition", help="Slurm partition")
    g.add_argument("--name", help="job name; runs go to RUNS/<name>/<job id>/ (default: the arch)")
    g.add_argument("--runs-dir", default="runs", help="where run directories go (default ./runs)")
    g.add_argument("--export", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the job (repeatable; overrides the profile's env)")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch script(s); submit nothing")
    g.add_argument("--local", action="store_true", help="run here with submitit's local executor (no Slurm)")
    g.add_argument("--sweep", help="sweep YAML: submit its grid as job arrays, one per resource shape")
    g.add_argument("--max-parallel", type=int, help="at most N array tasks running at once")
    g.add_argument("--wait", action="store_true", help="wait for the job(s) and report how they ended")
    t = parser.add_argument_group("training (forwarded to hpc.train)")
    add_training_flags(t)
    return parser


@dataclasses.dataclass
class Submitted:
    job_id: str
    run_dir: Path
    logs: list[Path]
    job: Any
    point: dict | None = None


def _read_summary(run_dir: Path) -> dict:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _exports(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"command line: --export {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _run_layers(args: argparse.Namespace) -> Layers:
    layers = Layers()
    if args.config:
        layers.add_file(args.config)
    if args.sweep:
        layers.add_file(args.sweep)
    for dotted, value, source in overrides_from_args(args):
        if not dotted.startswith("cluster."):  # the cluster profile takes those
            layers.set(dotted, value, source)
    return layers


def _drop_placeholder(folder: Path) -> None:
    """submitit's local executor leaves the unexpanded '%j' folder behind, empty (its job process
    creates it again at start, so this runs once the job has ended)."""
    try:
        folder.rmdir()
    except OSError:
        pass  # not there, or not empty: leave it


def _describe(sub: Submitted) -> str:
    logs = ", ".join(str(p) for p in sub.logs)
    return f"job {sub.job_id}: run dir {sub.run_dir}\n  logs: {logs}"


def _job_record(job) -> Submitted:
    return Submitted(job.job_id, Path(job.paths.folder), [Path(job.paths.stdout), Path(job.paths.stderr)], job)


def _is_slurm_job(job) -> bool:
    from submitit.slurm.slurm import SlurmJob

    return isinstance(job, SlurmJob)


def _left_queue(sub: Submitted) -> bool:
    """True when Slurm no longer lists the job. Without slurmdbd, sacct cannot say that a job ended (so
    submitit's done() waits for a result file a killed job never writes); squeue can."""
    if not _is_slurm_job(sub.job) or not shutil.which("squeue"):
        return False
    q = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", sub.job_id.split("_")[0]],
                       capture_output=True, text=True)
    if q.returncode != 0:
        return "Invalid job id" in q.stderr
    return sub.job_id not in q.stdout.split()


def _ended(sub: Submitted) -> bool:
    if not _is_slurm_job(sub.job):
        return sub.job.done()
    return sub.job.paths.result_pickle.exists() or _left_queue(sub)  # no sacct call: see _left_queue


RUN_NUMBERS = ["rank", "steps", "cpu_time_us", "cuda_time_us", "kernel_calls", "peak_gpu_mem_bytes",
               "peak_cpu_mem_bytes"]


def print_run_numbers(run_dir: Path) -> None:
    """The run's numbers from its own traces, per rank: what a local run ends with (no torch import)."""
    from analysis.report import analyze_run, flush_warnings
    from analysis.tables import render

    traces, _ = analyze_run(run_dir)
    flush_warnings()
    if traces:
        print(f"profiled steps, per rank (python -m analysis {run_dir} for more):")
        print(render(sorted(traces, key=lambda r: (r.rank is None, r.rank or 0)), RUN_NUMBERS, "table"), end="")


def wait_for(subs: list[Submitted], poll_s: float = 2.0, follow: bool = False) -> int:
    """Wait until every job has ended; report each: its status, or FAILED with its log.
    With follow, rank 0's output is echoed as it comes (local runs)."""
    pending = list(subs)
    offsets: dict[Path, int] = {}

    def echo() -> None:
        for sub in subs:
            log = sub.logs[0]
            if log.exists():
                with open(log, errors="replace") as f:
                    f.seek(offsets.get(log, 0))
                    text = f.read()
                    offsets[log] = f.tell()
                sys.stdout.write("".join(line for line in text.splitlines(keepends=True) if not line.startswith("submitit ")))
                sys.stdout.flush()

    while pending:
        pending = [sub for sub in pending if not _ended(sub)]
        if follow:
            echo()
        if pending:
            time.sleep(poll_s if not follow else 0.5)
    failures = 0
    for sub in subs:
        try:
            if not sub.job.paths.result_pickle.exists():
                time.sleep(poll_s)  # a result written as the job left the queue
            if not sub.job.paths.result_pickle.exists():
                raise RuntimeError("no result: the job was killed or failed outside Python")
            result = sub.job.results()[0]  # task 0's; every task returns the same kind of record
            if follow and result.get("status") == "done":
                print_run_numbers(sub.run_dir)
            print(f"job {sub.job_id}: {result.get('status')}\n  run:     {sub.run_dir}\n"
                  f"  traces:  {sub.run_dir / 'traces'}\n  summary: {sub.run_dir / 'summary.json'}")
        except Exception as e:  # submitit re-raises the job's own exception here
            failures += 1
            lines = [line for line in str(e).strip().splitlines() if line.strip()]
            print(f"job {sub.job_id}: FAILED ({lines[-1] if lines else type(e).__name__}); see {sub.logs[0]}",
                  file=sys.stderr)
    return 1 if failures else 0


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One submission: a job shape and the runs it carries. A single job is a sweep of one point;
    a sweep has one spec per GPU count, each a job array of its points."""

    request: JobRequest
    folder: Path  # submitit's folder, with %j for the job id: each run directory
    points: tuple  # ((point or None, RunConfig), ...)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = make_plan(args)
    if args.dry_run:
        print_plan(plan)
        return 0
    return execute(plan, wait=args.wait)


def load_cluster_for(args: argparse.Namespace) -> ClusterConfig:
    overrides = overrides_from_args(args)
    for dotted, _, source in overrides:
        require_section(dotted, RUN_SECTIONS + ("cluster",) + (("sweep",) if args.sweep else ()), source)
    cluster = load_cluster(args.profile or ("local" if args.local else "perlmutter"),
                           [o for o in overrides if o[0].startswith("cluster.")])
    if args.local and cluster.max_nodes < args.nodes:
        raise ConfigError(f"command line: --nodes {args.nodes}: --local runs on this machine only (1 node)")
    if args.max_parallel is not None and args.max_parallel < 1:
        raise ConfigError(f"command line: --max-parallel {args.max_parallel}: must be >= 1")
    if not args.local and cluster.scheduler != "slurm":
        raise ConfigError(f"profile {cluster.name!r}: scheduler is {cluster.scheduler!r}; use --local")
    if not args.local and not args.dry_run and not shutil.which("sbatch"):
        raise UsageError("sbatch not found on this machine: submit from a Slurm login node, or run here with --local")
    return cluster


def make_plan(args: argparse.Namespace) -> Plan:
    """The job specs for a command line: every shape and every point validated, nothing written."""
    cluster = load_cluster_for(args)
    time_min = args.time if args.time is not None else cluster.time_limit_min
    layers = _run_layers(args)
    base = layers.run_config()  # validates the run config before anything is submitted
    sweep = layers.build("sweep") if args.sweep else None
    if args.name is not None:
        check_name(args.name, "command line: --name")
    name = args.name if args.name is not None else (sweep.name if sweep else base.model.arch)
    exports = _exports(args.export)
    runs_dir = Path(args.runs_dir).absolute()
    check_output_dir(runs_dir, "command line: --runs-dir")

    def request(nodes: int, gpus: int, job_name: str, source: str) -> JobRequest:
        check_request(cluster, nodes, gpus, time_min, source=source)
        return JobRequest(nodes, gpus, time_min, job_name, args.account, args.qos, args.partition, exports)

    if sweep is None:
        gpus = args.gpus if args.gpus is not None else cluster.gpus_per_node
        spec = JobSpec(request(args.nodes, gpus, name, "command line"), runs_dir / name / "%j", ((None, base),), False)
        return Plan(cluster, (spec,), args.local, base)
    sweep_dir = runs_dir / name / dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    specs = sweep_specs(sweep_points(sweep, layers), request, name, sweep_dir, args.sweep)
    return Plan(cluster, specs, args.local, base, sweep, sweep_dir, args.max_parallel)


def sweep_specs(points: list[tuple[dict, RunConfig]], request, name: str, sweep_dir: Path,
                source: str) -> tuple[JobSpec, ...]:
    """One job array per job shape (nodes x GPUs per node) of the points; every shape is checked
    (`request`) before anything is submitted."""
    by_shape: dict[tuple[int, int], list] = {}
    for point, cfg in points:
        by_shape.setdefault((point["nodes"], point["gpus"]), []).append((point, cfg))
    return tuple(JobSpec(request(nodes, gpus, f"{name}-{nodes}n{gpus}g" if nodes > 1 else f"{name}-{gpus}gpu",
                                 f"{source}: sweep.nodes={nodes}, sweep.gpus={gpus}"),
                         sweep_dir / "%j", tuple(group), True) for (nodes, gpus), group in by_shape.items())


def sweep_points(sweep: SweepConfig, layers: Layers) -> list[tuple[dict, RunConfig]]:
    """Every (data fraction, batch size, GPUs per node, nodes) point with its validated run config."""
    points = []
    for nodes in sweep.nodes:
        for gpus in sweep.gpus:
            for fraction in sweep.data_fractions:
                for batch in sweep.batch_sizes:
                    layers.set("data.fraction", fraction, f"sweep point fraction={fraction:g}")
                    layers.set("train.batch_size", batch, f"sweep point batch={batch}")
                    points.append(({"data_fraction": fraction, "batch_size": batch, "gpus": gpus,
                                    "nodes": nodes}, layers.run_config()))
    return points


def executor_for(plan: Plan, spec: JobSpec):
    return make_executor(plan.cluster, spec.request, spec.folder, plan.local, max_parallel=plan.max_parallel)


def print_plan(plan: Plan) -> None:
    """--dry-run: the sbatch script of every spec (what submitit would hand to sbatch), submitting nothing."""
    for spec in plan.specs:
        executor = executor_for(plan, spec)
        if spec.array:
            print(f"# array of {len(spec.points)} points at {spec.request.nodes} node(s) x {spec.request.gpus} GPU(s)")
            print(sbatch_text(executor, map_count=len(spec.points)) if not plan.local
                  else "# --local: points run one by one")
        elif plan.local:
            print(f"# --local: {spec.request.gpus} task(s) of {executor._submitit_command_str}")
        else:
            print(sbatch_text(executor), end="")


def execute(plan: Plan, wait: bool) -> int:
    """Submit every spec: here one point at a time (each waited for), on Slurm each spec at once (an
    array for a sweep). Returns 0, or 1 when a job that was waited for failed."""
    if plan.sweep_dir is not None:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(plan.sweep_dir / "sweep.yaml",
                     dump_yaml({"sweep": dataclasses.asdict(plan.sweep), **plan.base.to_dict()}))
    subs: list[Submitted] = []
    failures = 0
    for spec in plan.specs:
        executor = executor_for(plan, spec)
        if plan.local:  # this machine: one point at a time, followed as it runs
            for point, cfg in spec.points:
                subs.extend(submit_points(plan, executor, ((point, cfg),), batch=False, gpus=spec.request.gpus))
                failures += wait_for(subs[-1:], follow=True)
                _drop_placeholder(spec.folder)
                record_index(plan, subs)
            continue
        subs.extend(submit_points(plan, executor, spec.points, batch=spec.array, gpus=spec.request.gpus))
        record_index(plan, subs)
    if plan.sweep_dir is not None:
        print(f"sweep: {len(subs)} points, index {plan.sweep_dir / 'index.json'}")
    if wait and not plan.local:
        failures = wait_for(subs)
        for spec in plan.specs:
            _drop_placeholder(spec.folder)
    return 1 if failures else 0


def submit_points(plan: Plan, executor, points, batch: bool, gpus: int) -> list[Submitted]:
    """Submit the points' TrainJobs (as one array when `batch`) and say where each runs."""
    with executor.batch() if batch else contextlib.nullcontext():
        jobs = [executor.submit(TrainJob(cfg.to_dict(), plan.cluster.max_requeues, plan.cluster.launcher,
                                         gpus, plan.cluster.max_restarts)) for _, cfg in points]
    subs = []
    for job, (point, _) in zip(jobs, points):
        sub = _job_record(job)
        sub.point = point
        print(_describe(sub), flush=True)
        subs.append(sub)
    return subs


def record_index(plan: Plan, subs: list[Submitted]) -> None:
    if plan.sweep_dir is not None:
        _write_index(plan.sweep_dir, plan.sweep, plan.cluster, subs)


POINT_KEY = ("data_fraction", "batch_size", "gpus", "nodes")


def point_key(point: dict) -> tuple:
    return tuple(point.get(k, 1 if k == "nodes" else None) for k in POINT_KEY)


def _write_index(sweep_dir: Path, sweep: SweepConfig, cluster: ClusterConfig, subs: list[Submitted]) -> None:
    """index.json: every point with its job id and run directory. Points submitted again (`hpc.study
    resubmit`) replace their earlier entry, whose job ids are kept in `history`."""
    try:
        earlier = json.loads((sweep_dir / "index.json").read_text()).get("points", [])
    except (OSError, ValueError, AttributeError):
        earlier = []
    points = {point_key(p): p for p in earlier if isinstance(p, dict)}
    for s in subs:
        old = points.get(point_key(s.point)) or {}
        history = list(old.get("history", []))
        if old.get("job_id") not in (None, s.job_id):
            history.append(old["job_id"])
        points[point_key(s.point)] = {**s.point, "job_id": s.job_id, "run_dir": s.run_dir.name,
                                      **({"history": history} if history else {})}
    index = {"sweep": dataclasses.asdict(sweep), "cluster": cluster.name, "points": list(points.values())}
    write_atomic(sweep_dir / "index.json", json.dumps(index, indent=2))


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.submit`, or its console script): errors as one line, exit 2."""
    from hpc.cli import run

    return run("hpc.submit", main, argv)


if __name__ == "__main__":
    from hpc import submit  # the imported module, so its error classes are the ones hpc.cli catches

    sys.exit(submit.cli())
