"""The job submitit runs in every task: `TrainJob`, checkpointable for submitit's requeue.

With srun (one task per GPU) each task runs hpc.train's training in-process. With torchrun (one task
per node) each task runs torchrun, which starts a worker per GPU and restarts the worker group (from
the last checkpoint) when one dies; SIGUSR2 is passed on to it. On SIGUSR2 (`--signal=USR2@<delay>`,
Slurm's warning before the time limit, or a preemption) training finishes its step, writes
checkpoints/last.pt, and rank 0 hands over to submitit's handler, which calls `checkpoint()` and
requeues the job; the requeued job resumes from the checkpoint. USR2 rather than USR1: NCCL and some
MPI stacks claim USR1.

Jobs already queued hold a pickle of `hpc.submit.TrainJob`: that name stays importable, and the
attributes below keep their names.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.core.errors import EXIT_OK, EXIT_OOM, EXIT_PEER_LOST, EXIT_PREEMPTED, PeerLostError
from hpc.core.logs import configure
from hpc.core.rundir import RunPaths, read_summary, write_yaml
from hpc.launch.requeue import clear_request, requeue, requeue_if_rank0_does_not, stopped_by_user

log = logging.getLogger(__name__)


class TaskJob:
    """What a submitted callable of every task knows of its job: the requeue budget and the launcher
    (srun: one task per GPU; torchrun: one task per node, `nproc_per_node` workers, `max_restarts`);
    checkpointable for submitit's requeue: the state is in the run directory, so resubmitting the same
    job resumes it."""

    def __init__(self, max_requeues: int, launcher: str = "srun", nproc_per_node: int = 1, max_restarts: int = 0):
        self.max_requeues = max_requeues
        self.launcher, self.nproc_per_node, self.max_restarts = launcher, nproc_per_node, max_restarts

    def __call__(self) -> dict[str, Any]:  # what each task runs: the subclass's
        raise NotImplementedError

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self)


class TrainJob(TaskJob):
    """The submitted callable: runs hpc.train in this task (srun: one task per GPU) or torchrun in this
    task (torchrun: one task per node); checkpointable for submitit's requeue."""

    def __init__(
        self,
        run_config: dict[str, Any],
        max_requeues: int,
        launcher: str = "srun",
        nproc_per_node: int = 1,
        max_restarts: int = 0,
    ):
        self.run_config = run_config
        super().__init__(max_requeues, launcher, nproc_per_node, max_restarts)

    def __call__(self) -> dict[str, Any]:
        import submitit

        from hpc.core.stop import StopSignal
        from hpc.spec.config import run_config_from_dict
        from hpc.spec.distenv import from_environ
        from hpc.training.command import check_resumable, prepare_run_dir, train_or_oom

        configure()  # HPC_LOG_LEVEL, exported with the job, as hpc.train's --log-level would
        submitit_on_usr2 = signal.getsignal(signal.SIGUSR2)  # submitit's requeue handler
        job = submitit.JobEnvironment()
        run_dir = prepare_run_dir(Path(job.paths.folder))
        cfg = run_config_from_dict(self.run_config, "submitted config")
        check_resumable(run_dir, cfg)
        if job.global_rank == 0:
            clear_request(run_dir)
        stop = StopSignal()
        if self.launcher == "torchrun":
            code = self.run_torchrun(run_dir, job.job_id, stop)
        else:
            skip_native_teardown(Path(job.paths.result_pickle))
            try:
                code = train_or_oom(cfg, run_dir, from_environ(os.environ), stop=stop)
            except PeerLostError as e:  # a dead peer, said in one line: requeued like a preemption
                log.error(f"hpc.train: error: {e}")
                code = EXIT_PEER_LOST
        if code == EXIT_OOM:  # a result of this point, not a failure of the job: the sweep goes on
            return {"status": "oom", "run_dir": str(run_dir)}
        if code not in (EXIT_PREEMPTED, EXIT_PEER_LOST):
            return {"status": "done", "run_dir": str(run_dir)}
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        by_user = stopped_by_user(stop.signum, os.environ)
        may_requeue = not by_user and restarts < self.max_requeues
        if may_requeue and job.global_rank == 0 and callable(submitit_on_usr2):
            requeue(submitit_on_usr2, job.job_id, run_dir)  # checkpoint() below, scontrol requeue, exit
        elif may_requeue and code == EXIT_PEER_LOST and os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
            requeue_if_rank0_does_not(job.job_id, job.global_rank, run_dir)  # rank 0 may be the peer lost
        return {"status": "stopped", "run_dir": str(run_dir), "restarts": restarts, "by_user": by_user}

    def run_torchrun(self, run_dir: Path, job_id: str, stop: Any = None) -> int:
        """torchrun with a worker per GPU running hpc.train on this run directory; a worker that dies
        restarts the group, which resumes from the last checkpoint. The stop signals are passed on to
        torchrun (and so to the workers, which checkpoint), and recorded in `stop` (its `signum`).
        Returns hpc.train's exit code for the run."""
        paths = RunPaths(run_dir)
        write_yaml(paths.submitted, self.run_config)
        stopped: list[int] = []

        def seen(signum: int) -> None:
            stopped.append(signum)
            if stop is not None:
                stop.signum = signum

        train = ["-m", "hpc.train", "--config", str(paths.submitted), "--run-dir", str(run_dir)]
        rc = run_forwarding([sys.executable, "-m", "torch.distributed.run", *self.torchrun_args(job_id), *train], seen)
        if (read_summary(paths.summary) or {}).get("outcome") == "oom":
            return EXIT_OOM
        if rc == 0:
            return EXIT_OK
        if stopped and paths.checkpoint.exists():
            return EXIT_PREEMPTED
        raise RuntimeError(f"torchrun exited {rc} after {self.max_restarts} restart(s) at most; see the log above")

    def torchrun_args(self, job_id: str) -> list[str]:
        return torchrun_args_for(job_id, self.nproc_per_node, self.max_restarts)


