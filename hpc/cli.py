"""Shared CLI plumbing: bad input is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import sys
from typing import Callable


class UsageError(ValueError):
    """Bad input found outside the config layer (missing data files, unwritable run directory...)."""


def expected_errors() -> tuple[type[BaseException], ...]:
    from hpc.config import ConfigError
    from hpc.distenv import DistEnvError, HostlistError

    return (ConfigError, DistEnvError, HostlistError, UsageError)


def run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call main(argv); expected errors become `prog: error: <message>` and exit code 2."""
    try:
        return main(argv)
    except expected_errors() as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
