"""Take a PyTorch DDP training study from a laptop to a Slurm GPU cluster and back as numbers."""

__version__ = "0.1.0"
