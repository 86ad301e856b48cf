"""`python -m hpc.distenv` and `hpc-distenv`: the door to hpc/spec/distenv.py, where the command lives."""

from hpc.spec.distenv import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
