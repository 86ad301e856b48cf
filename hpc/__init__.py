"""Take a PyTorch DDP training study from a laptop to a Slurm GPU cluster and back as numbers.

Floors, as subpackages, every import pointing down one (tests/README.md has the map):
- hpc/core: errors and exit codes, the command error path, atomic files, the run and sweep
  directory contract, summary.json's one writer; imports nothing else of the project;
- hpc/settings and hpc/placement: a run's settings (the config's schema and files, the flags, the task
  each rank runs) and where a process sits in a job (launcher variables, hostlists, affinity); torch-free;
- hpc/training: the training run and its parts, data, model, benchmark; torch. The analysis (the
  top-level `analysis` package) stands beside it;
- hpc/launch: the plan, the jobs, the per-rank runner, the queue, the study; torch-free.
The modules beside them (train, submit, study, config, data, distenv, bench, rank, batch) are the
commands' doors: `python -m hpc.<command>` and the console scripts enter there; each hands over.
"""

__version__ = "0.1.0"
