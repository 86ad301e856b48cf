"""The one error path every command shares: bad input is one line on stderr and exit 2, never a
traceback or a usage block.

- `Parser`: argparse whose usage errors ("invalid int value: 'x'", a missing argument) raise
  UsageError instead of printing the usage block and exiting; no flag abbreviations (`--gpu 2` is not
  `--gpus 2`), "did you mean" for a mistyped flag, and a command that acts (`needs_args`) given no
  arguments at all prints its usage and exits 2. Usage names the command as it was started: the
  console script (`hpc-study run`) or `python -m hpc.study run`.
- `run(prog, main, argv)`: calls main; any `HpcError` becomes `prog: error: <message>`, cut to one
  line of at most MAX_MESSAGE characters, and the error's exit code.
- `shown(value)`: a value as a message quotes it, cut (a YAML anchor expansion can be megabytes).
- the checks every command makes before any work: output directories (the owner's: hpc/core/owner.py)
  and files, names.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
import os
import re
import reprlib
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from hpc.core.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, HpcError, NoArguments, UsageError
from hpc.core.logs import LEVELS, LOG_LEVEL_ENV, configure
from hpc.core.owner import refuse_unsafe, take_umask
from hpc.core.rundir import RunPaths

MAX_MESSAGE = 600
OVERRIDE_WORD = re.compile(r"\+{0,2}[A-Za-z_]\w*(\.\w+)+=.*", re.DOTALL)  # train.lr=0.1, Hydra's +key=value
MAX_VALUE = 120
INT64_MAX = 2**63 - 1  # counts, sizes and seeds end up in int64 (torch, numpy, Slurm): a larger integer is bad input


def suggestion(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean X?" for the closest of `choices` (the standard library's difflib), or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def command_name(prog: str, argv0: str | None = None) -> str:
    """`python -m hpc.study run` as the user started it: `hpc-study run` from the console script."""
    script = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    if prog.startswith("python -m ") and script.startswith("hpc-"):
        return " ".join([script, *prog.split()[3:]])
    return prog


BARE = "\x00bare"  # the value of a flag of Parser.attached_only given without `=VALUE` (never a word typed)


class Parser(argparse.ArgumentParser):
    """argparse, with bad usage as one line naming the flag and the value (UsageError)."""

    def __init__(
        self, *args: Any, needs_args: bool = False, unknown_hint: Callable[[str], str] | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("allow_abbrev", False)
        if "prog" in kwargs:
            kwargs["prog"] = command_name(kwargs["prog"])
        super().__init__(*args, **kwargs)
        self.needs_args = needs_args
        self.unknown_hint = unknown_hint  # what else an unrecognized word may be, for this command
        # flags whose value comes only after `=` (sbatch's --exclusive[=user]): bare, they take no next word
        self.attached_only: frozenset[str] = frozenset()
        self.add_argument(
            "--log-level",
            choices=LEVELS,
            default=argparse.SUPPRESS,  # a subcommand's parser must not reset its parent's value
            help=f"how much the toolkit says: debug adds detail, warning drops the progress lines (default: "
            f"${LOG_LEVEL_ENV}, else info)",
        )

    def error(self, message: str) -> NoReturn:  # argparse's hook: it would print the usage block and exit 2
        if message.startswith("unrecognized arguments: "):
            first = message.split(": ", 1)[1].split()[0]
            flags = [f for a in _all_actions(self) for f in a.option_strings]
            if OVERRIDE_WORD.fullmatch(first) and "--set" in flags:  # Hydra's habit: key=value, no flag
                message += f"; did you mean --set {first.lstrip('+')}?"
            else:
                hint = self.unknown_hint(first) if self.unknown_hint else ""
                message += suggestion(first.split("=")[0], flags) + hint
        raise UsageError(f"command line: {message} (see {self.prog} --help)")

    def _no_arguments(self, args: Sequence[str] | None) -> None:
        if self.needs_args and not (sys.argv[1:] if args is None else list(args)):
            raise NoArguments(
                self.format_usage().rstrip() + f"\n{self.prog}: no arguments given (see {self.prog} --help)"
            )

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """As argparse's, with the one rule for numbers of every flag: finite, and an integer within int64."""
        value = super()._get_value(action, arg_string)
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"command line: {flag} {shown(arg_string)}: must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            raise UsageError(f"command line: {flag} {shown(arg_string)}: must be an integer within +-{INT64_MAX}")
        return value

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, and an empty value is refused: `--config ""` or `--run-dir ""` would
        otherwise mean "not given" (or the current directory) without a word."""
        self._no_arguments(args)
        parsed = super().parse_args(args, namespace)  # through parse_known_args, which marks the bare flags
        refuse_empty(self, parsed)
        configure(getattr(parsed, "log_level", None))
        return parsed

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._no_arguments(args)
        parsed, rest = super().parse_known_args(self._bare_marked(args), namespace)
        refuse_empty(self, parsed)
        configure(getattr(parsed, "log_level", None))
        return parsed, rest

    def _bare_marked(self, args: Sequence[str] | None) -> list[str] | None:
        """The words with BARE after each bare flag of `attached_only` (before `--`): argparse's optional value
        would take the next word, which sbatch never gives such a flag (its value comes after `=`)."""
        if not self.attached_only:
            return None if args is None else list(args)
        words, out = list(sys.argv[1:] if args is None else args), list[str]()
        for i, word in enumerate(words):
            if word == "--":
                return out + words[i:]
            out += [word, BARE] if word in self.attached_only else [word]
        return out


def refuse_empty(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> None:
    """An empty value, or none at all where one is expected (argparse turns `--steps=--` into [])."""
    for action in _all_actions(parser):
        value = getattr(parsed, action.dest, None)
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if value == "" or (isinstance(value, list) and "" in value):
            raise UsageError(f"command line: {flag} '': must not be empty")
        if isinstance(action, argparse._StoreAction) and action.nargs is None and isinstance(value, list):
            raise UsageError(f"command line: {flag}: expected one value, got {shown(value)}")


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's actions and its subcommands' (argparse keeps those in each subparser)."""
    found = []
    for action in parser._actions:
        found.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_actions(sub))
    return found


