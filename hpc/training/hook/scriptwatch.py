"""The task's side of its beat (hpc/core/beat.py): from the start-up hook in a user's script, one byte
to the per-rank runner at each counted optimizer step, and, armed at the first step, every thread's
Python stack written to RUN/ranks/rank{R}.stack.txt when the runner sends DUMP_SIGNAL (faulthandler, in
C: it runs while Python is stuck in a collective, never while the process is stopped). The runner
names a rank that stops stepping, and one that is stopped, with what the stack says. Torch-free.
"""

from __future__ import annotations

import faulthandler
import logging
import os
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING

from hpc.core.beat import DUMP_SIGNAL, READY, STEP, beat_fd

if TYPE_CHECKING:
    from hpc.training.hook.autoprofile import StepHook

log = logging.getLogger(__name__)


class Watch:
    """Listens to the step hook (StepHook.listeners): a beat a step, the dump armed at the first."""

    def __init__(self, fd: int):
        self.fd: int | None = fd
        self.stack_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor

    def __call__(self, hook: StepHook) -> None:
        if self.stack_file is None:
            self.arm_dump(hook)
        self.send(STEP)

    def arm_dump(self, hook: StepHook) -> None:
        path = hook.paths.rank_stack(hook.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.stack_file = open(path, "w")  # noqa: SIM115  # open for the process's life
        faulthandler.register(DUMP_SIGNAL, file=self.stack_file, all_threads=True, chain=False)
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


def watch(hook: StepHook, env: Mapping[str, str]) -> Watch | None:
    """The watch on `hook`'s steps, where the runner gave this process its pipe; else None."""
    fd = beat_fd(env)
    if fd is None:
        return None
    os.set_blocking(fd, False)
    listener = Watch(fd)
    hook.listeners.append(listener)
    return listener
