"""`python -m hpc.distenv` and `hpc-distenv`: the door to hpc/placement/distenv.py, where the command lives."""

from hpc.placement.distenv import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