def shown(value: object) -> str:
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


def inspect_path(path: str | os.PathLike[str], source: str) -> os.stat_result | None:
    """The status of what `path` names (links followed), or None where nothing is there; UsageError naming
    `source` and the path where the system will not look (a name too long, a loop of links, no access)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise UsageError(f"{source} {shown(str(path))}: not a usable path ({_os_reason(e)})") from None
    except ValueError:  # a NUL character: only from a file's value, never from a command line
        raise UsageError(f"{source} {shown(str(path))}: a path may not hold NUL characters") from None


def _probe_writable(directory: Path, source: str, target: Path) -> None:
    """Make and remove an entry in `directory`: as root, os.access says yes to /proc and /sys."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hpc-probe-", dir=directory))
    except OSError as e:
        raise UsageError(
            f"{source} {shown(str(target))}: cannot write in {shown(str(directory))} ({_os_reason(e)})"
        ) from None


def _nearest_existing(path: Path, source: str) -> tuple[Path, os.stat_result]:
    for candidate in [path, *path.parents]:
        status = inspect_path(candidate, source)
        if status is not None:
            return candidate, status
    raise UsageError(f"{source} {shown(str(path))}: no part of it exists")  # pragma: no cover - "/" does


def first_missing(path: Path, source: str = "--run-dir") -> Path | None:
    """The outermost directory of `path` that does not exist yet (what making it creates), or None."""
    missing = None
    for candidate in [path, *path.absolute().parents]:
        if inspect_path(candidate, source) is not None:
            return missing
        missing = candidate
    return missing


def check_output_dir(out: str | os.PathLike[str] | None, flag: str) -> None:
    """Before any work: `out` is a directory that can be written, or one that can be made: its nearest
    existing ancestor is a directory we can write in, and every name below it one the file system takes."""
    if out is None:
        return
    path = Path(out).absolute()
    for part in path.parts:
        _check_name_part(part, path, flag)
    existing, status = _nearest_existing(path, flag)
    if not stat.S_ISDIR(status.st_mode):
        what = "a file" if stat.S_ISREG(status.st_mode) else "not a directory"
        raise UsageError(f"{flag} {shown(str(path))}: {shown(str(existing))} is {what}, not a directory")
    refuse_unsafe(existing, flag, made_in=existing != path)  # another user's, or one they can write in
    _probe_writable(existing, flag, path)


