"""`python -m hpc.bench` and `hpc-bench`: the door to hpc/training/trainspeed.py, where the command lives."""

from hpc.training.trainspeed import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
