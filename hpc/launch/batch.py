"""Every Slurm job's batch shell, one road (`run_job`): `python -m hpc.batch [options] -- COMMAND [ARG ...]`,
what jobs/run.sbatch (your own command) and jobs/resnet152.sbatch (the toolkit's training, `python -m
hpc.train`) run after their #SBATCH lines and `module load`, and `BatchJob`, what `hpc.submit`'s jobs run
there through submitit. Everything a job does is here, once:

1. the profile's environment for the job's shape (a variable already set in the job wins) and srun's
   extra words (CPU binding, the container: hpc/launch/submission/site.py), as `hpc.submit` takes them;
2. the run directory: --run-dir, or the training's own --run-dir among its words, else
   $SCRATCH/hpc-resnet-study/runs/<name>/<job id> (./runs without $SCRATCH); submitit's folder for its job;
3. the task (hpc/settings/rankcommand.py) written to RUN/task.json, then one srun step (`step_words`, the
   one builder of it): each task `python -m hpc.rank --run-dir RUN` (the per-rank runner), or with
   HPC_LAUNCHER=torchrun one torchrun per node whose workers are those runners, or with HPC_LAUNCHER=node
   one runner per node whose command uses every GPU of it (a DataParallel script); the job's warning
   (SIGUSR2 to this shell) passed on to the tasks as SIGTERM meanwhile (hpc/launch/requeue.py `JobSignals`);
4. after the step, the one requeue executor (hpc/launch/requeue.py `requeue_after_step`): one line saying
   how the run ended (the first failing rank named), then the requeue rule (after the warning, a run that
   saved; never after a person's stop; requeues left: HPC_MAX_REQUEUES or the profile's max_requeues),
   applied with scontrol here in the batch shell, outside any container. The job's exit code is 0 only
   when its run finished.

`--dry-run` prints the srun words and the task instead of running them.

The same step serves `hpc.submit` inside an interactive allocation (salloc; `allocation_here`): the run
is one srun step of that allocation (`run_in_allocation`), sized to what it asks, in RUNS/<name>/<job
id>.<n>, its end said as a followed run's; an interactive job is not requeued. No torch import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hpc.core.cli import Parser, check_run_dir, run
from hpc.core.ending import RESUMABLE, Outcome, RankCommand
from hpc.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from hpc.core.logs import TO_STDERR, configure
from hpc.core.owner import make_dirs, make_new_dir
from hpc.core.rundir import JobRecord, RunPaths, drop_unexpanded, write_job_record
from hpc.core.stop import Caught, interrupts_ignored
from hpc.core.summary import CodeFor, attempt_job, attempt_of, run_exit_code, write_run_summary
from hpc.launch.rank.rankcli import command_task
from hpc.launch.rank.runner import write_task
from hpc.launch.requeue import JobSignals, StepEnd, requeue_after_step
from hpc.launch.submission.follow import print_ended
from hpc.launch.submission.request import Allocation
from hpc.launch.submission.site import job_env, srun_words
from hpc.placement.distenv import slurm_torchrun_args
from hpc.placement.torchrun import AGENT_ENV
from hpc.settings.cluster import ONE_TASK_PER_NODE
from hpc.settings.config import load_cluster
from hpc.settings.rankcommand import check_command, runs_training, words_for
from hpc.settings.schema import ClusterConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchRequest:
    """What `python -m hpc.batch` was asked, past its command line: the command, and its options."""

    words: list[str]  # the command after --
    name: str | None  # the runs directory's folder
    run_dir: Path | None
    profile: str | None
    config: str | None  # a config YAML whose profiler section applies to the command
    no_profile: bool
    dry_run: bool


def parse(argv: list[str]) -> BatchRequest:
    words = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = Parser(
        prog="python -m hpc.batch",
        usage="%(prog)s [options] -- COMMAND [ARG ...]",
        description="The batch shell of jobs/run.sbatch and jobs/resnet152.sbatch, after their #SBATCH lines and "
        "`module load`: COMMAND (after --) on every task of the job as one srun step of the per-rank runner, one "
        "line on how the run ended, and the job requeued when it stopped with a checkpoint.",
        epilog="Variables: HPC_PROFILE (the cluster profile), HPC_LAUNCHER=torchrun|node (one torchrun, or one "
        "process, a node), HPC_MAX_REQUEUES, HPC_MAX_RESTARTS (python -m hpc.config --variables). The run directory: "
        "--run-dir, the training's own --run-dir, else $SCRATCH/hpc-resnet-study/runs/<name>/<job id>.",
        needs_args=not argv,
    )
    parser.add_argument("--name", help="the runs directory's folder (default: the command's script or module)")
    parser.add_argument("--run-dir", help="the run directory (default: below)")
    parser.add_argument("--profile", help="cluster profile (default: $HPC_PROFILE, else perlmutter)")
    parser.add_argument("--config", help="a config YAML whose profiler section applies to your own command")
    parser.add_argument("--no-profile", action="store_true", help="do not profile your own command")
    parser.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not words:
        raise UsageError("command line: --: no command after it (e.g. -- python train.py --epochs 3)")
    return BatchRequest(
        words,
        args.name,
        Path(args.run_dir) if args.run_dir else None,
        args.profile,
        args.config,
        args.no_profile,
        args.dry_run,
    )


def run_dir_for(given: Path | None, words: list[str], env: Mapping[str, str], name: str) -> Path:
    """--run-dir (`given`), the training's own --run-dir, else the runs directory's <name>/<job id>."""
    if given is not None:
        return given
    if runs_training(words):
        for i, word in enumerate(words):
            if word == "--run-dir" and i + 1 < len(words):
                return Path(words[i + 1])
            if word.startswith("--run-dir="):
                return Path(word.split("=", 1)[1])
    runs = f"{env['SCRATCH']}/hpc-resnet-study/runs" if env.get("SCRATCH") else "runs"
    return Path(runs) / name / (env.get("SLURM_JOB_ID") or "here")


@dataclasses.dataclass(frozen=True)
class Step:
    """One srun step of the per-rank runner: its launcher, nodes, GPUs (tasks) per node and CPUs a GPU;
    `sized` names that shape to srun (inside an allocation, which may hold more than the run asks)."""

    launcher: str
    nodes: int
    gpus: int
    cpus: int | None  # None: Slurm's own, the job's
    sized: bool = False
    python: str = "python"  # what each task's runner runs under (a container's own, or the module's)


def job_step(env: Mapping[str, str]) -> Step:
    """The batch job's own step, from its variables (HPC_LAUNCHER: the sbatch script's choice): a rank a
    GPU, as many a node as both --ntasks-per-node and --gpus-per-node allow. sbatch's -N 1 --gpus-per-node=2
    leaves the script's --ntasks-per-node=4 in force: the step is sized to the 2 GPUs then, and says so."""
    tasks = _first_int(env.get("SLURM_NTASKS_PER_NODE")) or 4
    gpus = min(tasks, _first_int((env.get("SLURM_GPUS_PER_NODE") or "").rsplit(":", 1)[-1]) or tasks)
    launcher = env.get("HPC_LAUNCHER", "srun")
    sized = gpus != tasks and launcher not in ONE_TASK_PER_NODE
    if sized:
        log.info(f"hpc.batch: --gpus-per-node={gpus}: {gpus} rank(s) a node, not --ntasks-per-node's {tasks}")
    return Step(launcher, int(env.get("SLURM_NNODES") or 1), gpus, int(env.get("SLURM_CPUS_PER_TASK") or 1), sized)


