"""What HPC_FAULT_INJECT's entries do in a training process (their grammar: hpc/core/faults.py).

`raise_at_step`: CUDA's OutOfMemoryError (oom) or a plain error (fail) before an optimizer step, as a
batch that fits nowhere or a crash would. `Injector`: real signals, sent by the process to itself at a
chosen moment of a chosen step (the start, inside a step, half-way through a checkpoint write, a trace
export, evaluation, before the summary), so the fault tests hit each moment every time, not when a
timer happens to. The parts that own a moment ask the Injector (`fire`, or `due` where they must
first put the file half on disk).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import torch

from hpc.core.faults import VARIABLE, Fault


def raise_at_step(faults: tuple[Fault, ...], next_step: int, batch_per_gpu: int, world: int, rank: int = 0) -> None:
    """Before optimizer step `next_step`: sleep (slow), or raise CUDA's OutOfMemoryError (oom) or a
    RuntimeError (fail: a crash with an error line, as a bug or a dead node gives) when asked to."""
    for fault in faults:
        if fault.kind == "slow" and fault.rank in (None, rank):
            time.sleep(fault.ms / 1000)
        if fault.kind not in ("oom", "fail") or not fault.hits(next_step, batch_per_gpu, world):
            continue
        spec = os.environ.get(VARIABLE, "")
        if fault.kind == "fail":
            raise RuntimeError(f"fault injection: HPC_FAULT_INJECT={spec}")

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 1.00 GiB (fault injection: HPC_FAULT_INJECT={spec})"
        )


class Injector:
    """The signal entries of one rank. `step_of()` gives the optimizer steps done so far; the moment
    `step` counts the step in progress (one more)."""

    def __init__(self, faults: tuple[Fault, ...], rank: int, step_of: Callable[[], int]):
        self.faults = tuple(f for f in faults if f.kind == "signal")
        self.rank = rank
        self.step_of = step_of

    def due(self, moment: str, saved_before: bool = True) -> list[signal.Signals]:
        """The signals to send now (`saved_before`: a checkpoint exists already, for kill-during-checkpoint)."""
        if not self.faults:
            return []
        step = self.step_of() + (1 if moment == "step" else 0)
        return [
            signal.Signals[f"SIG{f.signal}"]
            for f in self.faults
            if f.fires(moment, step, self.rank) and (saved_before or not f.once_saved)
        ]

    def fire(self, moment: str, signals: list[signal.Signals] | None = None) -> None:
        """Send this process the signals due at `moment` (or those given): KILL ends it here, the others
        reach the stop handlers as a scheduler's would."""
        for sig in self.due(moment) if signals is None else signals:
            os.kill(os.getpid(), sig)


NO_FAULTS = Injector((), 0, lambda: 0)  # for parts built outside a Trainer (tests, benchmarks)
