"""Where a process sits in a job, below both halves: Slurm's hostlists and task counts (hostlist.py),
the launchers' variables made torch.distributed's (distenv.py; its command, `python -m hpc.distenv`, is
distenvcli.py), torchrun's words (torchrun.py), the GPU and cores a rank takes (affinity.py), and what a
job's shape costs its all-reduce (scaling.py: DDP's scaling model over NVLink and the network). It
imports only hpc/core. No torch import.
"""
