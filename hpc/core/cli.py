"""The one error path every command shares: bad input is one line on stderr and exit 2, never a
traceback or a usage block.

- `Parser`: argparse whose usage errors ("invalid int value: 'x'", a missing argument) raise
  UsageError instead of printing the usage block and exiting.
- `run(prog, main, argv)`: calls main; any `HpcError` becomes `prog: error: <message>`, cut to one
  line of at most MAX_MESSAGE characters, and the error's exit code.
- `shown(value)`: a value as a message quotes it, cut (a YAML anchor expansion can be megabytes).
- the checks every command makes before any work: output directories and files, names.
"""

from __future__ import annotations

import argparse
import os
import reprlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hpc.core.errors import HpcError, UsageError

MAX_MESSAGE = 600
MAX_VALUE = 120


class Parser(argparse.ArgumentParser):
    """argparse, with bad usage as one line naming the flag and the value (UsageError)."""

    def error(self, message: str) -> NoReturn:  # argparse's hook: it would print the usage block and exit 2
        raise UsageError(f"command line: {message} (see {self.prog} --help)")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, and an empty value is refused: `--config ""` or `--run-dir ""` would
        otherwise mean "not given" (or the current directory) without a word."""
        parsed = super().parse_args(args, namespace)
        refuse_empty(self, parsed)
        return parsed

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        refuse_empty(self, parsed)
        return parsed, rest


def refuse_empty(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> None:
    for action in _all_actions(parser):
        value = getattr(parsed, action.dest, None)
        if value == "" or (isinstance(value, list) and "" in value):
            flag = action.option_strings[-1] if action.option_strings else action.dest
            raise UsageError(f"command line: {flag} '': must not be empty")


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
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
    limits = reprlib.Repr()
    limits.maxlevel, limits.maxlist, limits.maxtuple, limits.maxdict = 2, 4, 4, 4
    limits.maxstring = limits.maxother = limits.maxlong = MAX_VALUE
    text = limits.repr(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


def one_line(message: str) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 20] + f"... ({len(text)} chars)"


def _os_reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def check_output_dir(out: str | os.PathLike | None, flag: str) -> None:
    """Before any work: `out` is a directory, or can be made there (no file in the way, writable,
    a name the file system takes)."""
    if out is None:
        return
    path = Path(out).absolute()
    try:
        existing = next((p for p in [path, *path.parents] if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise UsageError(f"{flag} {shown(str(path))}: {shown(str(existing))} is a file, not a directory")
        if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {shown(str(path))}: {shown(str(existing))} is not writable")
        for part in path.relative_to(existing or path.anchor).parts:
            _check_name_part(part, path, flag)
    except OSError as e:  # a name too long, a loop of links, a path under /proc the kernel refuses
        raise UsageError(f"{flag} {shown(str(path))}: not a usable directory ({_os_reason(e)})") from None


def _check_name_part(part: str, path: Path, flag: str) -> None:
    if "\0" in part:
        raise UsageError(f"{flag} {shown(str(path))}: a path may not hold NUL characters")
    if len(part.encode(errors="surrogateescape")) > 255:
        raise UsageError(f"{flag} {shown(str(path))}: a name in it is longer than 255 bytes")


def check_output_file(path: str | os.PathLike | None, flag: str) -> None:
    """Before any work: a result file can be written at `path` (its directory exists and is writable,
    it is not a directory, its name is one the file system takes)."""
    if path is None:
        return
    target = Path(path)
    try:
        parent = target.absolute().parent
        if not parent.is_dir():
            raise UsageError(f"{flag} {shown(str(path))}: directory {shown(str(parent))} does not exist")
        if target.is_dir():
            raise UsageError(f"{flag} {shown(str(path))}: is a directory, not a file")
        if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
            raise UsageError(f"{flag} {shown(str(path))}: cannot be written here (permission denied)")
        _check_name_part(target.name, target, flag)
    except OSError as e:
        raise UsageError(f"{flag} {shown(str(path))}: not a usable file name ({_os_reason(e)})") from None


NAME_MAX_BYTES = 200  # a name becomes a directory (255-byte limit) and a job name, with suffixes


def name_problem(value: str) -> str | None:
    """Why `value` cannot name a run directory and a Slurm job (--name, sweep.name), or None: the one
    rule, shared by the command line and the sweep file."""
    if not value or not value.isprintable():
        return "must be non-empty and printable, without control characters or line breaks"
    if "/" in value or value in (".", "..") or value.startswith("-"):
        return "is used as a directory name, so no '/', not '.' or '..', and no leading '-'"
    if len(value.encode(errors="surrogateescape")) > NAME_MAX_BYTES:
        size = len(value.encode(errors="surrogateescape"))
        return f"{size} bytes, more than {NAME_MAX_BYTES} bytes (it names directories and jobs)"
    return None


def check_name(value: str, source: str) -> None:
    """UsageError naming `source` when `value` cannot be a name (name_problem)."""
    problem = name_problem(value)
    if problem:
        raise UsageError(f"{source} {shown(value)}: {problem}")


def fail(prog: str, message: str, code: int = 2) -> int:
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code


def run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call main(argv); an HpcError becomes `prog: error: <message>` and its exit code."""
    try:
        return main(argv)
    except HpcError as e:
        return fail(prog, str(e), e.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
