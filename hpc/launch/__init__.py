"""The launcher: everything around a job's processes, and nothing of torch at module level.

One road for every task (the toolkit's training is the command `python -m hpc.train`, a user's script
another): a command line becomes a plan (plan.py, with points.py: the grid and each point's task; the
Slurm side in site.py and slurm.py), printed or submitted (submit.py: each task a `TaskJob`, job.py),
each rank run by the per-rank runner (runner.py; `python -m hpc.rank`: rankcli.py; the sbatch scripts'
batch shell: batch.py), requeued by one rule (requeue.py) and followed to one printed result
(follow.py, queue.py). The study (study.py, status.py) is a plan of many points. The torch half
(hpc/training) runs only as a task's process.
"""
