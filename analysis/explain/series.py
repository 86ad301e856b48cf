"""The report's explanations, from the comparison of runs (analysis/runs/diff.py): for each data fraction and
batch size, the step from 1 to 2 to 4 GPUs explained by its largest term; and two sweeps of the same
grid (eager and graphed, say) compared point by point. Each run stands for itself by rank 0's traces
(the only rank every run has). No torch import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from analysis.records import TraceRecord
from analysis.runs.diff import Profile, explain, profile


def _key(t: TraceRecord) -> tuple[Any, ...] | None:
    p = t.point
    if t.rank not in (0, None) or p is None:
        return None
    return p.data_fraction, p.batch_size, p.gpus, p.swept or ""  # sweep.axes' values


def by_point(traces: list[TraceRecord]) -> dict[tuple[Any, ...], Profile]:
    """Rank 0's traces of each sweep point (fraction, batch, GPUs), folded per step."""
    groups: dict[tuple[Any, ...], list[TraceRecord]] = {}
    for t in traces:
        key = _key(t)
        if key is not None:
            groups.setdefault(key, []).append(t)
    return {k: profile(f"{k[2]} GPU{'s' if k[2] != 1 else ''}", v) for k, v in groups.items()}


def gpu_series(traces: list[TraceRecord]) -> list[tuple[str, str]]:
    """(series, sentence) for each step up in GPU count within one data fraction and batch size."""
    points = by_point(traces)
    lines = []
    for fraction, batch, swept in sorted({(f, b, s) for f, b, _, s in points}, key=lambda k: (-(k[0] or 0), *k[1:])):
        counts = sorted(g for f, b, g, s in points if (f, b, s) == (fraction, batch, swept))
        values = f", {swept}" if swept else ""
        for lo, hi in zip(counts, counts[1:], strict=False):
            why = explain(points[(fraction, batch, lo, swept)], points[(fraction, batch, hi, swept)])
            lines.append((f"fraction {fraction:g}, batch {batch}{values}: {lo} -> {hi} GPUs", why.sentence))
    return lines


def sweeps_side_by_side(a: list[TraceRecord], b: list[TraceRecord], label_a: str, label_b: str) -> list[dict]:
    """One row per point both sweeps have: each one's step time and the sentence that explains them."""
    pa, pb = by_point(a), by_point(b)
    rows = []
    for key in sorted(set(pa) & set(pb), key=lambda k: (-(k[0] or 0), k[1] or 0, k[2] or 0, k[3])):
        left, right = pa[key], pb[key]
        why = explain(dataclasses.replace(left, label=label_a), dataclasses.replace(right, label=label_b))
        rows.append(
            {
                "name": f"fraction {key[0]:g}, batch {key[1]}, {key[2]} GPU(s)" + (f", {key[3]}" if key[3] else ""),
                "step_time_us_a": left.step_time_us,
                "step_time_us_b": right.step_time_us,
                "largest_term": why.term,
                "why": why.sentence,
            }
        )
    return rows
