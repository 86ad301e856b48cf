"""Cluster profiles and run configs (YAML), shipped with the package as hpc.profiles; see README."""
