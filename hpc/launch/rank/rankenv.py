"""A rank's task environment, and the runner's rules that read the environment (pure functions over
mappings): torchrun's contract, the run directory, the GPUs in the profile's order, the start-up hook;
whether Slurm signals the task itself. No torch import."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from hpc.core.beat import BEAT_VARIABLE
from hpc.core.ending import RankCommand
from hpc.core.rundir import RunPaths
from hpc.core.summary import ATTEMPT_VARIABLE
from hpc.launch.rank.flightrec import recorder_env
from hpc.placement.affinity import GPU_ORDER
from hpc.placement.distenv import LAUNCHER_VARIABLE, DistEnv
from hpc.settings.rankcommand import PROFILER_VARIABLE, RUN_DIR_VARIABLE, env_for

HOOK_DIR = Path(__file__).resolve().parents[2] / "training" / "hook" / "startup"  # holds sitecustomize.py
# A job's own launcher variables are not the task's: it is no submitit job, whatever runs it.
_DROPPED_PREFIXES = ("SUBMITIT_",)


def on_slurm(env: Mapping[str, str]) -> bool:
    """Inside an srun step, where Slurm signals every process of the step itself."""
    return env.get("SLURM_STEP_ID") not in (None, "") and env.get("SUBMITIT_EXECUTOR") != "local"


def passes_stops_on(env: Mapping[str, str]) -> bool:
    """Whether a stop signal this rank gets is passed on to its task: everywhere but in an srun step,
    where Slurm signals the task itself; there too under torchrun, whose agent signals its workers alone
    (a restart of the group), and a task it never told would outlive them."""
    return not on_slurm(env) or bool(env.get("TORCHELASTIC_RUN_ID"))


def ordered_gpus(env: Mapping[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES in the profile's GPU order (HPC_GPU_ORDER, set for whole nodes), so that a
    rank's `cuda:LOCAL_RANK` is the GPU next to its cores; None where nothing changes."""
    order, visible = env.get(GPU_ORDER, ""), env.get("CUDA_VISIBLE_DEVICES", "")
    if not order or not visible:
        return None
    devices, picks = visible.split(","), order.split(",")
    if not all(p.isdigit() for p in picks) or sorted(int(p) for p in picks) != list(range(len(devices))):
        return None  # fewer visible GPUs than a node (a shared job): nothing to order
    return ",".join(devices[int(p)] for p in picks)


def rank_env(
    dist: DistEnv, run_dir: Path, task: RankCommand, env: Mapping[str, str], attempt: str, hook_dir: Path = HOOK_DIR
) -> dict[str, str]:
    """The whole environment of one rank's process: this one's, less a launcher's own variables, plus
    the task's, torchrun's contract, HPC_RUN_DIR, the attempt, the ordered GPUs, and the profiler's hook."""
    # --local inside an salloc or sbatch shell: the outer job's SLURM_* would make a framework that reads
    # them (Lightning's SLURMEnvironment) see that job's ranks, not this run's
    dropped = _DROPPED_PREFIXES + (("SLURM_",) if env.get("SUBMITIT_EXECUTOR") == "local" else ())
    out = {k: v for k, v in env.items() if not k.startswith(dropped)}
    out.update(env_for(task, run_dir))
    out.update(dist.torch_env())
    out[LAUNCHER_VARIABLE] = dist.launcher
    out[RUN_DIR_VARIABLE] = str(run_dir)
    out[ATTEMPT_VARIABLE] = attempt
    gpus = ordered_gpus(env)
    if gpus is not None:
        out["CUDA_VISIBLE_DEVICES"] = gpus
    out.pop(PROFILER_VARIABLE, None)
    out.pop(BEAT_VARIABLE, None)  # the runner's own task's, set when it starts
    if task.profiler is not None:  # the start-up hook: the profiler where enabled, the watch, the OOM record
        out.update(recorder_env(RunPaths(run_dir), out))  # the environment's own settings win
        out["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH", "")) if p)
        if task.profiler.get("enabled", True):
            out[PROFILER_VARIABLE] = json.dumps(task.profiler, sort_keys=True)
    return out
