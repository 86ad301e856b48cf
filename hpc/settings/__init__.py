"""A run's settings, below both halves: the configuration's schema (schema.py, its field checks in
fields.py, the cluster profile's in cluster.py), its files and layers (config.py), the flags shared by
the commands (flags.py), which ranks record traces (profranks.py), what each rank of a job runs
(rankcommand.py), and the one reference of every key and HPC_* variable (reference.py). It imports only
hpc/core; the training half, the analysis and the launcher stand on it. No torch import.
"""
