"""`python -m hpc.train` and `hpc-train`: the door to hpc/training/command.py. The stop signals are caught
before that module (and torch: seconds on a loaded node) is imported, so a signal during start-up is a
clean stop, not a kill (hpc/core/stop.py)."""

import os
import sys

from hpc.core.stop import StopSignal


def cli(argv: list[str] | None = None) -> int:
    early = StopSignal.early()  # handed back here if the command ends before a run takes it over
    try:
        from hpc.training.command import cli as command_cli

        return command_cli(argv)
    finally:
        early.restore()


if __name__ == "__main__":
    code = cli()
    sys.stdout.flush()  # then no C++ static destructors: their rare abort once failed a finished run in CI
    sys.stderr.flush()
    os._exit(code)
