"""Where a rank sits: the GPU it takes and the cores it may run on. Pure functions over the environment
(HPC_GPU_ORDER, which a cluster profile's `gpu_order` sets for whole-node jobs: hpc/launch/submission/site.py) and
the CPU set the OS reports; the training half calls them, and records what they say. No torch import.

On Perlmutter Slurm binds local rank i to the cores next to GPU 3-i (`--cpu-bind=cores`), so the
profile's order 3,2,1,0 gives each rank the GPU on its own side of the node, as NERSC's tutorials do
by reversing CUDA_VISIBLE_DEVICES. A job of fewer GPUs (the shared QOS) sees only its own GPUs: there
the order does not apply and rank i takes visible GPU i.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from hpc.core.errors import DistEnvError

GPU_ORDER = "HPC_GPU_ORDER"
THREADS = "OMP_NUM_THREADS"  # torch's intra-op threads (and OpenMP's), read once at its first parallel op


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity: taskset's, a cgroup's), else all the machine's."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return set(range(os.cpu_count() or 1))


def threads_per_rank(cpus: int, local_ranks: int) -> int:
    """Each of `local_ranks` ranks sharing `cpus` CPUs gets an equal share of threads, at least one: one rank
    uses the whole machine, as torch alone would; several never oversubscribe it."""
    return max(1, cpus // max(local_ranks, 1))


def gpu_index(env: Mapping[str, str], local_rank: int, device_count: int) -> int:
    """The visible GPU local rank `local_rank` takes: HPC_GPU_ORDER's entry when it names every visible
    GPU once, else local_rank modulo the count."""
    text = env.get(GPU_ORDER, "").strip()
    if not text or device_count < 1:
        return local_rank % max(device_count, 1)
    try:
        order = [int(part) for part in text.split(",")]
    except ValueError:
        raise DistEnvError(f"{GPU_ORDER}={text!r}: expected GPU numbers such as 3,2,1,0") from None
    if sorted(order) != list(range(device_count)):  # a partial node, or a machine of another size
        return local_rank % device_count
    return order[local_rank % device_count]


def cores_text(cpus: Iterable[int]) -> str:
    """CPU numbers as ranges: {0,1,2,3,8} -> '0-3,8'."""
    ordered = sorted(set(cpus))
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
