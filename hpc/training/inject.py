"""The one point where HPC_FAULT_INJECT acts in a training process (its grammar: hpc/core/faults.py).

Armed once, by the Trainer from the environment (`arm`); unarmed, every call here returns at once and
does nothing, so a run with faults injected takes the paths a normal run takes (the background
checkpoint writer included) and nothing of the training carries a fault parameter. What an entry does:

- `before_step`: sleep (slow-step), or raise CUDA's OutOfMemoryError (oom) or a plain error (fail)
  before an optimizer step, as a batch that fits nowhere or a crash would;
- `at(moment)`: real signals, sent by the process to itself at a chosen moment of a chosen step (the
  start, inside a step, a trace export, evaluation, before the summary), so the fault tests hit each
  moment every time, not when a timer happens to;
- `at_checkpoint`: half the checkpoint of step N on disk, then the signal (on the thread writing it,
  the background writer's where the run writes in the background);
- `graph_fault`: what the graph check meets (graph mode without CUDA is no fault: the tests bring their
  capture through hpc/training/graph/graphmode.py's HPC_GRAPH_CAPTURE).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from hpc.core.faults import VARIABLE, Fault, faults_from_env
from hpc.core.faults import graph_fault as _graph_fault
from hpc.core.files import temp_name


@dataclasses.dataclass(frozen=True)
class Armed:
    """One rank's entries; `step_of()` gives the optimizer steps done so far."""

    faults: tuple[Fault, ...]
    rank: int
    step_of: Callable[[], int]

    def due(self, moment: str, step: int, saved_before: bool = True) -> list[signal.Signals]:
        return [
            signal.Signals[f"SIG{f.signal}"]
            for f in self.faults
            if f.fires(moment, step, self.rank) and (saved_before or not f.once_saved)
        ]


_armed: Armed | None = None  # this process's, set by arm()


def arm(faults: tuple[Fault, ...], rank: int, step_of: Callable[[], int]) -> None:
    """Arm the point with these entries (none: disarmed)."""
    global _armed
    _armed = Armed(faults, rank, step_of) if faults else None


def arm_from_env(env: Mapping[str, str], rank: int, step_of: Callable[[], int]) -> None:
    """Arm the point from HPC_FAULT_INJECT (unset: disarmed)."""
    arm(faults_from_env(env), rank, step_of)


def armed() -> Armed | None:
    return _armed


def _send(signals: list[signal.Signals]) -> None:
    """KILL ends the process here; the others reach the stop handlers as a scheduler's would."""
    for sig in signals:
        os.kill(os.getpid(), sig)


def at(moment: str) -> None:
    """The signals due at `moment` of the current step (`step`: the step in progress, one more than done)."""
    if _armed is not None:
        _send(_armed.due(moment, _armed.step_of() + (1 if moment == "step" else 0)))


def at_checkpoint(path: Path, data: bytes, step: int) -> None:
    """Writing the checkpoint of `step` to `path`: where a signal is due then, half the file goes on disk
    under its temp name first (kill-during-checkpoint: only once a checkpoint exists)."""
    if _armed is None:
        return
    signals = _armed.due("checkpoint", step, saved_before=path.exists())
    if signals:
        with open(temp_name(path), "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        _send(signals)


def before_step(next_step: int, batch_per_gpu: int, world: int) -> None:
    """Before optimizer step `next_step`: sleep (slow), or raise CUDA's OutOfMemoryError (oom) or a
    RuntimeError (fail: a crash with an error line, as a bug or a dead node gives) when asked to."""
    if _armed is None:
        return
    for fault in _armed.faults:
        if fault.kind == "slow" and fault.rank in (None, _armed.rank):
            time.sleep(fault.ms / 1000)
        if fault.kind not in ("oom", "fail") or not fault.hits(next_step, batch_per_gpu, world):
            continue
        spec = os.environ.get(VARIABLE, "")
        if fault.kind == "fail":
            raise RuntimeError(f"fault injection: HPC_FAULT_INJECT={spec}")
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 1.00 GiB (fault injection: HPC_FAULT_INJECT={spec})"
        )


def graph_fault(what: str) -> bool:
    """Whether a graph-`what` entry applies to this rank."""
    return _armed is not None and _graph_fault(_armed.faults, what, _armed.rank)
