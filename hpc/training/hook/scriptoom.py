"""CUDA out of memory as a result for a user's script, as for the toolkit's training (hpc/training/oom.py):
from the start-up hook, with no change to the script.

An OutOfMemoryError (torch's, or one it caused: the chain of causes is followed) that ends the script
reaches Python's `sys.excepthook`, which this module wraps: the rank's facts get an `oom` record (the
allocation asked, the peak, the limit, the device's memory) and, with profiler.memory_snapshot on a
GPU, the allocator's history recorded since the first step is dumped as
RUN/memory_snapshot.rank{R}.pickle (https://pytorch.org/memory_viz). The traceback is printed as before;
the process then exits with EXIT_OOM (4) instead of 1, from an exit handler registered before any
other, so that it runs last. The runner reads exit 4 with an `oom` record as the rank's outcome `oom`.
An OOM the script catches itself is its own business: nothing is recorded.
"""

from __future__ import annotations

import atexit
import logging
import sys
import types
from typing import TYPE_CHECKING

from hpc.core.errors import EXIT_OOM
from hpc.core.stop import exit_now

if TYPE_CHECKING:
    from hpc.training.hook.autoprofile import StepHook

log = logging.getLogger(__name__)


def oom_of(error: BaseException | None) -> BaseException | None:
    """The OutOfMemoryError in `error`'s chain of causes, if any (torch loaded: it raised the error)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    found = (getattr(torch, "OutOfMemoryError", None), getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None))
    kinds = tuple(k for k in found if isinstance(k, type))
    seen: set[int] = set()
    while error is not None and id(error) not in seen and kinds:
        if isinstance(error, kinds):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def record_history(hook: StepHook) -> None:
    """At the first step on a GPU, with profiler.memory_snapshot: the allocator's history, bounded, as the
    training records it."""
    from hpc.training.oom import start_memory_history  # torch's: loaded, since a step was taken

    start_memory_history(hook.settings.memory_snapshot, hook.cuda)


class OomCatcher:
    """The excepthook's wrapper and the last exit handler (see the module doc)."""

    def __init__(self, hook: StepHook, batch: int | None):
        self.hook = hook
        self.batch = batch
        self.previous = sys.excepthook

    def install(self) -> None:
        sys.excepthook = self.excepthook
        atexit.register(self.exit_code)  # the first registered: it runs after every other

    def excepthook(self, kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> None:
        try:
            oom = oom_of(error)
            if oom is not None:
                from hpc.training.oom import oom_record  # the training's recorder (torch is loaded: it raised)

                hook = self.hook
                snapshot = hook.settings.memory_snapshot
                args = (hook.paths, hook.rank, self.batch, hook.world_size, hook.cuda, None, snapshot, hook.steps + 1)
                hook.oom = oom_record(oom, *args)
                hook.write()
        except Exception as e:  # never in the way of the script's own traceback
            log.warning(f"hpc: rank {self.hook.rank}: the out-of-memory record was not written ({e})")
        self.previous(kind, error, tb)

    def exit_code(self) -> None:
        if self.hook.oom is not None:
            exit_now(EXIT_OOM)
