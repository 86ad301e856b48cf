"""One run's own figures (matplotlib, Agg; PNG files), where a sweep's figures would each be one dot:

- each rank's own work per step over the steps (summary.json's own_step_series: the work before the
  gradients' all-reduce, hpc/training/steptimes.py), where a straggler shows as the line above the others
  (`step_time_by_rank.png`); beyond MAX_LINES ranks, the slowest and the fastest of them;
- where the profiled window's device time went on each rank (computation, communication, memory, idle:
  the trace's temporal breakdown), a stacked bar per rank (`window_breakdown.png`; none on CPU ranks);
- the top operators by their own host time and the top kernels by device time, of the lowest rank
  (`top_operators.png`, `top_kernels.png`);
- its peak memory by category where it recorded them (figures.py's, one bar).
A figure the run has no data for is left out.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from analysis.records import RunRow, TraceRecord
from analysis.report.figures import LOSS_PARTS, memory_category_figure, pyplot, save_figure
from analysis.runs.ranks import own_series
from hpc.core.owner import make_dirs
from hpc.core.rundir import RunPaths
from hpc.core.summary import RankEntry, RunRecord, read_summary

MAX_LINES = 8  # ranks drawn one line each; beyond, the slowest MAX_LINES - 1 and the fastest
TOP = 10  # operators and kernels a bar chart names


def plot_run(run: RunRow, traces: list[TraceRecord], out_dir: Path) -> list[Path]:
    """Every figure of one run its files have data for; the paths written."""
    make_dirs(out_dir, "--out")
    summary = read_summary(RunPaths(Path(run.run_dir)).summary) or RunRecord()
    lowest = min(traces, key=lambda t: (t.rank is None, t.rank or 0, t.file), default=None)
    ops, kernels = (lowest.top_ops, lowest.top_kernels or []) if lowest else ([], [])
    written = [
        step_time_figure(summary.ranks, out_dir),
        breakdown_figure(traces, out_dir),
        top_figure(ops, "self_cpu_us", "Top operators by own host time", lowest, out_dir),
        top_figure(kernels, "total_us", "Top kernels by device time", lowest, out_dir),
        memory_category_figure([run], run.data_fraction, out_dir) if run.data_fraction is not None else None,
    ]
    return [p for p in written if p is not None]


def drawn_ranks(series: dict[int, dict[int, float]]) -> list[int]:
    """The ranks drawn one line each: all up to MAX_LINES, else the slowest (by median) and the fastest."""
    if len(series) <= MAX_LINES:
        return sorted(series)
    by_median = sorted(series, key=lambda r: statistics.median(series[r].values()))
    return sorted({*by_median[-(MAX_LINES - 1) :], by_median[0]})


def step_time_figure(ranks: list[RankEntry], out_dir: Path) -> Path | None:
    """Each rank's own work per step over the steps (ms)."""
    series = {r.rank: s for r in ranks if (s := own_series(r))}
    if not series:
        return None
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for rank in drawn_ranks(series):
        steps = sorted(series[rank])
        ax.plot(steps, [series[rank][s] * 1e3 for s in steps], marker=".", label=f"rank {rank}")
    shown = f" ({len(drawn_ranks(series))} of {len(series)} ranks: the slowest and the fastest)"
    ax.set_title("Each rank's own work per step" + (shown if len(series) > MAX_LINES else ""), fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("own work before the all-reduce (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir / "step_time_by_rank.png")


def breakdown_figure(traces: list[TraceRecord], out_dir: Path) -> Path | None:
    """The profiled window's device time on each rank, by part (ms), a stacked bar per trace."""
    rows = [t for t in traces if t.temporal_breakdown_us and t.temporal_breakdown_us.get("span_us")]
    if not rows:
        return None
    rows.sort(key=lambda t: (t.rank is None, t.rank or 0, t.file))
    fig, ax = pyplot().subplots(figsize=(6, 4))
    labels = [f"rank {t.rank}" if t.rank is not None else Path(t.file).name[:12] for t in rows]
    bottom = [0.0] * len(rows)
    for part, color in LOSS_PARTS:
        values = [(t.temporal_breakdown_us or {}).get(f"{part}_us", 0.0) / 1e3 for t in rows]
        if any(values):
            ax.bar(labels, values, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("Where the profiled window's device time went", fontsize=10)
    ax.set_ylabel("time in the window (ms)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, out_dir / "window_breakdown.png")


def top_figure(rows: list[dict], key: str, title: str, trace: TraceRecord | None, out_dir: Path) -> Path | None:
    """The TOP rows by `key` (µs), as horizontal bars (ms), the largest on top."""
    rows = sorted((r for r in rows if isinstance(r.get(key), (int, float)) and r[key] > 0), key=lambda r: -r[key])
    if not rows or trace is None:
        return None
    rows = rows[:TOP]
    fig, ax = pyplot().subplots(figsize=(6, 4))
    names = [short(str(r.get("name"))) for r in rows][::-1]
    ax.barh(names, [r[key] / 1e3 for r in rows][::-1], color="tab:blue")
    ax.set_title(f"{title}, rank {trace.rank if trace.rank is not None else 0} (profiled window)", fontsize=10)
    ax.set_xlabel("ms in the window")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    name = "top_operators.png" if key == "self_cpu_us" else "top_kernels.png"
    return save_figure(fig, out_dir / name)


def short(name: str, width: int = 40) -> str:
    """A kernel's or operator's name cut to fit beside its bar (CUDA kernels' names run to hundreds of
    characters)."""
    return name if len(name) <= width else name[: width - 3] + "..."
