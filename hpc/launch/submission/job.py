"""The job submitit runs in every task of a local run (`hpc.submit --local`): `TaskJob`, one for every task
(the toolkit's training and a user's command alike: hpc/settings/rankcommand.py). A Slurm job runs in its
batch shell instead, one srun step of the same per-rank runner (hpc/launch/batch.py `BatchJob`).

Each task writes the run's task.json, then becomes what a Slurm step's task runs, the same words
(hpc/launch/batch.py `rank_words`): with one task per GPU the per-rank runner (`python -m hpc.rank`:
hpc/launch/rank/runner.py starts the task's process and records how it ended); with torchrun (one task)
torchrun's agent, whose workers are those runners, so the ranks are recorded alike; a worker that dies
restarts the group, which resumes from the task's own checkpoint. The task's process execs it (no level of
its own): Ctrl-C or SIGTERM to `hpc.submit --local` reaches every runner (hpc/launch/submission/follow.py),
which tells its task; the runner's exit code is the task's, and submitit's controller sees it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpc.core.ending import RankCommand
from hpc.core.meet import free_port
from hpc.core.rundir import RunPaths, drop_unexpanded
from hpc.launch.batch import rank_words
from hpc.launch.rank.runner import write_task
from hpc.placement.torchrun import AGENT_ENV, torchrun_args, torchrun_forwards_signals


class TaskJob:
    """The submitted callable: this task's rank (srun), or torchrun on this machine with `nproc_per_node`
    workers and `max_restarts` (the cluster profile's launcher). Its state is in the run directory, so
    running the same job again resumes it."""

    def __init__(self, task: RankCommand, launcher: str = "srun", nproc_per_node: int = 1, max_restarts: int = 0):
        self.task = task
        self.launcher = launcher
        self.nproc_per_node = nproc_per_node
        self.max_restarts = max_restarts

    def __call__(self) -> None:
        import submitit

        job = submitit.JobEnvironment()
        paths = RunPaths(Path(job.paths.folder))
        write_task(paths, self.task)
        if job.global_rank == 0:  # its submitter may be gone before the run ends (killed), or never wait for it
            drop_unexpanded(paths.root)
        words, env = self.words(paths, job.job_id)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(words[0], words, env)  # this process becomes the task's start, as on Slurm

    def words(self, paths: RunPaths, job_id: str) -> tuple[list[str], dict[str, str]]:
        """What this task runs, and its environment: the runner, or torchrun's agent meeting on this machine."""
        if self.launcher != "torchrun":
            return rank_words(sys.executable, paths.root), dict(os.environ)
        endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"  # one node, this machine's
        args = torchrun_args(1, self.nproc_per_node, endpoint, job_id, self.max_restarts, torchrun_forwards_signals())
        return rank_words(sys.executable, paths.root, args), {**AGENT_ENV, **os.environ}
