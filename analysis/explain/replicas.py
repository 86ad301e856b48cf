"""Whether a difference between sweep points is beyond the run-to-run noise: the replicas of a point (the values
of sweep.replicas, a seed) folded into a mean and a spread, and each pair of points that differ in one
series (lr=0.1 against lr=0.01, at the same data fraction, batch and ranks) judged against that spread.

The rule, said in the report: a difference is beyond the noise when the two points' replicas do not overlap
(every replica of one is above every replica of the other) and each point has at least MIN_REPLICAS of them;
within it when they overlap. Of two sets of 3 replicas drawn alike, one lies wholly above the other 1 time in
10 (2 of the C(6, 3) = 20 orders): fewer replicas than 3 cannot say it at all. No statistics library: the
rule is one comparison, and a test of significance would claim more than 3 runs hold. No torch import.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from analysis.records import RunRow

MIN_REPLICAS = 3  # fewer cannot tell noise from a difference (see the module doc)
NOISE_RULE = (
    f"Beyond the noise: the two points' replicas do not overlap, with at least {MIN_REPLICAS} each (of two sets "
    "of 3 drawn alike, one lies wholly above the other 1 time in 10); within it: they overlap."
)


@dataclasses.dataclass(frozen=True)
class Measure:
    """A number each replica has, as the table and the sentences name it."""

    key: str
    words: str
    value: Callable[[RunRow], float | None]
    digits: int


MEASURES = (
    Measure("images_per_s", "images/s", lambda r: r.images_per_s, 0),
    Measure(
        "step_time_ms",
        "step time (ms)",
        lambda r: r.step_time_us_mean.max / 1e3 if r.step_time_us_mean.max is not None else None,
        2,
    ),
)


def point_words(r: RunRow) -> str:
    """The study point a row is at: its data fraction, batch and ranks."""
    nodes = f" x {r.nodes} nodes" if (r.nodes or 1) > 1 else ""
    return f"fraction {r.data_fraction:g}, batch {r.batch_size_per_gpu}, {r.gpus} rank(s){nodes}"


def groups(rows: list[RunRow]) -> dict[tuple[str, str], list[RunRow]]:
    """The replicas of each point, by (study point, series): only rows of a sweep with a replica axis."""
    out: dict[tuple[str, str], list[RunRow]] = {}
    for r in rows:
        if r.replica is not None:
            out.setdefault((point_words(r), r.series or ""), []).append(r)
    return out


def spread(values: list[float]) -> dict[str, float | None]:
    """Mean and standard deviation (None for one value)."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None}


def replica_rows(rows: list[RunRow]) -> list[dict[str, Any]]:
    """One row per point with replicas: how many, and each measure's mean and spread over them."""
    table = []
    for (point, series), members in sorted(groups(rows).items()):
        row: dict[str, Any] = {"point": point, "series": series or "-", "replicas": len(members)}
        for m in MEASURES:
            values = [v for v in map(m.value, members) if v is not None]
            if values:
                s = spread(values)
                row.update({f"{m.key}_mean": s["mean"], f"{m.key}_sd": s["sd"]})
        table.append(row)
    return table


def judge(a: list[float], b: list[float]) -> str:
    """beyond, within, or too few: the rule of the module doc on two points' replicas of one measure."""
    if min(a) <= max(b) and min(b) <= max(a):
        return "within"
    return "beyond" if min(len(a), len(b)) >= MIN_REPLICAS else "too few"


def noise_lines(rows: list[RunRow]) -> list[str]:
    """For each pair of series at the same study point: each measure's means and spreads, and whether the
    difference is beyond the run-to-run noise, in one sentence."""
    by_point: dict[str, dict[str, list[RunRow]]] = {}
    for (point, series), members in groups(rows).items():
        by_point.setdefault(point, {})[series] = members
    lines = []
    for point, at_point in sorted(by_point.items()):
        names = sorted(at_point)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                lines.extend(pair_lines(point, a, at_point[a], b, at_point[b]))
    return lines


def pair_lines(point: str, a: str, ra: list[RunRow], b: str, rb: list[RunRow]) -> list[str]:
    out = []
    for m in MEASURES:
        va = [v for v in map(m.value, ra) if v is not None]
        vb = [v for v in map(m.value, rb) if v is not None]
        if not va or not vb:
            continue
        verdict = judge(va, vb)
        said = {
            "beyond": "beyond the run-to-run noise (their replicas do not overlap)",
            "within": "within the run-to-run noise (their replicas overlap)",
            "too few": f"not to be told from noise: fewer than {MIN_REPLICAS} replicas a point",
        }[verdict]
        out.append(
            f"{point}: {a} against {b}: {m.words} {_spread_words(va, m.digits)} against "
            f"{_spread_words(vb, m.digits)}: {said}"
        )
    return out


def _spread_words(values: list[float], digits: int) -> str:
    s = spread(values)
    sd = f" +- {s['sd']:.{digits}f}" if s["sd"] is not None else ""
    return f"{s['mean']:.{digits}f}{sd} ({len(values)} replicas)"