def skip_native_teardown(result_pickle: Path) -> None:
    """Once submitit has written this task's result as a success: flush and os._exit(0), so C++ static
    destructors never run (hpc.train's door ends so too). After in-process DDP over gloo they sometimes
    abort: 'terminate called without an active exception' (a thread object destroyed while joinable),
    SIGABRT with no Python frame, in 1 of 40-60 runs of a plain 2-rank DDP script here; it failed
    finished tasks, and with them a job that had completed (seen in CI). Any other result, or none,
    leaves the normal exit and its exit code alone."""
    import atexit

    from hpc.core.stop import exit_now

    def leave() -> None:
        from submitit.core.utils import pickle_load

        try:
            done = pickle_load(result_pickle)[0] == "success"
        except Exception:  # no result, or not readable: not ours to judge
            return
        if done:
            logging.shutdown()
            exit_now(0)

    atexit.register(leave)


def run_forwarding(argv: list[str], seen: Callable[[int], None] | None = None) -> int:
    """Run `argv` (torchrun) to its end with the stop signals passed on to it (and told to `seen`); its
    exit code. This process's handlers are given back afterwards."""
    proc = subprocess.Popen(argv)

    def forward(signum: int, frame: Any) -> None:
        if seen is not None:
            seen(signum)
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def torchrun_args_for(job_id: str, nproc_per_node: int, max_restarts: int) -> list[str]:
    """torchrun's arguments for a job's agent on this node: the job's own rendezvous on Slurm; on this
    machine (--local), one node at 127.0.0.1."""
    from hpc.spec.distenv import master_port_for_job, slurm_torchrun_args
    from hpc.spec.torchrun import torchrun_args, torchrun_forwards_signals

    if os.environ.get("SLURM_JOB_ID"):
        return slurm_torchrun_args(os.environ, nproc_per_node, max_restarts)
    return torchrun_args(
        1,
        nproc_per_node,
        f"127.0.0.1:{master_port_for_job(job_id)}",
        job_id,
        max_restarts,
        torchrun_forwards_signals(),
    )
