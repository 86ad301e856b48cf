"""`python -m hpc.job`: the door to hpc/launch/jobcmd.py (one run's log, status and cancel)."""

from hpc.launch.jobcmd import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
