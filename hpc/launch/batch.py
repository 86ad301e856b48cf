"""The batch shell of a hand-written sbatch script: `python -m hpc.batch [options] -- COMMAND [ARG ...]`, what
jobs/run.sbatch (your own command) and jobs/resnet152.sbatch (the toolkit's training, `python -m
hpc.train`) run after their #SBATCH lines and `module load`. Everything the two scripts do is here, once:

1. the profile's environment for the job's shape (a variable already set in the job wins) and srun's
   extra words (CPU binding, the container: hpc/launch/submission/site.py), as `hpc.submit` takes them;
2. the run directory: --run-dir, or the training's own --run-dir among its words, else
   $SCRATCH/hpc-resnet-study/runs/<name>/<job id> (./runs without $SCRATCH);
3. the task (hpc/settings/rankcommand.py) written to RUN/task.json, then one srun step: each task `python -m
   hpc.rank --run-dir RUN` (the per-rank runner), or with HPC_LAUNCHER=torchrun one torchrun per node
   whose workers are those runners, or with HPC_LAUNCHER=node one runner per node whose command uses
   every GPU of it (a DataParallel script);
4. after the step, one line saying how the run ended (the first failing rank named), and the requeue
   rule of every job (hpc/launch/requeue.py `may_requeue`: a requeue code, not a person's stop,
   requeues left: HPC_MAX_REQUEUES or the profile's max_requeues), applied with scontrol here in the
   batch shell, outside any container. A SIGTERM that reaches this shell (the end of a preemption's
   grace time, a `scancel`) makes srun kill the tasks at once: the run is requeued all the same, to
   resume from what its task last saved.

`--dry-run` prints the srun words and the task instead of running them. No torch import.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, check_run_dir, run
from hpc.core.ending import Outcome
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, UsageError
from hpc.core.rundir import RunPaths
from hpc.core.summary import exit_code_of, restarts_line, root_cause, write_run_summary
from hpc.launch.rank.rankcli import command_sections
from hpc.launch.rank.runner import write_task
from hpc.launch.requeue import ALREADY, may_requeue, not_to_requeue, requeue_code
from hpc.launch.submission.site import job_env, srun_words
from hpc.placement.distenv import slurm_torchrun_args
from hpc.placement.torchrun import AGENT_ENV
from hpc.settings.cluster import ONE_TASK_PER_NODE
from hpc.settings.config import load_cluster
from hpc.settings.rankcommand import RankCommand, check_command, runs_training, user_command
from hpc.settings.schema import ClusterConfig

log = logging.getLogger(__name__)


def parse(argv: list[str]) -> tuple[Any, list[str]]:
    words = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = Parser(prog="python -m hpc.batch", description=__doc__.split("\n\n")[0], needs_args=not argv)
    parser.add_argument("--name", help="the runs directory's folder (default: the command's script or module)")
    parser.add_argument("--run-dir", help="the run directory (default: see the module doc)")
    parser.add_argument("--profile", help="cluster profile (default: $HPC_PROFILE, else perlmutter)")
    parser.add_argument("--config", help="a config YAML whose profiler section applies to your own command")
    parser.add_argument("--no-profile", action="store_true", help="do not profile your own command")
    parser.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not words:
        raise UsageError("command line: --: no command after it (e.g. -- python train.py --epochs 3)")
    return args, words


def run_dir_for(args: Any, words: list[str], env: Mapping[str, str], name: str) -> Path:
    """--run-dir, the training's own --run-dir, else the runs directory's <name>/<job id>."""
    if args.run_dir:
        return Path(args.run_dir)
    if runs_training(words):
        for i, word in enumerate(words):
            if word == "--run-dir" and i + 1 < len(words):
                return Path(words[i + 1])
            if word.startswith("--run-dir="):
                return Path(word.split("=", 1)[1])
    runs = f"{env['SCRATCH']}/hpc-resnet-study/runs" if env.get("SCRATCH") else "runs"
    return Path(runs) / name / (env.get("SLURM_JOB_ID") or "here")


def step_words(cluster: ClusterConfig, run_dir: Path, env: Mapping[str, str]) -> list[str]:
    """The job's one srun step: a runner per task, or torchrun per node over runners."""
    rank = ["-m", "hpc.rank", "--run-dir", str(run_dir)]
    srun = ["srun", "--kill-on-bad-exit=1"]
    launcher = env.get("HPC_LAUNCHER", "srun")
    if launcher not in ONE_TASK_PER_NODE:
        return [*srun, *srun_words(cluster), "python", *rank]
    nodes = int(env.get("SLURM_NNODES") or 1)
    nproc = int(env.get("SLURM_NTASKS_PER_NODE", "4").split("(")[0])
    cpus = int(env.get("SLURM_CPUS_PER_TASK") or 1) * nproc
    per_node = ["--ntasks-per-node=1", f"--ntasks={nodes}", f"--cpus-per-task={cpus}"]
    if launcher == "node":  # one process a node with every GPU of it (nn.DataParallel)
        return [*srun, *per_node, *srun_words(cluster), "python", *rank]
    torchrun = slurm_torchrun_args(env, nproc, int(env.get("HPC_MAX_RESTARTS") or cluster.max_restarts))
    return [*srun, *per_node, *srun_words(cluster), "python", "-m", "torch.distributed.run", *torchrun, *rank]


