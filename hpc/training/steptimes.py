"""A rank's step times, one definition for the toolkit's training (hpc/training/steps.py's StepTimer) and a
user's script (the start-up hook, hpc/training/hook/autoprofile.py): their statistics, the steps a rank's
own work is judged on, and the last steps' own work kept one by one, so that the analysis can compare
ranks step by step (analysis/runs/ranks.py: a straggler is a rank slower in most steps, not in a mean).
Torch-free.
"""

from __future__ import annotations

import math
from typing import Any

from hpc.core.proc import process_started_unix

# The last steps whose own work each rank keeps one by one (summary.json's own_step_series): enough to see
# one rank slower in most of them (analysis/runs/ranks.py), few enough for a thousand ranks' summary.
SERIES_STEPS = 128
# The measurement keys of every rank's record in summary.json, the toolkit's training's and a script's
# alike (hpc/training/summary.py adds what only the training knows: images a second).
RANK_MEASURES = (
    "step_time_s",
    "own_step_time_s",
    "own_step_series",
    "startup",
    "step_time_after_profiler_s",
    "wall_time_s",
    "cuda_max_memory_allocated_bytes",
    "cuda_max_memory_reserved_bytes",
    "peak_rss_bytes",
)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def step_time_stats(timed: list[float]) -> dict[str, Any]:
    mean = sum(timed) / len(timed) if timed else None
    return {
        "n": len(timed),
        "mean": mean,
        "median": percentile(timed, 0.5),
        "p90": percentile(timed, 0.9),
        "min": min(timed) if timed else None,
        "max": max(timed) if timed else None,
    }


def own_work_basis(own: list[float | None], profiled: list[bool]) -> list[float]:
    """The steps a rank's own work is judged on: measured, the first (which warms caches) left out, and the
    profiler's steps left out where others remain (recording slows a CPU rank's operators unevenly)."""
    steps = list(zip(own, [*profiled[: len(own)], *[False] * (len(own) - len(profiled))], strict=True))
    steps = steps[1:] if len(steps) > 2 else steps
    plain = [t for t, p in steps if t is not None and not p]
    return plain or [t for t, _ in steps if t is not None]


def own_work_series(
    own: list[float | None], profiled: list[bool], queued: list[float | None] | None = None
) -> dict[str, Any] | None:
    """The last SERIES_STEPS steps' own work in ms, each step in its place (null: not measured, the first
    step, or a profiled one), and the number of the first: ranks are compared step by step by it.
    `queued`: the time the rank's main thread waited for a core in the same spans (hpc/core/proc.py's
    queued_s), kept beside (`queued_ms`): a rank slower because other processes share its cores is not a
    slower rank."""
    if not own:
        return None
    first = max(0, len(own) - SERIES_STEPS)
    flags = [*profiled[: len(own)], *[False] * (len(own) - len(profiled))]

    def kept(values: list[float | None]) -> list[float | None]:
        return [
            round(t * 1e3, 3) if t is not None and not flags[i] and i > 0 and math.isfinite(t) else None
            for i, t in enumerate(values[first : len(own)], start=first)
        ]

    series: dict[str, Any] = {"first_step": first, "ms": kept(own)}
    if queued is not None and len(queued) == len(own):
        series["queued_ms"] = kept(queued)
    return series


def startup_record(join_began: float | None, join_ended: float | None, first_step_unix: float | None) -> dict[str, Any]:
    """Where this rank's start-up went, in Unix seconds and spans: the process started, the process group
    began to form and was formed (every rank in), the first optimizer step ended. Compared with the job's
    start (Slurm's StartTime) they give its time to the first step (docs/scale.md)."""
    started = process_started_unix()
    return {
        "process_start_unix": started,
        "group_join_start_unix": join_began,
        "group_join_s": join_ended - join_began if join_ended is not None and join_began is not None else None,
        "first_step_end_unix": first_step_unix,
        "to_first_step_s": first_step_unix - started if first_step_unix and started else None,
    }
