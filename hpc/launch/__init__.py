"""The launcher half: everything before a process trains, and nothing of torch at module level.

Config (schema.py, config.py, flags.py), where a process sits in a job (distenv.py, hostlist.py,
torchrun.py), what a command line asks for (plan.py) and its Slurm side (slurm.py), the job every task
runs (job.py), the queue (queue.py), and the commands that submit (submit.py), run the study
(study.py) and report on it (status.py). The torch half is hpc/training/; the job imports it only
when it runs.
"""
