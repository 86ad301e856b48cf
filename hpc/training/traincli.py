"""DDP training of ResNet on CIFAR-100 under torch.profiler: `python -m hpc.train --config FILE ...`.

This module owns the command: its parser (the training flags are the launcher's, hpc/settings/flags.py),
the run directory's policy (which directory, whether it may be resumed, removing one a failed start
created), the stop signals, and CUDA out of memory as an outcome. The run itself is
hpc/training/trainer.py's Trainer. One process per rank, started by srun, torchrun, submitit or plain
python; the rank comes from hpc.placement.distenv. The run directory's files: hpc/core/rundir.py.

Exit codes (hpc/core/errors.py): 0 done, 1 failed (e.g. non-finite loss, a file that could not be
written), 2 bad input, 3 stopped by SIGTERM/SIGUSR2 after writing a checkpoint (run the same command
again to resume; jobs requeue on it), 4 CUDA out of memory (summary.json records it as the run's
outcome: hpc/training/oom.py), 5 a peer rank died or stopped answering (one line naming it, the step
and the checkpoint a rerun resumes from; the traceback goes to RUN/logs/rank{R}.log).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import traceback
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as tdist

from hpc.core.cli import Parser, check_run_dir, first_missing, run, shown
from hpc.core.errors import EXIT_OOM, ConfigError, HpcError, PeerLostError, StoreError, UsageError
from hpc.core.faults import faults_from_env
from hpc.core.files import temp_name
from hpc.core.lock import RunLock
from hpc.core.owner import make_dirs, open_append
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.placement.distenv import DistEnv, from_environ
from hpc.settings.config import load_run_config, read_yaml
from hpc.settings.flags import add_training_flags, overrides_from_args
from hpc.settings.rankcommand import RUN_DIR_VARIABLE
from hpc.settings.schema import RunConfig, may_change_on_resume

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python -m hpc.train",
        description="DDP training of ResNet on CIFAR-100 under torch.profiler. Precedence: flags > --config > "
        "defaults. Running the same command with the same --run-dir resumes from checkpoints/last.pt.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad input, 3 stopped by SIGTERM/SIGUSR2 with a checkpoint, "
        "4 CUDA out of memory (recorded in summary.json), 5 a peer rank was lost (rerun to resume).",
        needs_args=True,
    )
    parser.add_argument("--run-dir", help="run directory (default: $HPC_RUN_DIR, else runs/train/<job id or time>)")
    parser.add_argument(
        "--resume-from",
        choices=["last", "previous"],
        default="last",
        help="previous: resume from checkpoints/previous.pt when last.pt is damaged (it is moved to damaged.pt)",
    )
    add_training_flags(parser)
    return parser.parse_args(argv)


def default_run_dir(env: Mapping[str, str], dist: DistEnv) -> Path:
    """The runner's run directory (HPC_RUN_DIR, which every task of a job is given), else runs/train/<job
    id>, else runs/train/<time> for a single process."""
    if env.get(RUN_DIR_VARIABLE):
        return Path(env[RUN_DIR_VARIABLE])
    job = env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or env.get("TORCHELASTIC_RUN_ID")
    if job:
        return Path("runs") / "train" / job
    if dist.world_size > 1:
        raise UsageError("several ranks but no job id to agree on a run directory: pass --run-dir")
    return Path("runs") / "train" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def prepare_run_dir(path: Path) -> Path:
    try:
        make_dirs(RunPaths(path).checkpoints, "--run-dir")
        probe = temp_name(path / "write-test")
        probe.write_text("ok")
        probe.unlink(missing_ok=True)
    except OSError as e:
        raise UsageError(f"run directory {shown(str(path))} is not writable ({e.strerror or e})") from None
    return path


def check_resumable(run_dir: Path, cfg: RunConfig) -> None:
    """A run directory holds one run: resuming it with another config would silently mix two."""
    paths = RunPaths(run_dir)
    if not paths.checkpoint.exists() or not paths.config.exists():
        return
    try:
        saved = read_yaml(paths.config)
    except ConfigError as e:
        raise UsageError(f"{e}; this run directory's saved config is damaged: use another --run-dir") from None
    for section, body in cfg.sections().items():
        for key, value in body.items():
            old = (saved.get(section) or {}).get(key, value)
            if old != value and not may_change_on_resume(section, key):  # marked on the config's fields
                raise UsageError(
                    f"{run_dir}: holds a run with {section}.{key} = {old!r}, not {value!r}; "
                    "use another --run-dir or the same settings to resume"
                )


def remove_if_unfinished(run_dir: Path, created: Path) -> None:
    """Remove what this command created for the run directory (`created`: it or its outermost new parent),
    unless the run holds a checkpoint or a summary."""
    paths = RunPaths(run_dir)
    if not paths.checkpoint.exists() and not paths.summary.exists():
        shutil.rmtree(created, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args.config, overrides_from_args(args))
    faults_from_env(os.environ)  # a typo in the test hook is an input error now, not a silent no-op later
    dist = from_environ(os.environ)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(os.environ, dist)
    check_run_dir(run_dir)
    created = first_missing(RunPaths(run_dir).checkpoints)  # what prepare_run_dir will make
    try:
        prepare_run_dir(run_dir)
        check_resumable(run_dir, cfg)
        return train_or_oom(cfg, run_dir, dist, args.resume_from)
    except HpcError as e:
        if created is not None and e.exit_code == 2:  # bad input found late (data, checkpoint...): leave nothing
            remove_if_unfinished(run_dir, created)
        raise


def train_or_oom(
    cfg: RunConfig, run_dir: Path, dist: DistEnv, resume_from: str = "last", stop: StopSignal | None = None
) -> int:
    """One rank's run, from set-up to summary.json; a CUDA out-of-memory error becomes the run's outcome
    (summary.json) and exit code 4; a peer lost in a collective is one line and exit 5 (the traceback in
    the run's logs/). The stop signals (`stop`: the caller's, to see which one came) are handed back and
    the process group torn down whatever happens (a failed run must not leave them to the next)."""

    from hpc.training.distributed.rendezvous import is_peer_failure
    from hpc.training.distributed.runstore import REFUSED
    from hpc.training.oom import describe, record_oom
    from hpc.training.trainer import Trainer

    stop = StopSignal.take(stop)  # the door's, installed before torch was imported
    paths = RunPaths(run_dir)
    lock = RunLock(paths.lock)  # rank 0 takes it in the Trainer's set-up
    trainer = None
    try:
        trainer = Trainer(cfg, run_dir, dist, stop, lock, resume_from)
        return trainer.train()
    except torch.cuda.OutOfMemoryError as e:
        cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
        step = trainer.state.step + 1 if trainer is not None else None  # the step it came in
        oom = record_oom(e, cfg, paths, dist.rank, dist.world_size, cuda, step)
        log.warning(f"hpc.train: {describe(oom)}; recorded in {paths.summary}")
        return EXIT_OOM
    except Exception as e:
        if REFUSED in str(e) and not isinstance(e, HpcError):  # said by the sealed store, through torch's C++
            raise StoreError(" ".join(str(e).split())[:300]) from None
        if isinstance(e, HpcError) or not is_peer_failure(e):
            raise
        kept = keep_traceback(paths, dist.rank)
        lost = (
            trainer.peer_lost(e)
            if trainer is not None
            else PeerLostError(f"rank {dist.rank} lost a peer during set-up ({' '.join(str(e).split())[:160]})")
        )
        raise PeerLostError(f"{lost}; traceback in {kept}") from None
    finally:
        if trainer is not None:
            trainer.close()
        lock.release()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()
        stop.restore()  # last: a stop signal during the teardown is caught, not the process's death (seen)


def keep_traceback(paths: RunPaths, rank: int) -> Path:
    """The exception being handled, appended to the rank's log file (the console gets one line)."""
    path = paths.rank_log(rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_append(path), "a") as f:
            f.write(f"--- {dt.datetime.now().isoformat(timespec='seconds')} pid {os.getpid()}\n")
            traceback.print_exc(file=f)
    except OSError:
        pass  # a full disk: the one line still says what happened
    return path


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.train`, or its console script): errors as one line, exit 2 (bad
    input) or 1 (a run that cannot go on)."""
    return run("hpc.train", main, argv)
