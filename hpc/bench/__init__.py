"""Benchmarks, apart from the product: each prints figures; none is a test.

- __main__.py: `python -m hpc.bench` (`hpc-bench`), the training-speed benchmark of trainspeed.py;
- trainspeed.py: per-GPU training speed, the seed scripts' way against the toolkit's, one change at a time;
- speedvariants.py: the benchmark's configurations and how one is timed;
- hookcost.py: what the start-up hook costs a user's step (`python -m hpc.bench.hookcost`);
- startuptime.py: time to the first step against the job's size on a Slurm cluster
  (`python -m hpc.bench.startuptime`).
The analysis's own benchmark is analysis/bench.
"""
