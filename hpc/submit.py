"""`python -m hpc.submit` and `hpc-submit`: the door to hpc/launch/submit.py, where the command lives."""

# Jobs queued or requeued by earlier releases hold a pickle that names hpc.submit.TrainJob.
from hpc.launch.job import TrainJob
from hpc.launch.submit import cli, main

__all__ = ["TrainJob", "cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