def rank_words(python: str, run_dir: Path, torchrun: list[str] | None = None) -> list[str]:
    """What a task runs, on every road (a Slurm step's task, an allocation's, a local run's: job.py): the
    per-rank runner on the run directory, or with `torchrun`'s arguments torchrun's agent, whose workers are
    those runners. How a rank starts is written here alone."""
    rank = [python, "-m", "hpc.rank", "--run-dir", str(run_dir)]
    return rank if torchrun is None else [python, "-m", "hpc.launch.rank.agent", *torchrun, *rank[1:]]


def step_words(cluster: ClusterConfig, run_dir: Path, step: Step, env: Mapping[str, str]) -> list[str]:
    """The job's one srun step: a runner per task, or torchrun per node over runners. The step takes the
    batch shell's environment where sbatch was told not to pass the submitter's on (its --export, which
    srun inherits: without ALL, srun would start the tasks without it)."""
    exports = env.get("SLURM_EXPORT_ENV")
    srun = ["srun", "--kill-on-bad-exit=1", *(["--export=ALL"] if exports and "ALL" not in exports.split(",") else [])]
    nodes = [f"--nodes={step.nodes}"] if step.sized else []
    if step.launcher not in ONE_TASK_PER_NODE:
        cpus = [f"--cpus-per-task={step.cpus}"] if step.sized and step.cpus else []
        tasks = [*nodes, f"--ntasks-per-node={step.gpus}", *cpus] if step.sized else []
        return [*srun, *tasks, *srun_words(cluster), *rank_words(step.python, run_dir)]
    per_node = [
        *nodes,
        "--ntasks-per-node=1",
        f"--ntasks={step.nodes}",
        f"--cpus-per-task={(step.cpus or 1) * step.gpus}",
    ]
    if step.launcher == "node":  # one process a node with every GPU of it (nn.DataParallel)
        return [*srun, *per_node, *srun_words(cluster), *rank_words(step.python, run_dir)]
    restarts = int(env.get("HPC_MAX_RESTARTS") or cluster.max_restarts)
    torchrun = slurm_torchrun_args({**env, "SLURM_NNODES": str(step.nodes)}, step.gpus, restarts)
    return [*srun, *per_node, *srun_words(cluster), *rank_words(step.python, run_dir, torchrun)]


