"""A rank that stopped making progress, named by its runner (hpc/launch/rank/runner.py), for any task the
start-up hook watches (a user's script; hpc/core/beat.py): torch-free, from outside the task, so it
works when the task cannot (stopped, or stuck in a collective holding the GIL's owner in C).

- frozen: the task's process is stopped (state T in /proc: SIGSTOP, a node's job freezer) for
  `timeout_s` + FROZEN_EXTRA_S; no stack can be had from it (a stopped process runs no handler). The
  extra lets its peers, silent since the same step, dump their stacks first: they dump at `timeout_s`
  of silence, while they still wait for it (once it is killed, their collectives fail at once).
- hung: the task made steps, then none for `timeout_s` + SILENT_EXTRA_S (the extra lets a frozen peer,
  whose silence began at the same step, be named first), and no peer failed meanwhile; its stack is
  dumped first (faulthandler, on DUMP_SIGNAL), and the line says where its main thread was. A rank
  whose main thread waits inside torch.distributed or autograd's engine (DDP's gradient sync) waits for
  a peer: it is named only WAITER_EXTRA_S later, so that the peer it waits for, stuck elsewhere, is
  named first; when every rank waits (a deadlock in collectives), each is named.

Where the task runs NCCL, its Flight Recorder is asked for a dump with the stack (hpc/launch/rank/flightrec.py).

`timeout_s` is command.hang_timeout_s: longer than any pause between the script's optimizer steps
(an evaluation pass, a checkpoint), as torch's own collective timeout must be.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from hpc.core.beat import DUMP_SIGNAL, Beats
from hpc.launch.rank.flightrec import ask_for_dump

FROZEN_EXTRA_S = 2.0
SILENT_EXTRA_S = 5.0
WAITER_EXTRA_S = 10.0
_WAITING_IN = ("/torch/distributed/", "/torch/autograd/")  # a collective, or backward waiting on DDP's
DUMP_WAIT_S = 3.0  # for faulthandler's file to fill (it writes at once, from its signal handler)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T, t, Z...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :][:1] or None  # after the command name, which may hold spaces


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
    """One task's watch: `check()` at each of the runner's polls; a line once the task is frozen or hung."""

    def __init__(
        self,
        pid: int,
        beats: Beats,
        timeout_s: float,
        stack: Path,
        peer_failed: Callable[[], bool],
        recorder: tuple[Path, Path] | None = None,  # NCCL's Flight Recorder: its dump, and the pipe to ask
    ):
        self.pid = pid
        self.beats = beats
        self.timeout_s = timeout_s
        self.stack = stack
        self.peer_failed = peer_failed
        self.recorder = recorder
        self.stopped_since: float | None = None
        self.waiting: tuple[float, str] | None = None  # since when it was seen waiting for a peer, where
        self.dumped: str | None = None  # the stacks dumped in this silence

    def check(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        self.beats.read()
        if process_state(self.pid) == "T":
            self.stopped_since = self.stopped_since or now
            if now - self.stopped_since >= self.timeout_s + FROZEN_EXTRA_S:
                return (
                    f"frozen: its process (pid {self.pid}) was stopped (SIGSTOP, or a debugger) for "
                    f"{self.timeout_s:g} s (command.hang_timeout_s), after step {self.beats.steps}; a "
                    "stopped process gives no stack"
                )
            return None
        self.stopped_since = None
        last = self.beats.last_s
        if last is None or now - last < self.timeout_s:
            self.waiting = self.dumped = None
            return None
        if self.dumped is None:
            self.dumped = self.dump()
        if now - last < self.timeout_s + SILENT_EXTRA_S or self.peer_failed():
            return None
        if self.waiting is None:
            frames = main_frames(self.dumped)
            at = where(frames)
            if not waits_for_a_peer(frames):
                return self.hung(f", in {at}" if at else "")
            self.waiting = (now, at or "?")
        since, at = self.waiting
        return self.hung(f", waiting for a peer in {at}") if now - since >= WAITER_EXTRA_S else None

    def hung(self, at: str) -> str:
        recorded = self.recorder is not None and self.recorder[0].exists()
        collectives = f"; NCCL's Flight Recorder: {self.recorder[0]}" if self.recorder and recorded else ""
        return (
            f"hung: its process (pid {self.pid}) made no step for {self.timeout_s:g} s "
            f"(command.hang_timeout_s) after step {self.beats.steps}{at}; "
            f"every thread's stack: {self.stack}{collectives}"
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
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                text = self.stack.read_text(errors="replace")
            if "(most recent call first)" in text and text.endswith("\n"):
                time.sleep(0.1)  # the other threads' blocks follow within microseconds
                with contextlib.suppress(OSError):
                    text = self.stack.read_text(errors="replace")
                break
            time.sleep(0.05)
        return text
