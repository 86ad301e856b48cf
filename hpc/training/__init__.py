"""The torch half: one rank's training run and what it is made of.

command.py is `python -m hpc.train` (flags, the run directory's policy, stop signals, OOM as an
outcome); trainer.py the Trainer and its loop; setup.py the device, process group and optimizer;
parts.py the trainer's small parts (state, timer, divergence guard, stop signal); metrics.py the
throughput and metrics bookkeeping; summary.py summary.json's per-rank record; checkpoint.py,
profiling.py, oom.py, cudagraph.py, data.py, model.py; bench.py and benchsteps.py the benchmark.
"""
