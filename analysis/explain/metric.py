"""Which point trains better, by the script's own metric (issue 88): the metric is chosen once for the sweep
(sweep.metric and sweep.mode where set, else the first evaluation's loss or accuracy found); each point's
final and best value are folded over its replicas (sweep.replicas, a seed) into a mean and a spread; the best
point, by its mean final value, is named with its margin over the second best, set against the spread between
replicas of one point.

The rule, said with the line: the margin is beyond the noise when it is larger than the largest difference
between two replicas of either point (their range). With one replica a point there is no measure of the
noise, and the line says so. No torch import.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from analysis.explain.replicas import spread
from analysis.read.metrics import Choice, choose
from analysis.records import RunRow

METRIC_RULE = (
    "Beyond the noise: the best point's margin over the second is larger than the largest difference between "
    "two replicas (seeds) of either point; within it: not larger."
)


@dataclasses.dataclass(frozen=True)
class PointMetric:
    """A point's metric over its replicas: its final and best values' mean, standard deviation and range."""

    label: str
    finals: tuple[float, ...]
    bests: tuple[float, ...]
    last_step: int

    @property
    def final(self) -> float:
        return statistics.fmean(self.finals)

    @property
    def noise(self) -> float | None:
        """The largest difference between two replicas' final values (None: one replica)."""
        return max(self.finals) - min(self.finals) if len(self.finals) > 1 else None


def chosen(rows: list[RunRow]) -> Choice | None:
    """The metric the sweep is judged by: its setting where a row carries it, else the first found."""
    wanted = next((r.metric_wanted for r in rows if r.metric_wanted), None)
    mode = next((r.metric_mode for r in rows if r.metric_mode), None)
    return choose((name for r in rows for name in (r.metrics or {})), wanted, mode)


def varying(rows: list[RunRow]) -> list[str]:
    """The study's fields that differ between the rows: only those name a point (a script that never sees
    a batch size has one, the default's, at every point)."""
    fields = ("data_fraction", "batch_size_per_gpu", "gpus", "nodes")
    return [f for f in fields if len({getattr(r, f) for r in rows}) > 1]


# The study's fields as a point's label and the HParams view name them
STUDY_WORDS = {"data_fraction": "fraction", "batch_size_per_gpu": "batch", "gpus": "ranks", "nodes": "nodes"}


def label_of(r: RunRow, fields: list[str]) -> str:
    parts = [r.series if r.replica is not None else r.swept] + [f"{STUDY_WORDS[f]} {getattr(r, f)}" for f in fields]
    return ", ".join(p for p in parts if p) or "the run"


def point_metrics(rows: list[RunRow], choice: Choice) -> list[PointMetric]:
    """Every point that logged the metric, its replicas folded, in the order of the rows."""
    fields = varying(rows)
    grouped: dict[str, list[RunRow]] = {}
    for r in rows:
        if r.metrics and choice.name in r.metrics:
            grouped.setdefault(label_of(r, fields), []).append(r)
    out = []
    for label, members in grouped.items():
        said = [m.metrics[choice.name] for m in members if m.metrics]
        out.append(
            PointMetric(
                label,
                tuple(s.final for s in said),
                tuple(s.best(choice.mode) for s in said),
                max(s.last_step for s in said),
            )
        )
    return out


def metric_rows(rows: list[RunRow], choice: Choice) -> list[dict[str, Any]]:
    """The table: each point's replicas, final and best values (mean, and standard deviation over replicas)."""
    table = []
    for p in point_metrics(rows, choice):
        final, best = spread(list(p.finals)), spread(list(p.bests))
        table.append(
            {
                "point": p.label,
                "replicas": len(p.finals),
                "final": final["mean"],
                "final_sd": final["sd"],
                "best": best["mean"],
                "best_sd": best["sd"],
                "last_step": p.last_step,
            }
        )
    return table


def best_line(rows: list[RunRow], choice: Choice) -> str | None:
    """The best point by its mean final value, its margin over the second best, and whether that margin is
    beyond the spread between replicas (METRIC_RULE); None with fewer than two points."""
    points = sorted(point_metrics(rows, choice), key=lambda p: p.final, reverse=choice.mode == "max")
    if len(points) < 2:
        return None
    best, second = points[0], points[1]
    margin = abs(best.final - second.final)
    noises = [n for n in (best.noise, second.noise) if n is not None]
    if len(noises) < 2:
        judged = "one replica a point: the noise is not measured (sweep.replicas names a seed axis)"
    elif margin > max(noises):
        judged = f"beyond the noise: replicas of one point differ by up to {max(noises):.4g}"
    else:
        judged = f"within the noise: replicas of one point differ by up to {max(noises):.4g}"
    return (
        f"best {choice.name}: {best.label}, {best.final:.4g} ({_replicas(best)}); {margin:.4g} "
        f"{'lower' if choice.mode == 'min' else 'higher'} than the second, {second.label} ({second.final:.4g}): "
        f"{judged}"
    )


def _replicas(p: PointMetric) -> str:
    return f"final, mean of {len(p.finals)} replicas" if len(p.finals) > 1 else "final"


def missing_line(rows: list[RunRow], choice: Choice | None) -> str | None:
    """One line where no run logged a metric, or the one asked for; None where every point has it."""
    wanted = next((r.metric_wanted for r in rows if r.metric_wanted), None)
    if choice is None and wanted:
        return f"no run logged {wanted} (sweep.metric); found: {_names(rows) or 'none'}"
    if choice is None:
        found = f"; found none that says loss or accuracy: {_names(rows)}" if _names(rows) else ""
        return (
            "no run logged a metric the report can read (TensorBoard, metrics.csv, trainer_state.json, JSONL or CSV "
            f"under its run directory){found}"
        )
    without = [r for r in rows if not (r.metrics and choice.name in r.metrics)]
    return f"{len(without)} of {len(rows)} point(s) logged no {choice.name}" if without else None


def _names(rows: list[RunRow]) -> str:
    return ", ".join(list(dict.fromkeys(n for r in rows for n in (r.metrics or {})))[:8])
