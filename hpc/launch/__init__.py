"""The launcher: everything around a job's processes, and nothing of torch at module level.

One road for every task (the toolkit's training is the command `python -m hpc.train`, a user's script
another). Its rooms:

- submission/: from a command line to jobs and back on a login node: the plan, the Slurm side, the
  submit command, the job submitit runs in every task of a local run, and following the jobs to one
  printed result;
- rank/: inside a job, one rank: the per-rank runner (`python -m hpc.rank`), its environment, meeting,
  records, output pump, hang watch and NCCL flight recorder;
- batch.py: every Slurm job's batch shell, one road: the hand-written sbatch scripts' (`python -m
  hpc.batch`) and hpc.submit's (`BatchJob`, through submitit), its one srun step, and `rank_words`, how a
  task starts on every road (a Slurm step, an allocation's, a local run's);
- requeue.py: the batch shell's signals told apart, the one requeue rule and its one executor;
- study.py: `python -m hpc.study run|status|resubmit|cancel`; status.py: each point of a sweep and how it stands;
- jobcmd.py: `python -m hpc.job log|status|cancel`: one run followed, queried, cancelled;
- configcli.py: `python -m hpc.config`.
The torch half (hpc/training) runs only as a task's process.
"""
