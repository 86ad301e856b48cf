"""`python -m hpc.config` and `hpc-config`: the door to hpc/launch/configcli.py, where the command lives."""

from hpc.launch.configcli import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
