"""The stop signals of a training process: SIGTERM/SIGUSR2 (Slurm preemption, a time limit's warning),
SIGINT (Ctrl-C) and SIGHUP (a closed terminal) ask for a checkpoint at the next step boundary; the same
command then resumes. The other signals Slurm or a person sends a job (SIGUSR1: Lightning's requeue
signal; SIGQUIT) are caught too, never the process's death: a per-rank runner passes them on to its
command (hpc/launch/rank/runner.py), a training ignores them.

Torch-free, so a command's door installs it before importing torch: that import takes seconds on a
loaded node, and a SIGUSR2 or SIGTERM arriving in it would otherwise kill the process outright (the
default action), with no checkpoint and no line saying so (seen: a job's time-limit warning during
start-up, both tasks ended by the signal, exit 140). Caught early, the signal is kept and the run stops
cleanly after its first step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import types
from collections.abc import Callable, Iterator
from typing import NoReturn

log = logging.getLogger(__name__)


class StopSignal:
    """Records the last stop signal (`signum`); installed by whoever runs the training and handed in, so
    the handlers are given back afterwards (`restore`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)
    PASSED = (signal.SIGUSR1, signal.SIGQUIT)  # not a stop: passed on to a command as they came
    _early: StopSignal | None = None  # installed by a door before its heavy imports (see `early`)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.passed: list[int] = []  # the other signals (PASSED) that came, in order
        self._previous: dict[int, signal._HANDLER] = {}
        self.listener: Callable[[int], None] | None = None  # told at once, in the handler (a launcher passes it on)

    def install(self) -> StopSignal:
        if not self._previous:  # installed once: a second install would save our own handler as "previous"
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS + self.PASSED}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if StopSignal._early is self:
            StopSignal._early = None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if signum in self.PASSED:
            self.passed.append(signum)
        else:
            self.signum = signum
        if self.listener is not None:
            self.listener(signum)

    @classmethod
    def early(cls) -> StopSignal:
        """Install one now, to be taken over by the run (`take`): for a command's first lines."""
        cls._early = cls._early or cls().install()
        return cls._early

    @classmethod
    def take(cls, given: StopSignal | None = None) -> StopSignal:
        """The run's StopSignal, installed: `given`, else the one a door installed early (with any signal
        it already caught), else a new one."""
        return (given or cls._early or cls()).install()


class Caught:
    """`signals` recorded, never acted on, while a waiting loop runs (the batch shell's, a follower's, srun's
    in an allocation); the handlers are given back on leaving. The loop reads `seen` and acts itself."""

    def __init__(self, *signals: int) -> None:
        self.signals = signals
        self.seen: list[int] = []  # every caught signal, in order
        self._previous: dict[int, signal._HANDLER] = {}

    def _note(self, signum: int, frame: types.FrameType | None) -> None:
        self.seen.append(signum)

    def __enter__(self) -> Caught:
        self._previous = {sig: signal.signal(sig, self._note) for sig in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile: what `hpc.submit --local` starts its jobs with, so that their controller
    inherits it and never sees Ctrl-C itself (hpc/launch/submission/follow.py says why)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ignore_passed() -> None:
    """SIGUSR1 and SIGQUIT (PASSED) ignored, for a launcher between a job's step and its ranks (torchrun's
    agent), which they would end: Slurm sends them to every process of the step. Ignored dispositions survive
    exec; each rank's runner takes them back and passes them on to its command."""
    for sig in StopSignal.PASSED:
        signal.signal(sig, signal.SIG_IGN)


def ignore_after_run() -> None:
    """For a process that ends when its run ends: the stop signals are ignored once the run hands its
    handlers back, not fatal. SIGUSR2 landing during a finished run's teardown killed it (exit -12, seen
    in the random-fault test); the early handler takes over from here at once, and a command started by
    the run execs with its own."""
    for sig in StopSignal.SIGNALS + StopSignal.PASSED:
        signal.signal(sig, signal.SIG_IGN)


def exit_now(code: int) -> NoReturn:
    """End the process with `code` after flushing: no C++ static destructors, whose rare abort after DDP
    over gloo (std::terminate: a thread object destroyed while joinable) once failed a finished run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