def step_preview(cluster: ClusterConfig, run_dir: Path, step: Step, export: str | None) -> str:
    """The step a job's batch shell runs, as a dry run says it (sbatch's --export as the job's variable);
    torchrun's rendezvous is the job's own, known once it runs."""
    if step.launcher == "torchrun":
        return f"srun ... torchrun a node, its workers: {step.python} -m hpc.rank --run-dir {shlex.quote(str(run_dir))}"
    env = {"SLURM_EXPORT_ENV": export} if export else {}
    return shlex.join(step_words(cluster, run_dir, step, env))


INTERACTIVE_STEP_ID = "4294967290"  # SLURM_INTERACTIVE_STEP: salloc's shell on a node (use_interactive_step)


def allocation_here(env: Mapping[str, str]) -> Allocation | None:
    """The interactive allocation of this process's environment: a job (SLURM_JOB_ID) and no step of it, or
    salloc's interactive step (NERSC's LaunchParameters=use_interactive_step puts the shell on the first
    node); None outside a job, in a batch script (ENVIRONMENT=BATCH: a job submitting another) or a step."""
    job = env.get("SLURM_JOB_ID")
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if not job or env.get("ENVIRONMENT") == "BATCH" or step not in (None, INTERACTIVE_STEP_ID):
        return None
    nodes = _first_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")) or 1
    gpus = _first_int((env.get("SLURM_GPUS_PER_NODE") or "").rsplit(":", 1)[-1])
    per_job = _first_int((env.get("SLURM_GPUS") or "").rsplit(":", 1)[-1])  # salloc --gpus [TYPE:]N: the job's
    if gpus is None and per_job:
        gpus = per_job // nodes or None
    return Allocation(job, nodes, gpus, _first_int(env.get("SLURM_JOB_CPUS_PER_NODE")))


def _first_int(text: str | None) -> int | None:
    """The first number of a Slurm count ("4", "128(x2)", "64,32"), None without one."""
    found = re.match(r"\d+", text or "")
    return int(found.group()) if found else None


