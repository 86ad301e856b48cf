"""`python -m hpc.bench` and `hpc-bench`: the training-speed benchmark of hpc/bench/trainspeed.py."""

from hpc.bench.trainspeed import cli

if __name__ == "__main__":
    raise SystemExit(cli())
