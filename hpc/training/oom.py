"""CUDA out of memory as a result of a run, not a crash.

A sweep point whose batch does not fit (batch 2048 of ResNet152 on a 40 GB A100 may not) ends with
exit code 4 and a `summary.json` whose `outcome` is "oom", holding the batch, the allocation that
failed, the device's memory and the peak reached; the analysis shows such points as OOM and the sweep
goes on. With `profiler.memory_snapshot: true` the allocator's history is recorded from the start and
dumped at the OOM as `memory_snapshot.rank{R}.pickle`, for https://pytorch.org/memory_viz.

Fault injection, for testing without a GPU (grammar: hpc/core/faults.py; hpc/training/inject.py):
HPC_FAULT_INJECT=oom-at-step:N raises the same OutOfMemoryError before optimizer step N (counted from
1), on every rank, as a real OOM would at a batch shape that fits nowhere.
"""

from __future__ import annotations

import os
import re

import torch

from hpc.core.errors import EXIT_OOM
from hpc.core.rundir import RunPaths
from hpc.core.summary import OomRecord, RankFacts, attempt_of, write_facts, write_run_summary
from hpc.settings.schema import RunConfig

SNAPSHOT_MAX_ENTRIES = 100_000  # allocator events kept; the tail before the OOM is what matters
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def requested_bytes(message: str) -> int | None:
    """The failed allocation from the allocator's message ("Tried to allocate 2.00 GiB."), if named."""
    m = re.search(r"Tried to allocate ([0-9.]+) ?(B|KiB|MiB|GiB|TiB)", message)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def start_memory_history(enabled: bool, cuda: bool) -> None:
    """Record the allocator's history (profiler.memory_snapshot) so an OOM can be replayed in memory_viz."""
    if enabled and cuda:
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)


def device_memory(cuda: bool, fraction: float | None) -> dict[str, int | None]:
    """What the device had: total, free now, this process's limit (train.cuda_memory_fraction of the
    total, else the total) and the allocator's peak so far."""

    if not (cuda and torch.cuda.is_available()):
        return {
            "device_total_bytes": None,
            "device_free_bytes": None,
            "limit_bytes": None,
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
        }
    free, total = torch.cuda.mem_get_info()
    return {
        "device_total_bytes": int(total),
        "device_free_bytes": int(free),
        "limit_bytes": int(total * fraction) if fraction is not None else int(total),
        # peaks since the last profiler window opened (hpc.profiling resets them there)
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def oom_record(
    error: BaseException,
    paths: RunPaths,
    rank: int,
    per_gpu: int | None,
    world: int,
    cuda: bool,
    fraction: float | None,
    snapshot: bool,
    step: int | None,
) -> OomRecord:
    """The record of an OOM, the one recorder of the toolkit's training and a script's start-up hook
    (hpc/training/hook/scriptoom.py): the allocator's first line, the allocation it names, the device's
    memory, the batch where known, the step it came in, and with `snapshot` (profiler.memory_snapshot) on a
    GPU the allocator's history dumped beside the run (RUN/memory_snapshot.rank{R}.pickle)."""
    text = str(error).strip()
    message = text.splitlines()[0] if text else type(error).__name__
    snapshot_name = None
    if snapshot and cuda:
        path = paths.memory_snapshot(rank)
        torch.cuda.memory._dump_snapshot(str(path))
        snapshot_name = path.name
    return OomRecord(
        rank=rank,
        message=message[:500],
        batch_size_per_gpu=per_gpu,
        global_batch_size=per_gpu * world if per_gpu else None,
        requested_bytes=requested_bytes(message),
        memory_fraction=fraction,
        **device_memory(cuda, fraction),
        step=step,
        snapshot=snapshot_name,
    )


def record_oom(
    error: BaseException, cfg: RunConfig, paths: RunPaths, rank: int, world: int, cuda: bool, step: int | None
) -> OomRecord:
    """The training's OOM: its record (oom_record) in this rank's facts, then summary.json (outcome "oom")."""
    tc = cfg.train
    per_gpu = tc.batch_size if tc.batch_scope == "per_gpu" else tc.batch_size // max(world, 1)
    snapshot = cfg.profiler.memory_snapshot
    oom = oom_record(error, paths, rank, per_gpu, world, cuda, tc.cuda_memory_fraction, snapshot, step)
    # Every rank may hit it at once: each records its own, and summary.json names rank 0's (or the lowest's).
    facts = RankFacts(
        rank=rank,
        world_size=world,
        attempt=attempt_of(os.environ),
        exit_code=EXIT_OOM,
        complete=False,
        oom=oom,
        config=cfg.to_dict(),
    )
    write_facts(paths, facts)
    write_run_summary(paths)
    return oom


def describe(oom: OomRecord) -> str:
    """One line for stderr."""

    def gib(n: float | None) -> str:
        return "?" if n is None else f"{n / 2**30:.2f} GiB"

    limit = "" if oom.memory_fraction is None else f" (train.cuda_memory_fraction {oom.memory_fraction:g})"
    return (
        f"CUDA out of memory at batch {oom.batch_size_per_gpu} per GPU on rank {oom.rank}: "
        f"asked {gib(oom.requested_bytes)} with {gib(oom.peak_allocated_bytes)} allocated at the peak, "
        f"limit {gib(oom.limit_bytes)}{limit} of {gib(oom.device_total_bytes)}"
        + (f"; snapshot {oom.snapshot}" if oom.snapshot else "")
    )
