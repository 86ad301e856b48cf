"""One rank of a job, from the launcher's side (torch-free).

- runner.py: the per-rank runner (`run_rank`): starts the rank's task, forwards signals, records its end;
- rankcli.py: `python -m hpc.rank`, the runner as a command (srun in the batch shell, torchrun's workers);
- rankenv.py: the task's environment and the rules that read it (pure functions over mappings);
- rankmeet.py: where one start of a run meets (the port and the run's secret);
- rankrecords.py: a rank's records among the others' (which start, a failed peer, rank 0's wait);
- pump.py: a task's output into the rank's log and on;
- hang.py: a rank that stopped making progress, named from outside the task;
- flightrec.py: NCCL's Flight Recorder for a user's script;
- agent.py: torchrun's agent as a job's step runs it on a node (SIGUSR1 and SIGQUIT not its own).
"""
