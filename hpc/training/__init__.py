"""The torch half: one rank's training run and what it is made of. Its rooms:

- traincli.py: `python -m hpc.train` (flags, the run directory's policy, stop signals, OOM as an outcome);
- trainer.py: the `Trainer`, one class: set-up, resume, the loop of epochs and steps, the end;
- build.py: what a run is built from (the step plan, the device, the process group, data, model, optimizer);
- steps.py: a step's bookkeeping (where the run is, the step timer, the divergence guard) and evaluation;
- metrics.py: what a run reports as it goes; summary.py: a training rank's record for summary.json;
- steptimes.py: a rank's step times and own work, one definition for the training and a user's script;
- checkpoint.py: when to save, the atomic save with its checksum, the checked load; claim.py: taking a
  run directory and reading where it left off;
- profiling.py: torch.profiler around the loop; memcat.py: peak memory by category; oom.py: CUDA out of
  memory as a result;
- data.py: CIFAR-100 (`python -m hpc.data`); model.py: torchvision ResNets and a tiny CNN;
- inject.py: the one point where HPC_FAULT_INJECT acts in a training process (armed once; unarmed, nothing);
- distributed/: how the ranks meet and stay one (the run's sealed store, the group, NCCL's network);
- graph/: the step as a replayed CUDA graph (whether, how, and the check that it can be trusted);
- hook/: the start-up hook's instruments in a user's unmodified script (its startup folder goes on PYTHONPATH).
"""
