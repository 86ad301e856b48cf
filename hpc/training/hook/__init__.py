"""The start-up hook: a user's script profiled and watched with no change to it.

- startup/: the folder the runner puts first on PYTHONPATH; its sitecustomize calls `arm()`;
- scripthooks.py: `arm()`, the hook's instruments armed as torch's modules load;
- afterimport.py: run a function once a module has been imported, wherever from;
- autoprofile.py: torch.profiler stepped by the script's optimizer steps, one trace per rank;
- scriptwatch.py: the task's beat to its runner and a stack dump on request;
- scriptoom.py: an uncaught CUDA out of memory recorded as the rank's outcome;
- scriptaccelerate.py: the user's accelerate config applied as `accelerate launch` would.
"""
