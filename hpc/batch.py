"""`python -m hpc.batch`: the door to hpc/launch/batch.py (the batch shell of jobs/*.sbatch)."""

from hpc.launch.batch import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
