"""A rank that stopped making progress, named by its runner (hpc/launch/rank/runner.py), for any task the
start-up hook or the training beats for (hpc/core/beat.py): torch-free, from outside the task, so it
works when the task cannot (stopped, or stuck in a collective holding the GIL's owner in C).

By default (command.hang_timeout_s unset) the bounds are the run's own:
- frozen: the task's process is stopped (state T in /proc: SIGSTOP, a node's job freezer) for FROZEN_S
  (70 s: a stopped process makes no progress whatever it was doing, so nothing needs learning; its
  idle peers' stacks are dumped first); no stack can be had from it (a stopped process runs no handler).
- hung: after its first steps, no step for the learned bound (LEARNED_FACTOR times the longest time
  between its steps so far, within LEARNED_MIN_S..LEARNED_MAX_S) and, over the last PROGRESS_WINDOW_S,
  no progress: its process and its children (DataLoader workers) ran or waited for a core (on a loaded
  node, starved is not blocked) under BUSY_CPU_SHARE of a core and moved under BUSY_BYTES to or from
  storage. A rank busy in a long evaluation or checkpoint (minutes without an optimizer step, its CPU or
  its disk busy) is never called hung; its runner touches
  RUN/ranks/rank{R}.busy meanwhile, so that its peers, waiting for it in a collective, are not either.
  Its stack is dumped first (faulthandler, on DUMP_SIGNAL), and the line says where its main thread was.
  A rank whose main thread waits inside torch.distributed or autograd's engine (DDP's gradient sync)
  waits for a peer: it is named only WAITER_EXTRA_S later, so that the peer it waits for, stuck
  elsewhere, is named first; when every rank waits (a deadlock in collectives), each is named.
  Every bound together stays under 2 minutes. A rank spinning on the GPU's result (a CUDA sync in a
  collective that never ends) looks busy: NCCL's own timeout ends it.

With command.hang_timeout_s set, the user's bound wins: frozen after it (+ FROZEN_EXTRA_S), hung after it
of silence (+ SILENT_EXTRA_S), busy or not. The extras let a frozen peer, silent since the same step, be
named first: its peers dump their stacks at the bound, while they still wait for it.

Where the task runs NCCL, its Flight Recorder is asked for a dump with the stack (hpc/launch/rank/flightrec.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from hpc.core.beat import DUMP_SIGNAL, Beats
from hpc.core.proc import process_state, progress
from hpc.launch.rank.flightrec import ask_for_dump

FROZEN_EXTRA_S = 2.0
SILENT_EXTRA_S = 5.0
WAITER_EXTRA_S = 10.0
LEARNED_FACTOR = 10.0  # learned bounds (the module doc): silent this many times its longest step gap...
LEARNED_MIN_S = 60.0  # ...but never under a minute...
LEARNED_MAX_S = 90.0  # ...nor over a minute and a half: with the extras, named within 2 minutes
PROGRESS_WINDOW_S = 10.0  # progress is judged over this much of the latest silence
BUSY_CPU_SHARE = 0.05  # of one core, over the window: a blocked process uses next to none
BUSY_BYTES = 1 << 20  # to or from storage over the window (a checkpoint; its own stack dump is a few KB)
# Stopped this long is frozen: once its peers, silent since the same step and idle, have had their stacks
# dumped (the learned floor and half a window), so that the line says where they waited for it.
FROZEN_S = LEARNED_MIN_S + PROGRESS_WINDOW_S / 2 + 5.0
_WAITING_IN = ("/torch/distributed/", "/torch/autograd/")  # a collective, or backward waiting on DDP's
DUMP_WAIT_S = 3.0  # for faulthandler's file to fill (it writes at once, from its signal handler)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def main_frames(stack_text: str) -> list[re.Match[str]]:
    """The main thread's frames in a faulthandler dump, innermost first: the thread block whose
    outermost frame is a module's, else the first block."""
    blocks: list[list[re.Match[str]]] = []
    for line in stack_text.splitlines():
        if "(most recent call first)" in line:
            blocks.append([])
        elif blocks and (m := _FRAME.match(line)):
            blocks[-1].append(m)
    blocks = [b for b in blocks if b]
    return next((b for b in blocks if b[-1]["func"] == "<module>"), blocks[0]) if blocks else []


def where(frames: list[re.Match[str]]) -> str | None:
    """The innermost frame, "func (file.py:N)", and the script's own innermost where that is Python's or
    a package's ("wait (threading.py:327) called from fetch (train.py:17)")."""
    if not frames:
        return None
    words = [f"{m['func']} ({Path(m['file']).name}:{m['line']})" for m in frames]
    own = next((i for i, m in enumerate(frames) if "/lib/python" not in m["file"]), 0)
    return words[0] if own == 0 else f"{words[0]} called from {words[own]}"


def waits_for_a_peer(frames: list[re.Match[str]]) -> bool:
    return any(part in m["file"] for m in frames for part in _WAITING_IN)