def job_environment(cluster: ClusterConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The profile's environment for this job's shape (and torchrun's agent's, where it runs), under what
    the job already set."""
    nodes = int(env.get("SLURM_NNODES") or 1)
    gpus = int(env.get("SLURM_NTASKS") or 1) // max(nodes, 1)
    agent = AGENT_ENV if env.get("HPC_LAUNCHER") == "torchrun" else {}
    return {**agent, **job_env(cluster, nodes, gpus), **env}


def main(argv: list[str] | None = None) -> int:
    args, words = parse(sys.argv[1:] if argv is None else list(argv))
    env = dict(os.environ)
    cluster = load_cluster(args.profile or env.get("HPC_PROFILE") or "perlmutter")
    check_command(words, Path.cwd(), in_image=bool(cluster.image))
    profiler, hang_timeout_s = command_sections(args.config, args.no_profile, [])
    task = user_command(words, os.getcwd(), profiler, cluster.stop_grace_s, hang_timeout_s=hang_timeout_s)
    run_dir = run_dir_for(args, words, env, args.name or task.name)
    check_run_dir(run_dir)
    env = job_environment(cluster, env)
    step = step_words(cluster, run_dir, env)
    if args.dry_run:
        print(f"# each rank runs: {' '.join(shlex.quote(w) for w in words)}\n{' '.join(shlex.quote(w) for w in step)}")
        return EXIT_OK
    write_task(RunPaths(run_dir), task)
    log.info(
        f"job {env.get('SLURM_JOB_ID')} (restart {env.get('SLURM_RESTART_COUNT') or 0}) on "
        f"{env.get('SLURM_JOB_NODELIST')}: {env.get('SLURM_NTASKS')} tasks; run dir {run_dir}"
    )
    rc, terminated = run_step(step, env)
    return requeue_after_step(task, run_dir, rc, terminated, env, cluster)


def run_step(step: list[str], env: Mapping[str, str]) -> tuple[int, bool]:
    """srun to its end; whether a SIGTERM reached this shell meanwhile (srun got it too)."""
    terminated: list[int] = []

    def noted(signum: int, frame: Any) -> None:
        terminated.append(signum)  # said with os.write: a signal handler must not take logging's lock
        os.write(1, b"SIGTERM (preempted or cancelled): the ranks stop and save what they can\n")

    previous = signal.signal(signal.SIGTERM, noted)
    try:
        rc = subprocess.run(step, env=dict(env)).returncode
    finally:
        signal.signal(signal.SIGTERM, previous)
    return rc, bool(terminated)


def run_code(summary: Mapping[str, Any], rc: int, terminated: bool) -> int:
    """The run's exit code, from its ranks' records: a stopped rank's (its requeue code), the first
    failing rank's (128 + N for a signal N), 3 when srun killed the tasks on the batch shell's own
    SIGTERM (they resume from what their task last saved), else srun's."""
    ranks = list(summary.get("ranks", []))
    if terminated and rc > 128:
        log.info(f"srun ended the tasks on SIGTERM (exit {rc}): they resume from what their task last saved")
        return EXIT_PREEMPTED
    cause = root_cause(ranks)
    if cause is not None:
        return exit_code_of(cause)
    stopped = [code for code in map(requeue_code, ranks) if code is not None]
    return stopped[0] if stopped else (EXIT_OK if summary.get("outcome") == Outcome.DONE else rc or EXIT_FAILED)


def requeue_after_step(
    task: RankCommand, run_dir: Path, rc: int, terminated: bool, env: Mapping[str, str], cluster: ClusterConfig
) -> int:
    """How the run ended, in one line, then the requeue rule; the batch shell's exit code."""
    summary = write_run_summary(RunPaths(run_dir), ended=True) or {}  # srun ended: every task has
    outcome = summary.get("outcome") or "no rank started"
    log.info(f"hpc.batch: {run_dir}: {outcome}" + (f": {summary['failure']}" if summary.get("failure") else ""))
    restarted = restarts_line(summary)
    if restarted:
        log.info(f"hpc.batch: {restarted}")
    code = run_code(summary, rc, terminated)
    if code not in task.requeue_codes:
        return code
    job = env.get("SLURM_JOB_ID") or ""
    budget = int(env.get("HPC_MAX_REQUEUES") or cluster.max_requeues)
    if not may_requeue(code, task.requeue_codes, None, env, budget):
        restarts = env.get("SLURM_RESTART_COUNT") or 0
        log.warning(f"stopped after {restarts} requeues (HPC_MAX_REQUEUES={budget}); resume by resubmitting")
        return code
    why_not = not_to_requeue(job, env)
    if why_not is not None:  # requeued by another already (its end is that start's), or cancelled
        log.info(f"job {job} {why_not}")
        return EXIT_OK if why_not == ALREADY else code
    log.info(f"the task asked to be requeued (exit {code}): requeueing job {job}")
    said = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if said.returncode == 0:
        return EXIT_OK
    words = " ".join((said.stdout + said.stderr).split()) or "no message"
    log.warning(f"job {job} could not requeue itself (scontrol: {words}); resubmit the same command to resume")
    return code


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.batch`): errors as one line, exit 2."""
    return run("hpc.batch", main, argv)
