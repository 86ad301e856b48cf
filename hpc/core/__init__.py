"""The leaf core: what both halves of the toolkit and the analysis share, importing nothing else of the
project.

- errors.py: `HpcError` and its kinds, the exit codes;
- cli.py: the one error path of every command (`run`), the parser, the checks made before any work;
- meet.py: where one start of a run meets (its port and secret, published for its ranks alone);
- owner.py: what a command makes is its owner's (the umask, HPC_GROUP, directories checked, new files);
- files.py: atomic writes, JSON and strict YAML;
- rundir.py: the run and sweep directories, every file's name and its reader and writer;
- ending.py: how a rank and a run ended, the one vocabulary and rule, and the typed records carrying them
  (task.json's RankCommand among them);
- summary.py: summary.json, made of the ranks' exit records and facts by its one writer, a run's exit
  code by its one decider (`run_exit_code`, for a job and for a command), and a run's state from its
  files alone (`run_state`); lock.py: the run directory's one writer;
- stop.py: the stop signals (SIGTERM, SIGUSR2, SIGINT), caught before torch is imported;
- proc.py: what /proc says of a process (its state, children, CPU and disk work);
- logs.py: logging's set-up;
- faults.py: HPC_FAULT_INJECT's grammar;
- gpusample.py: each node's GPUs sampled by NVML during a run; beat.py: a script's beat to its runner.
"""