class HangWatch:
    """One task's watch: `check()` at each of the runner's polls; a line once the task is frozen or hung.
    `timeout_s` None: the learned bounds (the module doc); `busy` marks this rank busy for its peers,
    `peer_busy` says whether a peer is."""

    def __init__(
        self,
        pid: int,
        beats: Beats,
        timeout_s: float | None,
        stack: Path,
        peer_failed: Callable[[], bool],
        recorder: tuple[Path, Path] | None = None,  # NCCL's Flight Recorder: its dump, and the pipe to ask
        busy: Callable[[], None] = lambda: None,
        peer_busy: Callable[[], bool] = lambda: False,
    ):
        self.pid = pid
        self.beats = beats
        self.timeout_s = timeout_s
        self.stack = stack
        self.peer_failed = peer_failed
        self.recorder = recorder
        self.busy = busy
        self.peer_busy = peer_busy
        self.stopped_since: float | None = None
        self.waiting: tuple[float, str | None] | None = None  # since when it was seen waiting for a peer, where
        self.dumped: str | None = None  # the stacks dumped in this silence
        self.samples: list[tuple[float, int, int]] = []  # (when, CPU ticks, bytes moved) in this silence

    def bound_s(self) -> float:
        """How long a silence may last: the user's bound, else the learned one."""
        if self.timeout_s is not None:
            return self.timeout_s
        return min(max(LEARNED_FACTOR * self.beats.longest_gap_s, LEARNED_MIN_S), LEARNED_MAX_S)

    def words(self, bound: float) -> str:
        """Where the bound came from, for the line."""
        if self.timeout_s is not None:
            return f"{bound:g} s (command.hang_timeout_s)"
        return f"{bound:g} s (learned: {LEARNED_FACTOR:g}x its longest step gap, {LEARNED_MIN_S:g}-{LEARNED_MAX_S:g} s)"

    def check(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        self.beats.read()
        if process_state(self.pid) == "T":
            if self.stopped_since is None:
                self.stopped_since = now
            frozen = FROZEN_S if self.timeout_s is None else self.timeout_s + FROZEN_EXTRA_S
            if now - self.stopped_since >= frozen:
                setting = "" if self.timeout_s is None else " (command.hang_timeout_s)"
                return (
                    f"frozen: its process (pid {self.pid}) was stopped (SIGSTOP, or a debugger) for "
                    f"{frozen:g} s{setting}, after step {self.beats.steps}; a stopped process gives no stack"
                )
            return None
        self.stopped_since = None
        last = self.beats.last_s
        bound = self.bound_s()
        if last is None or now - last < bound:
            self.waiting = self.dumped = None
            self.samples = []
            return None
        working = self.working(now) if self.timeout_s is None else False
        if working is None:  # not yet a window of this silence seen: not judged
            return None
        if working:
            self.busy()  # its peers, waiting for it, are not hung either
            self.waiting = self.dumped = None
            return None
        if self.dumped is None:
            self.dumped = self.dump()
        if now - last < bound + SILENT_EXTRA_S or self.peer_failed():
            return None
        if self.waiting is None:
            frames = main_frames(self.dumped)
            at = where(frames)
            if not waits_for_a_peer(frames):
                return self.hung(f", in {at}" if at else "", bound)
            self.waiting = (now, at)  # a waiter's frames are torch's: never none
        since, at = self.waiting
        if self.timeout_s is None and self.peer_busy():
            self.waiting = (now, at)  # it waits for a peer that works: not hung while that lasts
            return None
        return self.hung(f", waiting for a peer in {at}", bound) if now - since >= WAITER_EXTRA_S else None

    def working(self, now: float) -> bool | None:
        """Whether the task made progress over the last PROGRESS_WINDOW_S of this silence (CPU, or storage
        I/O, by it or its children); None until half a window of it has been seen."""
        ticks, moved = progress(self.pid)
        self.samples = [s for s in self.samples if now - s[0] <= PROGRESS_WINDOW_S] + [(now, ticks, moved)]
        then, ticks_then, moved_then = self.samples[0]
        if now - then < PROGRESS_WINDOW_S / 2:
            return None
        used = (ticks - ticks_then) / os.sysconf("SC_CLK_TCK")
        return used >= BUSY_CPU_SHARE * (now - then) or moved - moved_then >= BUSY_BYTES

    def hung(self, at: str, bound: float) -> str:
        recorded = self.recorder is not None and self.recorder[0].exists()
        collectives = f"; NCCL's Flight Recorder: {self.recorder[0]}" if self.recorder and recorded else ""
        idle = "" if self.timeout_s is not None else ", idle (no CPU, no disk)"
        return (
            f"hung: its process (pid {self.pid}) made no step for {self.words(bound)}{idle} "
            f"after step {self.beats.steps}{at}; every thread's stack: {self.stack}{collectives}"
        )

    def dump(self) -> str:
        """Ask the task for its stacks (only once it said it can take the signal); what it wrote."""
        if not self.beats.ready:
            return ""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, DUMP_SIGNAL)
        if self.recorder is not None:
            ask_for_dump(self.recorder[1])
        deadline = time.monotonic() + DUMP_WAIT_S
        text = ""
        while time.monotonic() < deadline:  # pragma: no mutate (<= is the same loop, a clock tick apart)
            with contextlib.suppress(OSError):
                text = self.stack.read_text(errors="replace")
            if "(most recent call first)" in text and text.endswith("\n"):
                time.sleep(0.1)  # the other threads' blocks follow within microseconds
                with contextlib.suppress(OSError):
                    text = self.stack.read_text(errors="replace")
                break
            time.sleep(0.05)
        return text
