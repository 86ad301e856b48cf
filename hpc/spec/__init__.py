"""A run's description, below both halves: the config's schema and its loading (schema.py, fields.py,
cluster.py, config.py, flags.py), where a process sits in a job (distenv.py, hostlist.py, torchrun.py),
which GPU and cores a rank takes (affinity.py), which network NCCL chose (netcheck.py), and DDP's
scaling model (scaling.py). It imports only hpc/core; the training half (hpc/training), the analysis
(analysis/) and the launcher (hpc/launch) stand on it. No torch import.
"""