def job_environment(cluster: ClusterConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The profile's environment for this job's shape, under what the job already set."""
    nodes = int(env.get("SLURM_NNODES") or 1)
    gpus = int(env.get("SLURM_NTASKS") or 1) // max(nodes, 1)
    return {**job_env(cluster, nodes, gpus), **env}


def main(argv: list[str] | None = None) -> int:
    req = parse(sys.argv[1:] if argv is None else list(argv))
    words = req.words
    env = dict(os.environ)
    cluster = load_cluster(req.profile or env.get("HPC_PROFILE") or "perlmutter")
    check_job_account(cluster, env)
    check_command(words, Path.cwd(), in_image=bool(cluster.image))
    task = command_task(words, req.config, req.no_profile, [], cluster.stop_grace_s)
    run_dir = run_dir_for(req.run_dir, words, env, req.name or task.name)
    check_run_dir(run_dir)
    env = job_environment(cluster, env)
    shape = job_step(env)
    if req.dry_run:
        step = step_words(cluster, run_dir, shape, env)
        print(f"# each rank runs: {' '.join(shlex.quote(w) for w in words)}\n{' '.join(shlex.quote(w) for w in step)}")
        return EXIT_OK
    record = JobRecord(
        nodes=shape.nodes,
        gpus=shape.gpus,
        profile=cluster.name,
        name=env.get("SLURM_JOB_NAME"),
        account=env.get("SLURM_JOB_ACCOUNT"),
        qos=env.get("SLURM_JOB_QOS"),
        partition=env.get("SLURM_JOB_PARTITION"),
    )
    return run_job(task, RunPaths(run_dir), cluster, shape, env, record, "hpc.batch")


def check_job_account(cluster: ClusterConfig, env: Mapping[str, str]) -> None:
    """The job's account against the profile's rule, as hpc.submit checks it before sbatch (a hand-written
    script is submitted before anything of ours runs): a GPU job charged elsewhere stops here, in one line."""
    account, suffix = env.get("SLURM_JOB_ACCOUNT"), cluster.account_suffix
    if account and suffix and not account.endswith(suffix):
        raise UsageError(
            f"job {env.get('SLURM_JOB_ID')}: account {account!r} (sbatch -A): profile {cluster.name!r} charges GPU "
            f"jobs to a GPU allocation, whose account ends with {suffix!r}: sbatch -A {account}{suffix} ..."
        )


def run_job(
    task: RankCommand,
    paths: RunPaths,
    cluster: ClusterConfig,
    shape: Step,
    env: Mapping[str, str],
    record: JobRecord,
    door: str,
) -> int:
    """Every Slurm job's one road, in its batch shell (a hand-written script's `python -m hpc.batch`, and
    submitit's job, `BatchJob`): the task written to RUN/task.json and the job to RUN/job.json (what
    `hpc.submit --resume` submits again), one srun step of the per-rank runner
    (`step_words`), the job's signals told apart meanwhile (hpc/launch/requeue.py `JobSignals`), then the
    one requeue executor. The job's exit code: 0 only for a run that finished. The budget of requeues:
    HPC_MAX_REQUEUES, else the profile's max_requeues."""
    write_task(paths, task)
    write_job_record(paths, record)
    log.info(
        f"job {env.get('SLURM_JOB_ID')} (restart {env.get('SLURM_RESTART_COUNT') or 0}) on "
        f"{env.get('SLURM_JOB_NODELIST')}: {shape.nodes} node(s) x {shape.gpus} GPU(s); run dir {paths.root}"
    )
    budget = int(env.get("HPC_MAX_REQUEUES") or cluster.max_requeues)
    env = step_env(shape, env)
    with JobSignals(env.get("SLURM_JOB_ID") or "") as signals:
        rc = run_step(step_words(cluster, paths.root, shape, env), env, signals)
        end = StepEnd(attempt_job(attempt_of(env)), rc, warned=signals.warned, ended=signals.ended)  # as ranks name it
        return requeue_after_step(paths, task.requeue_codes, end, env, budget, door, signals)


def step_env(shape: Step, env: Mapping[str, str]) -> dict[str, str]:
    """The step's environment: the job's, over torchrun's agents' own where they run (a store of its own for
    each start of the group)."""
    return {**(AGENT_ENV if shape.launcher == "torchrun" else {}), **env}


def run_step(step: list[str], env: Mapping[str, str], signals: JobSignals) -> int:
    """srun to its end, its exit code; the job's warning passed on to its tasks meanwhile (`signals`)."""
    proc = subprocess.Popen(step, env=dict(env))
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=0.5)
        signals.tell_tasks()


class BatchJob:
    """What submitit runs in a job's batch shell (its script execs python there: `use_srun` off,
    hpc/launch/submission/slurm.py), the same road as `python -m hpc.batch`: `run_job` in submitit's folder
    (the run directory). A run that did not finish ends the job with its code (raised past submitit, which
    keeps no result then: the run's records say how it ended)."""

    def __init__(self, task: RankCommand, cluster: ClusterConfig, shape: Step, record: JobRecord):
        self.task = task
        self.cluster = cluster
        self.shape = shape
        self.record = record

    def __call__(self) -> str:
        import submitit

        configure()  # HPC_LOG_LEVEL, exported with the job
        paths = RunPaths(Path(submitit.JobEnvironment().paths.folder))
        code = run_job(self.task, paths, self.cluster, self.shape, os.environ, self.record, "hpc.submit")
        drop_unexpanded(paths.root)
        if code != EXIT_OK:
            raise SystemExit(code)
        return str(Outcome.DONE)


def allocation_step(here: Allocation, cluster: ClusterConfig, nodes: int, gpus: int, env: Mapping[str, str]) -> Step:
    """The step a run of `nodes` x `gpus` takes in the allocation: all of its nodes (a run's ranks meet on
    its nodes), at most its GPUs; CPUs a GPU as the allocation says (-c), else its node's shared out."""
    way = "ask salloc for it, or submit a new job: --new-job"
    if nodes != here.nodes:
        raise UsageError(f"command line: --nodes {nodes}: allocation {here.job_id} has {here.nodes} node(s); {way}")
    if here.gpus is not None and gpus > here.gpus:
        raise UsageError(f"command line: --gpus {gpus}: allocation {here.job_id} has {here.gpus} per node; {way}")
    cpus = _first_int(env.get("SLURM_CPUS_PER_TASK")) or (
        here.cpus // gpus if here.cpus and here.cpus >= gpus else None
    )
    return Step(cluster.launcher, nodes, gpus, cpus, sized=True)


