"""`python -m hpc.rank`: the door to hpc/launch/rankcmd.py (one rank of your own command)."""

from hpc.launch.rankcmd import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
