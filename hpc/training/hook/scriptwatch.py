"""The task's side of its beat (hpc/core/beat.py): from the start-up hook in a user's script and from the
toolkit's training alike, one byte to the per-rank runner at each counted optimizer step, and, armed at
the first step, every thread's Python stack written to RUN/ranks/rank{R}.stack.txt when the runner
sends DUMP_SIGNAL (faulthandler, in C: it runs while Python is stuck in a collective, never while the
process is stopped). The runner names a rank that stops stepping, and one that is stopped, with what
the stack says. Torch-free.
"""

from __future__ import annotations

import faulthandler
import logging
import os
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING

from hpc.core.beat import DUMP_SIGNAL, READY, STEP, beat_fd
from hpc.core.rundir import RunPaths

if TYPE_CHECKING:
    from hpc.training.hook.autoprofile import StepHook

log = logging.getLogger(__name__)


class Watch:
    """A beat a step, the dump armed at the first: for the step hook in a script (a listener of
    StepHook's) and for the toolkit's training (`step`, from its optimizer step): one liveness watch."""

    def __init__(self, fd: int):
        self.fd: int | None = fd
        self.stack_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor
        self.armed = False

    def __call__(self, hook: StepHook) -> None:
        self.step(hook.paths, hook.rank)

    def step(self, paths: RunPaths, rank: int) -> None:
        if not self.armed:
            self.armed = True
            self.arm_dump(paths, rank)
        self.send(STEP)

    def arm_dump(self, paths: RunPaths, rank: int) -> None:
        path = paths.rank_stack(rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.stack_file = open(path, "w")  # noqa: SIM115  # open for the process's life
            faulthandler.register(DUMP_SIGNAL, file=self.stack_file, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError) as e:  # never the run: no stack on request, beats still go
            log.warning(f"hpc: rank {rank}: {path} not made ({e}): a hung rank is named without its stack")
            return
        self.send(READY)

    def send(self, byte: bytes) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, byte)
        except BlockingIOError:  # the runner is behind: a beat lost, the next one says as much
            pass
        except OSError:  # the runner is gone: nobody listens
            self.fd = None


def beat_watch(env: Mapping[str, str]) -> Watch | None:
    """The watch on this process's steps, where the runner gave it its pipe; else None."""
    fd = beat_fd(env)
    if fd is None:
        return None
    os.set_blocking(fd, False)
    return Watch(fd)


def watch(hook: StepHook, env: Mapping[str, str]) -> Watch | None:
    """The watch on `hook`'s steps (a script's), where the runner gave this process its pipe; else None."""
    listener = beat_watch(env)
    if listener is not None:
        hook.listeners.append(listener)
    return listener
