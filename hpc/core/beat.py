"""A rank's beat: how the per-rank runner (hpc/launch/rank/runner.py) knows that its task still makes steps,
with no file written per step (a thousand ranks on a parallel file system) and no torch here.

The runner makes a pipe and hands its writing end to the task (HPC_BEAT = "FD:INODE": a process of the
command that did not inherit that very pipe, a grandchild started with close_fds, finds another inode
there and writes nothing). The start-up hook in the task (hpc/training/hook/scriptwatch.py) writes one STEP
byte per optimizer step, and READY once its stack dump is armed: from then on DUMP_SIGNAL makes it write
every thread's Python stack (faulthandler) to RUN/ranks/rank{R}.stack.txt. Before READY the runner never
sends that signal: a real-time signal's default action ends a process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import time
from collections.abc import Mapping

BEAT_VARIABLE = "HPC_BEAT"
STEP, READY = b".", b"R"
DUMP_SIGNAL = signal.SIGRTMIN + 5  # used by no launcher, framework or Slurm (USR1/USR2 often are)


def beat_pipe() -> tuple[int, int, str]:
    """The runner's reading end, the task's writing end, and the task's HPC_BEAT value."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return read_fd, write_fd, f"{write_fd}:{os.fstat(write_fd).st_ino}"


def beat_fd(env: Mapping[str, str]) -> int | None:
    """The task's writing end, if this process has the very pipe the runner made; else None."""
    fd_text, _, inode = env.get(BEAT_VARIABLE, "").partition(":")
    if not (fd_text.isdigit() and inode.isdigit()):
        return None
    try:
        st = os.fstat(int(fd_text))
    except OSError:
        return None
    return int(fd_text) if stat.S_ISFIFO(st.st_mode) and st.st_ino == int(inode) else None


class Beats:
    """The runner's side: the steps seen, when the last came, and whether the task can dump its stack."""

    def __init__(self, read_fd: int):
        self.fd: int | None = read_fd
        self.steps = 0
        self.last_s: float | None = None  # monotonic time of the last step seen
        self.longest_gap_s = 0.0  # the longest time between steps seen so far
        self.ready = False

    def read(self) -> None:
        """Take what the task wrote since the last call (never blocks)."""
        while self.fd is not None:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # every writer gone
                self.close()
                return
            steps = data.count(STEP)
            if steps:
                now = time.monotonic()
                if self.last_s is not None:  # the run's own pace, read every poll (a gap to within a poll)
                    self.longest_gap_s = max(self.longest_gap_s, now - self.last_s)
                self.steps = self.steps + steps
                self.last_s = now
            self.ready = self.ready or READY in data

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
