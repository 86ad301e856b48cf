"""From a command line to jobs and back (torch-free at module level).

- request.py: a submission command line as one typed value, past its entry module;
- plan.py: what a submission command line asks for, as a pure plan;
- points.py: the sweep's grid and each point's task;
- site.py: a cluster profile's site practices as a job's settings;
- sbatchflags.py: sbatch's options as Slurm users type them: taken with sbatch's meaning, passed on, or
  refused naming the way; sbatch's --time and --export grammars;
- slurm.py: a job's request, its sbatch parameters and script (pure functions, pinned by golden files);
- submit.py: `python -m hpc.submit`;
- job.py: `TaskJob`, what submitit runs in every task of a local run (a Slurm job: hpc/launch/batch.py);
- follow.py: following submitted jobs to one printed result; stopping a local run;
- queue.py: the Slurm queue through squeue and sacct.
"""
