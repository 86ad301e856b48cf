"""`python -m hpc.data` and `hpc-data`: the door to hpc/training/data.py, where the command lives."""

from hpc.training.data import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
