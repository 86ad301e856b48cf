"""Take a PyTorch DDP training study from a laptop to a Slurm GPU cluster and back as numbers.

Two halves and a leaf core, as subpackages:
- hpc/core: errors and exit codes, the command error path, atomic files, the run and sweep
  directory contract; imports nothing else of the project;
- hpc/launch: config, submission, the study, the distributed environment, the queue; torch-free;
- hpc/training: the training run and its parts, data, model, benchmark; torch.
The modules beside them (train, submit, study, config, data, distenv, bench) are the commands' doors:
`python -m hpc.<command>` and the console scripts enter there; each hands over to its half.
"""

__version__ = "0.1.0"
