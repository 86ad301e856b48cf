"""Take a PyTorch DDP training study from a laptop to a Slurm GPU cluster and back as numbers.

Floors, as subpackages, every import pointing down one (tests/unit/test_architecture.py checks it):
- core/: errors and exit codes, the command error path, atomic files, the run and sweep directory
  contract, summary.json's one writer; imports nothing else of the project;
- settings/ and placement/: a run's settings (the config's schema and files, the flags, the task each
  rank runs) and where a process sits in a job (launcher variables, hostlists, affinity); torch-free;
- training/: the training run and its parts, data, model; torch. The analysis (the top-level `analysis`
  package) stands beside it;
- launch/: the plan, the jobs, the per-rank runner, the queue, the study; torch-free;
- bench/: the benchmarks (`python -m hpc.bench`), apart from the product.
The commands' doors, each a few lines that hand over: train.py, submit.py, study.py, job.py, config.py, data.py,
distenv.py, rank.py and batch.py (`python -m hpc.<command>` and the console scripts enter there).
"""

__version__ = "0.1.0"
