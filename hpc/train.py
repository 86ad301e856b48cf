"""`python -m hpc.train` and `hpc-train`: the door to hpc/training/command.py, where the command lives."""

from hpc.training.command import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    import os
    import sys

    code = cli()
    # Everything is written and closed by now. Leave without running C++ static destructors: a rare
    # abort there ("terminate called without an active exception", seen once in CI after a complete
    # run) would turn a finished run into a failed task.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
