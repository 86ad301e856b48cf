"""`python -m hpc.study` and `hpc-study`: the door to hpc/launch/study.py, where the command lives."""

# Analysis jobs queued by earlier releases hold a pickle that names hpc.study.AnalysisJob.
from hpc.launch.study import AnalysisJob, cli, main

__all__ = ["AnalysisJob", "cli", "main"]

if __name__ == "__main__":
    raise SystemExit(cli())
