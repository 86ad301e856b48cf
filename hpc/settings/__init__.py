"""A run's settings, below both halves: the configuration's schema (schema.py, its field checks in
fields.py, the cluster profile's in cluster.py), its files and layers (config.py), the flags shared by
the commands (flags.py), which ranks record traces (profranks.py), and what each rank of a job runs
(rankcommand.py). It imports only hpc/core; the training half, the analysis and the launcher stand on it. No
torch import.
"""
