"""`python -m hpc.rank`: the door to hpc/launch/rank/rankcli.py (one rank of your own command)."""

from hpc.launch.rank.rankcli import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
