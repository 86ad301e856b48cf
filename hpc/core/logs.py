"""Logging for every command: one logger per module (`logging.getLogger(__name__)`) under `hpc` and
`analysis`, and one set-up here, so that a user can turn the toolkit's lines down or up.

By default the output is what the commands always printed: INFO lines as they are on stdout, warnings
and errors on stderr (a record may ask for stderr with `extra=TO_STDERR`). `--log-level` (every
command) or HPC_LOG_LEVEL (inherited by the ranks of a job) sets the level: `warning` drops the
per-step lines, `debug` adds the detail: in training, every rank's own lines (`[rank R] ...`), which
other ranks than 0 log at DEBUG, so that by default rank 0's lines are the only ones, as they were.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping

from hpc.core.errors import UsageError

LOG_LEVEL_ENV = "HPC_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")
ROOTS = ("hpc", "analysis", "__main__")  # __main__: a module run as `python -m package.module` logs under it
TO_STDERR = {"stderr": True}  # log.info(..., extra=TO_STDERR): a note for stderr at INFO


class _Streams(logging.Handler):
    """INFO and below to stdout, WARNING and above (or a record marked for it) to stderr; each stream
    looked up when written to, so that redirections made after set-up are honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING or getattr(record, "stderr", False) else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed pipe must not turn a log line into a crash
            self.handleError(record)


def level_of(text: str | None, source: str) -> int | None:
    """A level's name as logging's number; None for no level; one-line error naming the bad value."""
    if text is None or text == "":
        return None
    if text.lower() not in LEVELS:
        raise UsageError(f"{source} {text!r}: not a log level (one of {', '.join(LEVELS)})")
    return int(getattr(logging, text.upper()))


def configure(level: str | None = None, env: Mapping[str, str] | None = None) -> int:
    """Set up the toolkit's loggers (again: the last call wins); returns the level in force. `level`:
    the command's --log-level; else the environment's HPC_LOG_LEVEL; else INFO."""
    env = os.environ if env is None else env
    chosen = level_of(level, "--log-level")
    if chosen is None:
        chosen = level_of(env.get(LOG_LEVEL_ENV), LOG_LEVEL_ENV)
    if chosen is None:
        chosen = logging.INFO
    handler = _Streams()
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ROOTS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(chosen)
        logger.propagate = False
    return chosen


def quiet_torch_cpp(env: MutableMapping[str, str] | None = None) -> None:
    """Torch's C++ warnings off for the toolkit's training unless `env` (os.environ: read by torch's C++
    core as it loads) says a level. The training says each failure in one line, which torch's warnings
    would follow on every rank left: a dead peer's store connection reset, with its C++ frames (the
    heartbeat's thread, under load). Errors still show; TORCH_CPP_LOG_LEVEL=WARNING shows the rest."""
    (os.environ if env is None else env).setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