def check_run_dir(path: str | os.PathLike[str], flag: str = "--run-dir") -> None:
    """Before any work: an output directory (check_output_dir) that, where it exists, is empty or holds a
    run. Every door that writes a run (hpc.train, hpc.rank, hpc.batch) writes task.json, logs/, ranks/
    and more into it, and must not scatter them into a directory of other things (`--run-dir ~`, /etc)."""
    check_output_dir(path, flag)
    if not RunPaths(Path(path)).is_run_or_empty():
        names = sorted(p.name for p in Path(path).iterdir())
        shown_names = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise UsageError(
            f"{flag} {shown(str(path))}: holds other files ({shown_names}), not a run; "
            "give a new directory, or an existing run's to resume it"
        )


def _check_name_part(part: str, path: Path, flag: str) -> None:
    if "\0" in part:
        raise UsageError(f"{flag} {shown(str(path))}: a path may not hold NUL characters")
    if len(part.encode(errors="surrogateescape")) > 255:
        raise UsageError(f"{flag} {shown(str(path))}: a name in it is longer than 255 bytes")


def check_output_file(path: str | os.PathLike[str] | None, flag: str) -> None:
    """Before any work: a result file can be written at `path`: its directory exists and can be written,
    and nothing but a regular file is there (writing replaces it: never a device such as /dev/null)."""
    if path is None:
        return
    target = Path(path).absolute()
    for part in target.parts:
        _check_name_part(part, target, flag)
    status = inspect_path(target, flag)
    if status is not None and not stat.S_ISREG(status.st_mode):
        what = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        raise UsageError(f"{flag} {shown(str(path))}: is {what}, not a file")
    parent = inspect_path(target.parent, flag)
    if parent is None or not stat.S_ISDIR(parent.st_mode):
        raise UsageError(f"{flag} {shown(str(path))}: directory {shown(str(target.parent))} does not exist")
    refuse_unsafe(target.parent, flag)
    _probe_writable(target.parent, flag, target)


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


# `0,13`: whole numbers, comma-separated; ASCII digits only, for int() refuses one such as '²'
NUMBER_LIST = re.compile(r"\d{1,7}(,\d{1,7})*", re.ASCII)


def counts(text: str, flag: str, least: int, example: str) -> list[int]:
    """A flag's comma-separated whole numbers, each at least `least` (`--ranks 4,8,16,32`); else one line."""
    words = text.replace(" ", "")
    if NUMBER_LIST.fullmatch(words) is None or min(int(w) for w in words.split(",")) < least:
        raise UsageError(
            f"{flag} {text!r}: must be a comma-separated list of counts of {least} or more, e.g. {example}"
        )
    return [int(w) for w in words.split(",")]


def fail(prog: str, message: str, code: int = 2) -> int:
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code


# Terminal controls: C0 but tab, line feed and carriage return (a progress bar's), DEL, and C1 (0x9b is
# an escape sequence's start too). A trace's names, a job's log or a summary are other people's data.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with every terminal control written out (ESC as the four characters \\x1b): printed, it
    shows what is there and moves, recolours or retitles nothing."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class EscapedStream:
    """A text stream whose writes reach `stream` with their terminal controls escaped (escape_controls);
    everything else (flush, fileno, encoding) is the stream's."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(escape_controls(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call main(argv); an HpcError becomes `prog: error: <message>` and its exit code. Names a command
    prints as it was given them (bytes that are not UTF-8 arrive as surrogates) go out as those bytes; no
    terminal control goes out as one (EscapedStream on stdout and stderr while it runs)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedStream(sys.stdout), EscapedStream(sys.stderr)
    try:
        configure()  # from HPC_LOG_LEVEL until the command line is read
        take_umask()  # what it and every process it starts make is the owner's (hpc/core/owner.py)
        return main(argv)
    except NoArguments as e:  # the usage block, as it is
        print(str(e), file=sys.stderr, flush=True)
        return e.exit_code
    except HpcError as e:
        return fail(prog, str(e), e.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `| head` closed the pipe: the reader has what it wanted; nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), streams[0].fileno())  # the interpreter's last flush
        return EXIT_BROKEN_PIPE
    finally:
        sys.stdout, sys.stderr = streams
