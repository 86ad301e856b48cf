"""The job submitit runs in every task of your own command's run: `CommandJob`, the counterpart of
`TrainJob` (hpc/launch/job.py) for a command instead of the toolkit's training, checkpointable for
submitit's requeue.

With srun (one task per GPU) each task runs one rank of the command (hpc/launch/rank.py). With torchrun
(one task per node) each task runs torchrun, whose workers are `python -m hpc.rank` running one rank
each, so the ranks are recorded alike. The job's signal is SIGTERM (`--signal=TERM@<delay>`, hpc/launch/
slurm.py): Slurm sends it to every process of the step, and a script that saves on SIGTERM (as
torchrun-style scripts do) needs no change. Then:

- a command that saved and exited 3 (EXIT_PREEMPTED) is requeued by rank 0 (submitit's handler, as
  TrainJob does; at most the profile's max_requeues), and the requeued job runs the same command,
  which resumes by itself;
- a command still running after the profile's `stop_grace_s` is killed, and the job ends preempted;
- a rank that fails makes its task fail (srun's --kill-on-bad-exit ends the others; they also stop
  their own command on seeing it), after its exit record and summary.json are written.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from hpc.core.errors import EXIT_OK
from hpc.core.logs import configure
from hpc.core.rundir import RunPaths
from hpc.launch.job import TaskJob, run_forwarding, torchrun_args_for
from hpc.launch.outcome import write_command_summary, write_spec
from hpc.launch.requeue import requeue

log = logging.getLogger(__name__)


class CommandJob(TaskJob):
    """The submitted callable: one rank of the command in this task (srun), or torchrun in it."""

    def __init__(
        self,
        spec: dict[str, Any],
        max_requeues: int,
        launcher: str = "srun",
        nproc_per_node: int = 1,
        max_restarts: int = 0,
    ):
        self.spec = spec
        super().__init__(max_requeues, launcher, nproc_per_node, max_restarts)

    def __call__(self) -> dict[str, Any]:
        import submitit

        from hpc.launch.rank import run_rank
        from hpc.spec.command import CommandSpec

        configure()
        submitit_on_usr2 = signal.getsignal(signal.SIGUSR2)  # submitit's requeue handler
        job = submitit.JobEnvironment()
        paths = RunPaths(Path(job.paths.folder))
        write_spec(paths, self.spec)
        if self.launcher == "torchrun":
            kind, said = self.run_torchrun(paths, job.job_id)
        else:
            record = run_rank(CommandSpec.from_dict(self.spec), paths.root)
            kind, said = str(record.get("kind")), str(record.get("message"))
        return self.ended(kind, said, job, paths, submitit_on_usr2)

    def ended(self, kind: str, said: str, job: Any, paths: RunPaths, submitit_on_usr2: Any) -> dict[str, Any]:
        """This task's result; rank 0 requeues a command that saved and stopped; a failure raises."""
        if kind == "failed":
            log.error(f"hpc: rank {job.global_rank} ({job.hostname}) failed: {said}; see {paths.ranks}")
            raise RuntimeError(f"rank {job.global_rank} failed: {said}")
        if kind != "stopped":  # ok, or preempted (killed, interrupted, stopped for a failed peer)
            return {"status": {"ok": "done"}.get(kind, "preempted"), "run_dir": str(paths.root)}
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        by_user = os.environ.get("SUBMITIT_EXECUTOR") == "local"  # no scheduler here: the stop was a person's
        if not by_user and job.global_rank == 0 and restarts < self.max_requeues and callable(submitit_on_usr2):
            log.info(f"hpc: the command saved and stopped: requeueing job {job.job_id} (restart {restarts + 1})")
            requeue(submitit_on_usr2, job.job_id, paths.root)  # checkpoint() below, scontrol requeue, exit
        return {"status": "stopped", "run_dir": str(paths.root), "restarts": restarts, "by_user": by_user}

    def run_torchrun(self, paths: RunPaths, job_id: str) -> tuple[str, str]:
        """torchrun with a worker per GPU, each `python -m hpc.rank` on this run directory; the stop
        signals passed on to it. (kind, line) of the run as its records say once torchrun has ended."""
        args = torchrun_args_for(job_id, self.nproc_per_node, self.max_restarts)
        rank = ["-m", "hpc.rank", "--run-dir", str(paths.root)]
        rc = run_forwarding([sys.executable, "-m", "torch.distributed.run", *args, *rank])
        summary = write_command_summary(paths) or {}
        outcome = summary.get("outcome")
        if rc == EXIT_OK and outcome == "done":
            return "ok", "done"
        kind = {"failed": "failed", "stopped": "stopped"}.get(str(outcome), "preempted")
        return kind, str(summary.get("failure") or f"torchrun exited {rc} ({outcome})")
