"""Checkpointing: when to save, the atomic save, and the load with its checks.

`Checkpointer` owns the policy (every `train.checkpoint_every_steps`, at epoch ends, at the end and on
a stop signal; rank 0 writes, every rank waits) and the file `checkpoints/last.pt`: model (a plain
state_dict, no DDP prefix), optimizer, schedule, epoch/position/step and the RNG states. A save is a
temp file, fsync and rename, so a crash leaves the previous checkpoint; a load uses
`weights_only=True` and checks every entry resuming needs, so a damaged or foreign file is an input
error naming it, and is never overwritten by the failed resume.
"""

from __future__ import annotations

import io
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.core.errors import UsageError
from hpc.core.faults import KILL_DURING_CHECKPOINT, faults_from_env
from hpc.core.files import write_atomic
from hpc.core.rundir import RunPaths

CHECKPOINT_KEYS = {
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "epoch": int,
    "position": int,
    "step": int,
    "rng": dict,
}


def _fault_injection_kill_during_write(tmp: Path, data: bytes) -> None:
    """Test hook (HPC_FAULT_INJECT=kill-during-checkpoint, hpc/core/faults.py): die half-way through
    writing a checkpoint."""
    with open(tmp, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic: torch.save to a temp file, fsync, rename. A crash leaves the previous checkpoint."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    if path.exists() and any(f.kind == KILL_DURING_CHECKPOINT for f in faults_from_env(os.environ)):
        _fault_injection_kill_during_write(tmp, data)
    write_atomic(path, data)


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, checked for what resuming needs; None if there is none. A file that is
    damaged, foreign or incomplete is an input error naming it, and is left as it is."""
    import torch

    if not path.exists():
        return None
    if not path.is_file():
        raise UsageError(f"{path}: not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged or foreign file
        # (not torch's own message: it suggests weights_only=False, i.e. running the file's code)
        raise UsageError(
            f"{path}: not a checkpoint this toolkit can load ({type(e).__name__}); move it away to start afresh"
        ) from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"{path}: not a checkpoint (holds a {type(ckpt).__name__}, not a mapping)")
    for key, kind in CHECKPOINT_KEYS.items():
        if not isinstance(ckpt.get(key), kind) or isinstance(ckpt.get(key), bool):
            raise UsageError(
                f"{path}: checkpoint entry {key!r} is "
                f"{'missing' if key not in ckpt else type(ckpt[key]).__name__}, expected {kind.__name__}"
            )
    if min(ckpt["epoch"], ckpt["position"], ckpt["step"]) < 0:
        raise UsageError(f"{path}: negative epoch/position/step in the checkpoint")
    return ckpt


def rng_state(use_cuda: bool) -> dict:
    import torch

    return {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()),
        "cuda": torch.cuda.get_rng_state() if use_cuda else None,
    }


def set_rng_state(rng: dict, use_cuda: bool) -> None:
    import torch

    torch.set_rng_state(rng["torch"])
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in rng["python"]))
    if use_cuda and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"])


def restore(path: Path, ckpt: dict[str, Any], model: Any, optimizer: Any, scheduler: Any, state: Any) -> None:
    """Load the checkpoint into the run's objects: weights, optimizer, schedule, and the train state
    (position and RNG: anything with load_state_dict). A mismatch (another architecture, a tensor of
    another shape, junk RNG state) names the file, not a traceback."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        state.load_state_dict(ckpt)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        raise UsageError(
            f"{path}: does not fit this run's model or optimizer ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
        ) from None


class Checkpointer:
    """The run's checkpoint: policy, save (rank 0, then a barrier) and load."""

    def __init__(
        self, run_dir: Path, every_steps: int, is_main: bool, barrier: Callable[[], None], log: Callable[[str], None]
    ):
        self.path = RunPaths(run_dir).checkpoint
        self.every_steps = every_steps
        self.is_main = is_main
        self.barrier = barrier
        self.log = log

    def due(self, step: int) -> bool:
        """The periodic policy; epoch ends, the run's end and stop signals save regardless."""
        return bool(self.every_steps) and step % self.every_steps == 0

    def load(self) -> dict | None:
        return load_checkpoint(self.path)

    def save(self, state: dict, reason: str) -> None:
        if self.is_main:
            save_checkpoint(self.path, state)
            self.log(
                f"checkpoint ({reason}): epoch {state['epoch']}, batch {state['position']}, "
                f"step {state['step']} -> {self.path}"
            )
        self.barrier()
