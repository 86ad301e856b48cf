"""DDP training of ResNet on CIFAR-100 under torch.profiler: `python -m hpc.train --config FILE ...`.

This module owns the command: its flags (shared with hpc.submit), the run directory's policy (which
directory, whether it may be resumed, removing one a failed start created), the stop signals, and
CUDA out of memory as an outcome. The run itself is hpc/trainer.py's Trainer. One process per rank,
started by srun, torchrun, submitit or plain python; the rank comes from hpc.distenv.

Run directory (what the other parts read):
  config.yaml          the resolved config
  traces/              torch.profiler traces, rank{R}.*.pt.trace.json, one per rank per cycle
  metrics.jsonl        one JSON record per epoch (and per log interval), rank 0
  summary.json         per-rank records: step times, images/s, memory, key_averages() totals
  checkpoints/last.pt  model (plain state_dict), optimizer, schedule, position, RNG states
  tensorboard/         scalars for TensorBoard

Exit codes: 0 done, 1 failed (e.g. non-finite loss), 2 bad input, 3 stopped by SIGTERM/SIGUSR2
after writing a checkpoint (run the same command again to resume; jobs requeue on it), 4 CUDA out of
memory (summary.json records it as the run's outcome: hpc/oom.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from hpc.checkpoint import CHECKPOINT
from hpc.cli import Parser, UsageError, expected_errors
from hpc.config import RunConfig, load_run_config, may_change_on_resume, parse_override, set_source
from hpc.distenv import DistEnv, from_environ
from hpc.oom import EXIT_OOM, describe, record_oom
from hpc.trainer import StopSignal, TrainingError



# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

FLAGS = {  # flag -> (config key, type, help)
    "data_root": ("data.root", str, "data root holding cifar-100-python/ (default: $HPC_DATA, $SCRATCH/cifar100, ./data)"),
    "data_fraction": ("data.fraction", str, "fraction of the training set, e.g. 1, 0.5, 1/10"),
    "loader": ("data.loader", str, "device (whole set on the device) or dataloader (workers)"),
    "arch": ("model.arch", str, "resnet18|resnet34|resnet50|resnet101|resnet152|tiny"),
    "stem": ("model.stem", str, "torchvision (the study's) or cifar (3x3 stem, ~16x FLOPs)"),
    "batch_size": ("train.batch_size", int, "images per optimizer step, per GPU or global (--batch-scope)"),
    "batch_scope": ("train.batch_scope", str, "per_gpu (the study's) or global"),
    "epochs": ("train.epochs", int, "epochs"),
    "max_steps": ("train.max_steps", int, "stop after N optimizer steps in total (checkpoint written)"),
    "lr": ("train.lr", float, "learning rate (default: lr_per_256 x global batch / 256)"),
    "grad_accum_steps": ("train.grad_accum_steps", int, "micro-batches per optimizer step"),
    "device": ("train.device", str, "auto|cpu|cuda"),
    "seed": ("train.seed", int, "seed for init, data order and augmentation"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python -m hpc.train",
        description="DDP training of ResNet on CIFAR-100 under torch.profiler. Precedence: flags > --config > "
        "defaults. Running the same command with the same --run-dir resumes from checkpoints/last.pt.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad input, 3 stopped by SIGTERM/SIGUSR2 with a checkpoint, "
        "4 CUDA out of memory (recorded in summary.json).",
    )
    parser.add_argument("--run-dir", help="run directory (default: runs/train/<job id or time>)")
    add_training_flags(parser)
    return parser.parse_args(argv)


def add_training_flags(parser) -> None:
    """The run-config flags, declared once: `hpc.train` and `hpc.submit` (which forwards them) share them.
    `overrides_from_args` turns them back into config keys."""
    parser.add_argument("--config", help="run config YAML (e.g. profiles/smoke.yaml)")
    for name, (key, typ, text) in FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=f"{text} [{key}]")
    parser.add_argument("--no-profile", action="store_true", help="switch torch.profiler off [profiler.enabled]")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model [model.compile]")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic cuDNN/cuBLAS algorithms, for bit-identical GPU resumes [train.deterministic]")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config value (repeatable)")


def overrides_from_args(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    out = [(*parse_override(s), set_source(s)) for s in args.set]
    for name, (key, _, _) in FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            out.append((key, value, f"--{name.replace('_', '-')}"))
    if args.no_profile:
        out.append(("profiler.enabled", False, "--no-profile"))
    if args.compile:
        out.append(("model.compile", True, "--compile"))
    if args.deterministic:
        out.append(("train.deterministic", True, "--deterministic"))
    return out


def default_run_dir(env, dist: DistEnv) -> Path:
    job = env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or env.get("TORCHELASTIC_RUN_ID")
    if job:
        return Path("runs") / "train" / job
    if dist.world_size > 1:
        raise UsageError("several ranks but no job id to agree on a run directory: pass --run-dir")
    return Path("runs") / "train" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


RUN_DIR_ENTRIES = {"config.yaml", "checkpoints", "summary.json", "metrics.jsonl", "traces", "tensorboard"}


def check_is_run_dir(path: Path) -> None:
    """An existing --run-dir is empty or a run directory: training writes config.yaml, checkpoints/ and
    more into it, and must not scatter them into a directory of other things (`--run-dir ~`)."""
    if path.is_dir():
        names = {p.name for p in path.iterdir()}
        if names and not names & RUN_DIR_ENTRIES:
            shown_names = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise UsageError(f"--run-dir {str(path)!r}: holds other files ({shown_names}), not a run; "
                             "give a new directory, or an existing run's to resume it")


def prepare_run_dir(path: Path) -> Path:
    try:
        (path / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"run directory {str(path)!r} is not writable ({e.strerror or e})") from None
    return path


def check_resumable(run_dir: Path, cfg: RunConfig) -> None:
    """A run directory holds one run: resuming it with another config would silently mix two."""
    saved_path = run_dir / "config.yaml"
    if not (run_dir / CHECKPOINT).exists() or not saved_path.exists():
        return
    from hpc.config import ConfigError, read_yaml

    try:
        saved = read_yaml(saved_path)
    except ConfigError as e:
        raise UsageError(f"{e}; this run directory's saved config is damaged: use another --run-dir") from None
    new = cfg.to_dict()
    for section, body in new.items():
        for key, value in body.items():
            old = (saved.get(section) or {}).get(key, value)
            if old != value and not may_change_on_resume(section, key):  # marked on the config's fields
                raise UsageError(f"{run_dir}: holds a run with {section}.{key} = {old!r}, not {value!r}; "
                                 "use another --run-dir or the same settings to resume")


# ----------------------------------------------------------------------------------------------
# Training (hpc/trainer.py)
# ----------------------------------------------------------------------------------------------


def train(cfg: RunConfig, run_dir: Path, dist: DistEnv, stop: StopSignal) -> int:
    """One rank's run, from set-up to summary.json; `stop` says when a signal asked for a checkpoint."""
    from hpc.trainer import Trainer

    trainer = None
    try:
        trainer = Trainer(cfg, run_dir, dist, stop)
        return trainer.train()
    finally:
        if trainer is not None:
            trainer.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args.config, overrides_from_args(args))
    dist = from_environ(os.environ)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(os.environ, dist)
    created = not run_dir.exists()
    check_is_run_dir(run_dir)
    try:
        prepare_run_dir(run_dir)
        check_resumable(run_dir, cfg)
        return train_or_oom(cfg, run_dir, dist)
    except expected_errors():
        if created:  # bad input found late (data, checkpoint...): leave no run directory behind
            remove_if_unfinished(run_dir)
        raise


