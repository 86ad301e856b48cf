"""`python -m hpc.distenv` and `hpc-distenv`: the door to hpc/launch/distenv.py, where the command lives."""

from hpc.launch.distenv import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
