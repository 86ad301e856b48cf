"""A rank's output, kept and passed on: `Pump` copies one of its task's streams (a pipe) into the rank's
log file (RUN/logs/rank{R}.out or .err, which the runner reads for a failure's last lines) and to the
runner's own stream, as it comes: the job's log under srun, submitit's per-task log, torchrun's console,
a terminal. Written here because no library does this copy to two places for a pipe; a thread a stream,
which ends when the task (and any process of its that holds the pipe) has closed it. No torch import.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import IO

from hpc.core.owner import open_append

CHUNK = 1 << 16
FINISH_S = 10.0  # how long the end of a task waits for its output: a grandchild may hold the pipe open


class Pump:
    """Copies `source` to the file `kept` (appended: a requeued run's attempts follow one another) and to
    the file descriptor `passed_to` (1 or 2), until `source` ends."""

    def __init__(self, source: IO[bytes], kept: Path, passed_to: int):
        self.source = source
        self.kept = kept
        self.passed_to = passed_to
        self.thread = threading.Thread(target=self._copy, name=f"pump {kept.name}", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        with os.fdopen(open_append(self.kept), "ab") as kept:
            while chunk := self._read():
                kept.write(chunk)
                kept.flush()
                self._pass_on(chunk)

    def _read(self) -> bytes:
        try:
            return os.read(self.source.fileno(), CHUNK)
        except OSError:
            return b""

    def _pass_on(self, chunk: bytes) -> None:
        """All of it, or as much as the runner's stream takes (a closed terminal must not stop the copy
        into the rank's log)."""
        with contextlib.suppress(OSError):
            while chunk:
                chunk = chunk[os.write(self.passed_to, chunk) :]

    def finish(self, timeout_s: float = FINISH_S) -> None:
        """Wait for the copy to reach the stream's end (at most timeout_s), then let the pipe go."""
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.source.close()
