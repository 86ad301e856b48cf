"""`python -m hpc.study` and `hpc-study`: the door to hpc/launch/study.py, where the command lives."""

from hpc.launch.study import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
