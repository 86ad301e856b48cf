"""`python -m hpc.distenv` and `hpc-distenv`: the door to hpc/placement/distenvcli.py, where the command lives."""

from hpc.placement.distenvcli import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
