"""`python -m hpc.submit` and `hpc-submit`: the door to hpc/launch/submission/submit.py, where the command lives."""

from hpc.launch.submission.submit import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
