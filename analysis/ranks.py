"""Comparing a run's ranks step by step: how far apart their step times are (skew), and which rank the
others wait for at collectives (the straggler). Each rank is timed from its own step starts, so node
clocks need not agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from analysis.records import TraceRecord


def _by_rank_and_step(
    records: list[TraceRecord], values: Callable[[TraceRecord], list[Any] | None]
) -> dict[Any, dict[int, Any]]:
    """{rank: {ProfilerStep number: value}} from each trace's per-step lists."""
    out: dict[Any, dict[int, Any]] = {}
    for rec in records:
        out.setdefault(rec.rank, {}).update(zip(rec.step_numbers, values(rec) or [], strict=False))
    return out


def step_skew_us(records: list[TraceRecord]) -> float | None:
    """Mean over the profiled steps all ranks have of (slowest rank's step time - fastest rank's)."""
    by_rank = _by_rank_and_step(records, lambda r: r.step_time_us)
    if len(by_rank) < 2:
        return None
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    skews = [max(s[n] for s in by_rank.values()) - min(s[n] for s in by_rank.values()) for n in common]
    return sum(skews) / len(skews) if skews else None


def straggler(records: list[TraceRecord]) -> tuple[Any, float | None]:
    """The rank that launches a collective last most often (each rank's launch time measured from its
    own step start), and the share of collectives it was last at."""
    by_rank = _by_rank_and_step(records, lambda r: r.collective_launch_us)
    if len(by_rank) < 2:
        return None, None
    last: Counter[Any] = Counter()
    for n in set.intersection(*(set(steps) for steps in by_rank.values())):
        launches = {rank: steps[n] for rank, steps in by_rank.items()}
        for j in range(min(len(v) for v in launches.values())):
            last[max(launches, key=lambda rank: launches[rank][j])] += 1
    if not last:
        return None, None
    rank, count = last.most_common(1)[0]
    return rank, count / sum(last.values())