def remove_if_unfinished(run_dir: Path) -> None:
    """Remove a run directory this command created, unless it holds a checkpoint or a summary."""
    import shutil

    if not (run_dir / CHECKPOINT).exists() and not (run_dir / "summary.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def train_or_oom(cfg: RunConfig, run_dir: Path, dist: DistEnv) -> int:
    """train(); a CUDA out-of-memory error becomes the run's outcome (summary.json) and exit code 4.
    The process group is torn down whatever happens (a failed run must not leave it to the next)."""
    import torch
    import torch.distributed as tdist

    stop = StopSignal().install()
    try:
        return train(cfg, run_dir, dist, stop)
    except torch.cuda.OutOfMemoryError as e:
        cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
        oom = record_oom(e, cfg, run_dir, dist.rank, dist.world_size, cuda)
        print(f"hpc.train: {describe(oom)}; recorded in {run_dir / 'summary.json'}", file=sys.stderr, flush=True)
        return EXIT_OOM
    finally:
        stop.restore()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()


def cli(argv: list[str] | None = None) -> int:
    from hpc.cli import fail, run

    try:
        return run("hpc.train", main, argv)
    except TrainingError as e:
        return fail("hpc.train", str(e), code=1)


if __name__ == "__main__":
    from hpc import train as _train

    code = _train.cli()
    # Everything is written and closed by now. Leave without running C++ static destructors: a rare
    # abort there ("terminate called without an active exception", seen once in CI after a complete
    # run) would turn a finished run into a failed task.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
