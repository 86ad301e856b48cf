"""The job submitit runs in every task of a local run (`hpc.submit --local`): `TaskJob`, one for every task
(the toolkit's training and a user's command alike: hpc/settings/rankcommand.py). A Slurm job runs in its
batch shell instead, one srun step of the same per-rank runner (hpc/launch/batch.py `BatchJob`).

With one task per GPU each task is one rank: the per-rank runner (hpc/launch/rank/runner.py) starts the
task's process and records how it ended. With torchrun (one task) the task runs torchrun, whose workers
are `python -m hpc.rank` on the run directory, a runner each, so the ranks are recorded alike; a worker
that dies restarts the group, which resumes from the task's own checkpoint. Ctrl-C or SIGTERM to
`hpc.submit --local` reaches every runner (hpc/launch/submission/follow.py), which tells its task; a
rank that fails makes its task fail, after its exit record and summary.json are written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

from hpc.core.ending import Outcome, RankCommand, RankEnd
from hpc.core.logs import configure
from hpc.core.meet import free_port
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal, ignore_passed
from hpc.core.summary import RunRecord, write_run_summary
from hpc.launch.batch import rank_words
from hpc.launch.rank.runner import run_rank, write_task
from hpc.placement.torchrun import AGENT_ENV, torchrun_args, torchrun_forwards_signals

log = logging.getLogger(__name__)


class TaskJob:
    """The submitted callable: one rank of the task in this task (srun), or torchrun in it. `task` is a
    RankCommand; the launcher (srun: one task per GPU; torchrun: one task per node,
    `nproc_per_node` workers, `max_restarts`) is the cluster profile's. Its state is in the run
    directory, so resubmitting the same job, or requeueing it, resumes it."""

    def __init__(
        self,
        task: RankCommand,
        launcher: str = "srun",
        nproc_per_node: int = 1,
        max_restarts: int = 0,
    ):
        self.task = task
        self.launcher = launcher
        self.nproc_per_node = nproc_per_node
        self.max_restarts = max_restarts

    def __call__(self) -> None:
        import submitit

        configure()  # HPC_LOG_LEVEL, exported with the job
        job = submitit.JobEnvironment()
        paths = RunPaths(Path(job.paths.folder))
        task = self.task
        write_task(paths, task)
        stop = StopSignal.take()
        try:
            if self.launcher == "torchrun":
                failure = self.run_torchrun(paths, job.job_id, stop)
            else:
                record = run_rank(task, paths.root, stop=stop)
                failure = record.message if record.kind == RankEnd.FAILED else None
        finally:
            stop.restore()
            if job.global_rank == 0:  # submitit's unexpanded '%j' folder beside the run, empty: its submitter may
                with contextlib.suppress(OSError):  # be gone (a local run's was killed) or never waited
                    (paths.root.parent / "%j").rmdir()
        if failure is not None:  # the task fails, after its records are written: submitit's controller ends the rest
            log.error(f"hpc: rank {job.global_rank} ({job.hostname}) failed: {failure}; see {paths.ranks}")
            raise RuntimeError(f"rank {job.global_rank} failed: {failure}")

    def run_torchrun(self, paths: RunPaths, job_id: str, stop: StopSignal) -> str | None:
        """torchrun with a worker per GPU, each `python -m hpc.rank` on this run directory (the task in its
        task.json); the stop signals passed on to it. Once torchrun has ended: why the run failed, as its
        records say (or torchrun's exit code where they say it finished), None where it did not fail."""
        endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"  # one node, this machine's
        args = torchrun_args(1, self.nproc_per_node, endpoint, job_id, self.max_restarts, torchrun_forwards_signals())
        rc = run_forwarding(rank_words(sys.executable, paths.root, args), stop)
        summary = write_run_summary(paths) or RunRecord()
        if summary.outcome == Outcome.FAILED or (rc != 0 and summary.outcome == Outcome.DONE):
            return summary.failure or f"torchrun exited {rc} ({summary.outcome})"
        return None


def run_forwarding(argv: list[str], stop: StopSignal) -> int:
    """Run `argv` (torchrun) to its end, in AGENT_ENV, with the stop signals passed on to it (and recorded
    in `stop`); its exit code. The others (SIGUSR1, SIGQUIT) it ignores, from its start (as
    hpc/launch/rank/agent.py does again): torchrun's agent would die of
    SIGUSR1 (Slurm signals every process of the step, and a Lightning job asks for it), its workers left
    without it; they get Slurm's signal themselves, and pass it on to their command."""
    proc = subprocess.Popen(argv, env={**AGENT_ENV, **os.environ}, preexec_fn=ignore_passed)

    def forward(signum: int) -> None:
        if signum not in StopSignal.PASSED:
            proc.send_signal(signum)

    stop.listener = forward
    try:
        return proc.wait()
    finally:
        stop.listener = None
