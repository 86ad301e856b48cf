"""`python -m hpc.config` and `hpc-config`: the door to hpc/launch/configcmd.py, where the command lives."""

from hpc.launch.configcmd import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
