"""Which ranks record a profiler trace (`profiler.ranks`): every rank of a small job, a bounded subset of a
large one. Pure functions of the setting, the job's shape and each rank's step timing; no torch import.

    all       every rank
    auto      every rank up to ALL_RANKS_UP_TO ranks; beyond, each node's first rank (local rank 0) plus
              the SLOWEST ranks by their own work per step (the part of a step before its gradient sync,
              which no other rank holds up: hpc/training/steptimes.py's StepClock), gathered from every rank
              once, before the profiler's first window, over the steps after the first (the window opens
              late enough for two: hpc/training/profiling.py's Choice)
    leaders   each node's first rank
    R,R,...   these ranks (a rank the job does not have is an error)

Why 16: a profiled cycle writes one trace per rank, and TensorBoard's plugin and the analysis read each
one whole. ResNet152 eager writes ~10 MB of JSON per recorded step per rank (results/gpu/resnet152_rank0:
19.5 MB for 2 steps on an H100), so the default 3 active steps make ~29 MB a rank. Up to 16 ranks (4
Perlmutter nodes, past the study's largest point) that is under 0.5 GB a cycle and every rank is seen; at
1024 ranks it would be 30 GB a cycle, most of it saying the same thing. Beyond 16, one trace per node still
shows every node's network and host, and the slowest ranks show what holds the others back.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from hpc.core.cli import NUMBER_LIST
from hpc.core.errors import UsageError

SETTINGS = ("all", "auto", "leaders")
ALL_RANKS_UP_TO = 16
SLOWEST = 2


def is_setting(value: str) -> bool:
    """Whether `value` (spaces aside) is a profiler.ranks setting: one of SETTINGS or a list of ranks."""
    text = value.replace(" ", "")
    return text in SETTINGS or NUMBER_LIST.fullmatch(text) is not None


def check_setting(value: str, source: str = "profiler.ranks") -> tuple[int, ...] | None:
    """The explicit ranks of a `R,R,...` setting, None for a named one; UsageError for anything else."""
    if not is_setting(value):
        raise UsageError(
            f"{source}={value!r}: must be {', '.join(SETTINGS)} or a comma-separated list of ranks (e.g. 0,13)"
        )
    text = value.replace(" ", "")
    return None if text in SETTINGS else tuple(sorted({int(w) for w in text.split(",")}))


def static_choice(value: str, rank: int, world_size: int) -> bool | None:
    """Whether `rank` records traces, when that follows from the setting and the job's size alone; None for
    leaders (its local rank decides) and for auto over ALL_RANKS_UP_TO ranks (every rank's step timing
    decides: `chosen`)."""
    explicit = check_setting(value)
    if explicit is not None:
        if explicit[-1] >= world_size:
            raise UsageError(f"profiler.ranks={value!r}: rank {explicit[-1]} not in a job of {world_size} rank(s)")
        return rank in explicit
    if value == "all" or (value == "auto" and world_size <= ALL_RANKS_UP_TO):
        return True
    return None


def chosen(local_ranks: Sequence[int], own_work_s: Sequence[float | None], leaders_only: bool = False) -> list[int]:
    """The ranks that record (auto over ALL_RANKS_UP_TO, or leaders): each node's first rank (local rank 0)
    and, unless `leaders_only`, the SLOWEST by own work per step. Index = rank in both lists."""
    leaders = [r for r, local in enumerate(local_ranks) if local == 0]
    return sorted(set(leaders) | (set() if leaders_only else set(slowest(own_work_s))))


def slowest(own_work_s: Sequence[float | None], count: int = SLOWEST) -> list[int]:
    """The `count` ranks with the most own work per step (index = rank; None or NaN: not measured, never
    chosen), slowest first; ties go to the lower rank."""
    measured = [(s, r) for r, s in enumerate(own_work_s) if s is not None and not math.isnan(s)]
    return [r for _, r in sorted(measured, key=lambda sr: (-sr[0], sr[1]))[:count]]


def typical(values: Sequence[float | None]) -> float | None:
    """The median of the measured values (None: none measured)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None