def new_step_dir(runs: Path, job_id: str) -> Path:
    """RUNS/<job id>.<n>: a run of its own for each start in the allocation, the first free n."""
    make_dirs(runs, "runs directory")
    n = 0
    while not make_new_dir(runs / f"{job_id}.{n}"):
        n += 1
    return runs / f"{job_id}.{n}"


def allocation_words(
    task: RankCommand, runs: Path, cluster: ClusterConfig, step: Step, exports: Mapping[str, str], dry_run: bool
) -> tuple[list[str], list[str], dict[str, str]]:
    """What each rank of a run in the allocation runs, the srun step that runs them, and its environment: the
    profile's for the shape, under this one, under the command line's --export values; the run directory
    made (a dry run: named, RUNS/<job id>.<n>)."""
    here = os.environ.get("SLURM_JOB_ID", "")
    agent = AGENT_ENV if step.launcher == "torchrun" else {}
    env = {**agent, **job_env(cluster, step.nodes, step.gpus), **os.environ, **exports}
    run_dir = runs / f"{here}.<n>" if dry_run else new_step_dir(runs, here)
    words = step_words(cluster, run_dir, step, env)
    words.insert(1, f"--job-name=hpc:{run_dir.parent.name}/{run_dir.name}")  # the step's name: how a stop finds it
    return words_for(task, run_dir, sys.executable), words, env


def run_in_allocation(
    task: RankCommand, runs: Path, cluster: ClusterConfig, step: Step, exports: Mapping[str, str]
) -> int:
    """hpc.submit inside an interactive allocation: the run as one srun step there (the batch shell's road:
    the per-rank runner on every task), its end said as a followed run's, and hpc.submit's exit code. A run
    that stopped resumes with the same step again (an interactive job is not requeued)."""
    _, words, env = allocation_words(task, runs, cluster, step, exports, dry_run=False)
    paths = RunPaths(Path(words[words.index("--run-dir") + 1]))
    run_dir = paths.root
    here = env.get("SLURM_JOB_ID", "")
    write_task(paths, task)
    log.info(
        f"hpc.submit: inside allocation {here} (salloc): the run is one srun step there; run dir {run_dir}",
        extra=TO_STDERR,
    )
    rc = run_step_here(words, env)
    summary = write_run_summary(paths, ended=True)
    if summary is None:
        log.error(f"hpc.submit: the step ended (srun exit {rc}) before any rank started; see {run_dir}")
        return EXIT_FAILED
    ended = print_ended(f"job {here}", paths, summary, numbers=True)
    if ended in RESUMABLE:
        log.info(f"hpc.submit: to resume it in an allocation: {shlex.join(words)}")
    return run_exit_code(ended, CodeFor.COMMAND)


def run_step_here(step: list[str], env: Mapping[str, str]) -> int:
    """srun in an interactive allocation, to its end; its exit code. Ctrl-C is srun's while its step runs
    (the terminal sends it to both): once, srun says how the tasks stand; twice within a second, it passes
    SIGINT on, as any salloc user knows. A SIGTERM to this process (`kill`, `timeout`) is Slurm's stop, sent
    to the step's processes as a preemption's is (`scancel --signal=TERM` of the step, found by its name):
    the ranks save and stop; a second one ends srun at once (srun's own SIGTERM kills the step)."""
    with Caught(signal.SIGTERM) as terms:
        proc = subprocess.Popen(step, env=dict(env))
        with interrupts_ignored():  # only now: srun itself must not inherit SIGINT ignored
            told = 0
            while proc.poll() is None:
                if len(terms.seen) > told:
                    told = len(terms.seen)
                    if told == 1:
                        stop_step(proc, step, env)
                    else:
                        proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
            return proc.returncode


def stop_step(proc: subprocess.Popen[bytes], step: list[str], env: Mapping[str, str]) -> None:
    """SIGTERM to every process of the step `step` runs (named by its --job-name), as Slurm stops a job."""
    name = next(w.split("=", 1)[1] for w in step if w.startswith("--job-name="))
    job = env.get("SLURM_JOB_ID", "")
    listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True, text=True)
    steps = [line.split()[0] for line in listed.stdout.splitlines() if line.split()[1:] == [name]]
    log.warning(f"hpc.submit: SIGTERM: the ranks stop and save what they can (step {' '.join(steps) or '?'})")
    if not steps:  # not started, or not listed: srun's own stop
        proc.terminate()
    for found in steps:
        subprocess.run(["scancel", "--signal=TERM", found], capture_output=True)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.batch`): errors as one line, exit 2."""
    return run("hpc.batch", main, argv)
