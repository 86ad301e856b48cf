"""The one error path every command shares: bad input is one line on stderr and exit 2, never a
traceback or a usage block.

- `Parser`: argparse whose usage errors ("invalid int value: 'x'", a missing argument) raise
  UsageError instead of printing the usage block and exiting.
- `run(prog, main, argv)`: calls main; the expected errors (UsageError, ConfigError, DistEnvError,
  HostlistError) become `prog: error: <message>`, cut to one line of at most MAX_MESSAGE characters.
- `shown(value)`: a value as a message quotes it, cut (a YAML anchor expansion can be megabytes).

No torch import: the analysis and submission commands use this too.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

MAX_MESSAGE = 600
MAX_VALUE = 120


class UsageError(ValueError):
    """Bad input found outside the config layer (missing data files, unwritable run directory...)."""


class Parser(argparse.ArgumentParser):
    """argparse, with bad usage as one line naming the flag and the value (UsageError)."""

    def error(self, message: str):  # argparse's hook: it would print the usage block and exit 2
        raise UsageError(f"command line: {message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, and an empty value is refused: `--config ""` or `--run-dir ""` would
        otherwise mean "not given" (or the current directory) without a word."""
        parsed = super().parse_args(args, namespace)
        for action in _all_actions(self):
            value = getattr(parsed, action.dest, None)
            if value == "" or (isinstance(value, list) and "" in value):
                flag = action.option_strings[-1] if action.option_strings else action.dest
                raise UsageError(f"command line: {flag} '': must not be empty")
        return parsed


def _all_actions(parser: argparse.ArgumentParser) -> list:
    """A parser's actions and its subcommands' (argparse keeps those in each subparser)."""
    found = []
    for action in parser._actions:
        found.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_actions(sub))
    return found


def shown(value: Any) -> str:
    """repr(value), cut to about MAX_VALUE characters without building the whole repr (reprlib: a
    YAML alias bomb is a small object whose full repr has billions of characters)."""
    import reprlib

    limits = reprlib.Repr()
    limits.maxlevel, limits.maxlist, limits.maxtuple, limits.maxdict = 2, 4, 4, 4
    limits.maxstring = limits.maxother = limits.maxlong = MAX_VALUE
    text = limits.repr(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 3] + "..."


def one_line(message: str) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 20] + f"... ({len(text)} chars)"


def check_output_dir(out, flag: str) -> None:
    """Before any work: `out` is a directory, or can be made (no file in the way, writable)."""
    import os
    from pathlib import Path

    if out is None:
        return
    out = Path(out).absolute()
    existing = next((p for p in [out, *out.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"{flag} {str(out)!r}: {str(existing)!r} is a file, not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {str(out)!r}: {str(existing)!r} is not writable")


def check_output_file(path, flag: str) -> None:
    """Before any work: a result file can be written at `path` (its directory exists, it is not one)."""
    from pathlib import Path

    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: directory {str(parent)!r} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"{flag} {str(path)!r}: is a directory, not a file")


NAME_MAX_BYTES = 200  # a name becomes a directory (255-byte limit) and a job name, with suffixes


def name_problem(value: str) -> str | None:
    """Why `value` cannot name a run directory and a Slurm job (--name, sweep.name), or None: the one
    rule, shared by the command line and the sweep file."""
    if not value or not value.isprintable():
        return "must be non-empty and printable, without control characters or line breaks"
    if "/" in value or value in (".", "..") or value.startswith("-"):
        return "is used as a directory name, so no '/', not '.' or '..', and no leading '-'"
    if len(value.encode()) > NAME_MAX_BYTES:
        return f"{len(value.encode())} bytes, more than {NAME_MAX_BYTES} bytes (it names directories and jobs)"
    return None


def check_name(value: str, source: str) -> None:
    """UsageError naming `source` when `value` cannot be a name (name_problem)."""
    problem = name_problem(value)
    if problem:
        raise UsageError(f"{source} {shown(value)}: {problem}")


def expected_errors() -> tuple[type[BaseException], ...]:
    from hpc.config import ConfigError
    from hpc.distenv import DistEnvError, HostlistError

    return (ConfigError, DistEnvError, HostlistError, UsageError)


def fail(prog: str, message: str, code: int = 2) -> int:
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code


def run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call main(argv); expected errors become `prog: error: <message>` and exit code 2."""
    try:
        return main(argv)
    except expected_errors() as e:
        return fail(prog, str(e))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
