"""`python -m hpc.bench` and `hpc-bench`: the door to hpc/training/bench.py, where the command lives."""

from hpc.training.bench import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
