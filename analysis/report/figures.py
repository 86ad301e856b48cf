"""The study's figures from a sweep's run records (matplotlib, Agg; PNG files).

- Figures 1-15 of the study (../shared/seeds/003, §4.3-4.5), in its terms: CPU and CUDA time per
  epoch, kernel calls per epoch, maximum CPU and GPU memory, against batch size per GPU, one line per
  GPU count, one figure per data fraction (`figNN_<metric>_fraction<f>.png`);
- beside them, the same per profiled step (`<column>_fraction<f>.png`), which rise with batch size
  where the per-epoch values fall: an epoch has fewer, larger steps;
- the measured epoch wall time (metrics.jsonl), scaling efficiency (measured, and the scaling model's
  prediction dashed), and where a multi-GPU point's step time went against its 1-GPU point (a
  stacked bar per point: `efficiency_loss.png`).
Points that ran out of memory get a red cross labelled OOM. A quantity a run does not have (CUDA time
on a CPU run) is left out, not drawn as 0.
"""

from __future__ import annotations

import io
import statistics
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.explain.metric import chosen, label_of, varying
from analysis.read.metrics import logged_metrics
from analysis.records import RunRow, data_words, ranks_words
from hpc.core.ending import Outcome
from hpc.core.files import write_atomic
from hpc.core.owner import make_dirs

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is drawn (pyplot())
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

XY = tuple[float, float]  # a line's (x, y): a batch size or an axis value's place, and the metric
LineKey = tuple[tuple[int, int], str, str]  # a job shape, a step mode, a series

# The study's figure numbers: (quantity, data fraction) -> Figure N
STUDY_FIGURE = {
    ("cpu", 0.1): 1,
    ("cuda", 0.1): 2,
    ("cpu", 0.5): 3,
    ("cuda", 0.5): 4,
    ("cpu", 1.0): 5,
    ("cuda", 1.0): 6,
    ("calls", 0.1): 7,
    ("calls", 0.5): 8,
    ("calls", 1.0): 9,
    ("cpu_mem", 0.1): 10,
    ("gpu_mem", 0.1): 11,
    ("cpu_mem", 0.5): 12,
    ("gpu_mem", 0.5): 13,
    ("cpu_mem", 1.0): 14,
    ("gpu_mem", 1.0): 15,
}


class Metric:
    """One figure's quantity: how to read it from a run, its title, axis label and scale."""

    def __init__(
        self,
        key: str,
        value: Callable[[RunRow], float | None],
        title: str,
        ylabel: str,
        scale: float,
        study: str | None = None,
    ):
        self.key = key
        self.value = value
        self.title = title
        self.ylabel = ylabel
        self.scale = scale
        self.study = study


STUDY_METRICS = [
    Metric("cpu_runtime", lambda r: r.cpu_time_us_per_epoch.mean, "CPU runtime", "CPU time per epoch (s)", 1e-6, "cpu"),
    Metric(
        "cuda_runtime", lambda r: r.cuda_time_us_per_epoch.mean, "CUDA runtime", "CUDA time per epoch (s)", 1e-6, "cuda"
    ),
    Metric(
        "calls",
        lambda r: r.kernel_calls_per_epoch.mean,
        "Total number of calls",
        "kernel calls per epoch",
        1.0,
        "calls",
    ),
    Metric(
        "cpu_memory",
        lambda r: r.peak_cpu_mem_bytes.max,
        "Maximum CPU memory",
        "peak CPU memory (GiB)",
        1 / 2**30,
        "cpu_mem",
    ),
    Metric(
        "gpu_memory",
        lambda r: r.peak_gpu_mem_bytes.max,
        "Maximum GPU memory",
        "peak GPU memory allocated (GiB)",
        1 / 2**30,
        "gpu_mem",
    ),
]
PER_STEP_METRICS = [
    Metric(
        "cpu_time_us_per_step_mean",
        lambda r: r.cpu_time_us_per_step.mean,
        "CPU time per step",
        "CPU time per step (ms)",
        1e-3,
    ),
    Metric(
        "cuda_time_us_per_step_mean",
        lambda r: r.cuda_time_us_per_step.mean,
        "CUDA time per step",
        "CUDA time per step (ms)",
        1e-3,
    ),
    Metric(
        "kernel_calls_per_step_mean",
        lambda r: r.kernel_calls_per_step.mean,
        "Kernel calls per step",
        "kernel calls per step",
        1.0,
    ),
    Metric("epoch_time", lambda r: r.epoch_time_s, "Measured epoch time", "epoch wall time (s)", 1.0),
]
LOSS_PARTS = [
    ("computation", "tab:blue"),
    ("communication", "tab:red"),
    ("memory", "tab:purple"),
    ("idle", "tab:gray"),
    ("imbalance", "tab:orange"),
]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: Path, bottom: float = 0.0) -> Path:
    """Render to memory, then write whole (a full disk is one error naming the figure, no half PNG);
    `bottom`: the share of the height kept free under the axes (for a note)."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    pyplot().close(fig)
    write_atomic(path, png.getvalue())
    return path


def _shape_label(shape: tuple[int, int], on_cpu: bool = False) -> str:
    nodes, gpus = shape
    return ranks_words(gpus, on_cpu) if nodes == 1 else f"{nodes} nodes x {ranks_words(gpus, on_cpu)}"


def _all_cpu(rows: list[RunRow]) -> bool:
    """A figure of CPU ranks only names them so (a laptop, the test cluster), not GPUs."""
    return bool(rows) and all(r.on_cpu for r in rows)


def _data_title(rows: list[RunRow], fraction: float) -> str:
    """The data the figure's runs trained on: CIFAR-100's fraction, or the synthetic set they used."""
    sources = {r.data_source for r in rows}
    if sources == {"script"}:
        return data_words(fraction, "script", None)
    if sources == {"synthetic"}:
        return data_words(fraction, "synthetic", max((r.train_images or 0) for r in rows) or None)
    return data_words(fraction, "cifar100", None)


def mark_oom(ax: Axes, oom_rows: list[RunRow]) -> None:
    """Points that ran out of memory: a red cross on the top edge at their batch size, labelled OOM."""
    for r in oom_rows:
        x = r.batch_size_per_gpu
        if x is None:  # no batch size to place it at
            continue
        ax.plot([x], [1.0], marker="x", color="red", markersize=9, transform=ax.get_xaxis_transform(), clip_on=False)
        ax.annotate(
            f"OOM ({_shape_label(r.shape)})",
            (x, 1.0),
            xycoords=ax.get_xaxis_transform(),
            textcoords="offset points",
            xytext=(0, -14),
            ha="center",
            fontsize=7,
            color="red",
        )


def _lines_against_batch(
    ax: Axes, lines: dict[str, list[XY]], ylabel: str, title: str, dashed: frozenset[str] = frozenset()
) -> None:
    """One line per label, x = batch size per GPU (log 2); replicas at one x (sweep.replicas) as their mean,
    with a bar from the lowest to the highest."""
    for label, pts in lines.items():
        if pts:
            at: dict[float, list[float]] = {}
            for x, y in pts:
                at.setdefault(x, []).append(y)
            xs = sorted(at)
            ys = [statistics.fmean(at[x]) for x in xs]
            drawn = ax.plot(xs, ys, marker="o", label=label, linestyle="--" if label in dashed else "-")
            if any(len(v) > 1 for v in at.values()):
                low = [y - min(at[x]) for x, y in zip(xs, ys, strict=True)]
                high = [max(at[x]) - y for x, y in zip(xs, ys, strict=True)]
                ax.errorbar(xs, ys, yerr=[low, high], fmt="none", ecolor=drawn[0].get_color(), capsize=3)
    ax.set_xscale("log", base=2)
    xs = sorted({p[0] for pts in lines.values() for p in pts})
    if xs:  # the batch sizes themselves as ticks, not powers of two
        from matplotlib.ticker import NullLocator

        ax.set_xticks(xs, [str(int(x)) if float(x).is_integer() else f"{x:g}" for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 64), fontsize=10)  # a long title wraps rather than leave the figure
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    from_zero(ax, [y for pts in lines.values() for _, y in pts])


NEAR_SAME = 0.05  # values within 5% of their largest are drawn from 0: the axis must not make a gap of them


def from_zero(ax: Axes, ys: list[float]) -> None:
    """A quantity (time, memory, throughput) whose values all lie within NEAR_SAME of their largest is drawn
    on an axis from 0, where matplotlib would fill the figure with a difference of 0.1% (issue 88)."""
    if ys and min(ys) >= 0 and max(ys) > 0 and (max(ys) - min(ys)) <= NEAR_SAME * max(ys):
        ax.set_ylim(bottom=0, top=max(ys) * 1.1)


def step_modes(rows: list[RunRow]) -> list[str]:
    """The step modes (eager, graph) the rows ran in, as the figures name them."""
    return sorted({r.step_mode for r in rows if r.step_mode})


def _modes_title(rows: list[RunRow]) -> str:
    modes = step_modes(rows)
    return f" ({' and '.join(modes)} steps)" if modes else ""


def _line_key(r: RunRow, split_modes: bool) -> LineKey:
    """A figure's line: a job shape, a step mode where the rows ran in both, a series of sweep.axes' values."""
    return (r.shape, r.step_mode or "" if split_modes else "", r.series or "")


def _line_label(key: LineKey, cpu: bool) -> str:
    return ", ".join(part for part in (_shape_label(key[0], cpu), key[1], key[2]) if part)


MEMORY_METRICS = ("cpu_memory", "gpu_memory")


def memory_note(rows: list[RunRow]) -> str | None:
    """On a peak-memory figure whose runs did not record memory by category: how to get it, and its cost
    (measured: README, "Where the peak memory goes"). None when any run did (its own figure is drawn)."""
    if any(r.peak_mem_by_category for r in rows):
        return None
    return (
        "By category (parameters, gradients, optimizer state, activations):\n"
        "--set profiler.memory_categories=true (about 12 s more a profiled cycle)"
    )


def metric_figure(rows: list[RunRow], metric: Metric, fraction: float, out_dir: Path) -> Path | None:
    """The metric against batch size for one data fraction, one line per GPU count, and per step mode
    where the rows ran in both (None: no data)."""
    sel = [r for r in rows if r.data_fraction == fraction and r.batch_size_per_gpu and metric.value(r) is not None]
    if not sel:  # no run of this fraction measured it at a batch size
        return None
    number = STUDY_FIGURE.get((metric.study, fraction)) if metric.study else None
    words = _data_title(sel, fraction)
    title = f"{'Figure ' + str(number) + ': ' if number else ''}{metric.title}, {words}{_modes_title(sel)}"
    fig, ax = pyplot().subplots(figsize=(6, 4))
    split = len(step_modes(sel)) > 1
    lines: dict[str, list[XY]] = {
        _line_label(k, _all_cpu(sel)): [
            (r.batch_size_per_gpu or 0, (metric.value(r) or 0.0) * metric.scale)
            for r in sel
            if _line_key(r, split) == k
        ]
        for k in sorted({_line_key(r, split) for r in sel})
    }
    _lines_against_batch(ax, lines, metric.ylabel, title)
    if _all_cpu(sel):
        ax.set_xlabel("batch size per rank")
    note = memory_note(sel) if metric.key in MEMORY_METRICS else None
    if note:
        fig.text(0.01, 0.005, note, fontsize=6.5, color="dimgray", va="bottom")
    mark_oom(ax, [r for r in rows if r.data_fraction == fraction and r.outcome == Outcome.OOM])
    name = f"fig{number:02d}_{metric.key}" if number else (f"study_{metric.key}" if metric.study else metric.key)
    return save_figure(fig, out_dir / f"{name}_fraction{fraction:g}.png", bottom=0.07 if note else 0.0)


def efficiency_figure(rows: list[RunRow], out_dir: Path) -> Path | None:
    """Measured scaling efficiency against batch size (solid) and the model's prediction (dashed)."""
    sel = [r for r in rows if r.scaling_efficiency is not None and r.batch_size_per_gpu and r.shape[0] * r.shape[1] > 1]
    if not sel:
        return None
    fig, ax = pyplot().subplots(figsize=(6, 4))
    keys = sorted({(r.data_fraction, (r.shape, r.series or "")) for r in sel})
    cpu = _all_cpu(sel)
    lines: dict[str, list[XY]] = {
        f"fraction {f:g}, {_line_label((k[0], '', k[1]), cpu)}": [
            (r.batch_size_per_gpu or 0, r.scaling_efficiency or 0.0)
            for r in sel
            if (r.data_fraction, (r.shape, r.series or "")) == (f, k)
        ]
        for f, k in keys
    }
    predicted: dict[str, list[XY]] = {
        f"model: fraction {f:g}, {_line_label((k[0], '', k[1]), cpu)}": [
            (r.batch_size_per_gpu or 0, r.predicted_efficiency)
            for r in sel
            if (r.data_fraction, (r.shape, r.series or "")) == (f, k) and r.predicted_efficiency is not None
        ]
        for f, k in keys
    }
    ax.axhline(1.0, color="grey", lw=0.8)
    _lines_against_batch(
        ax,
        {**lines, **predicted},
        "scaling efficiency vs 1 GPU",
        f"Scaling efficiency{_modes_title(sel)}",
        dashed=frozenset(predicted),
    )
    return save_figure(fig, out_dir / "scaling_efficiency.png")


def loss_figure(rows: list[RunRow], out_dir: Path) -> Path | None:
    """Per multi-GPU point, a stacked bar of where its step time went against its 1-GPU point (ms)."""
    sel = [r for r in rows if r.loss_us]
    losses = [r.loss_us for r in sel if r.loss_us]
    if not sel:
        return None
    fig, ax = pyplot().subplots(figsize=(max(6, 0.6 * len(sel) + 2), 4))
    labels = [
        f"{r.data_fraction:g}/{r.batch_size_per_gpu}/{r.gpus}" + (f"x{r.nodes}" if (r.nodes or 1) > 1 else "")
        for r in sel
    ]
    up = [0.0] * len(sel)
    down = [0.0] * len(sel)
    for part, color in LOSS_PARTS:
        values = [loss[part] / 1e3 for loss in losses]
        bottoms = [up[i] if v >= 0 else down[i] for i, v in enumerate(values)]
        ax.bar(labels, values, bottom=bottoms, color=color, label=part)
        for i, v in enumerate(values):
            up[i], down[i] = (up[i] + v, down[i]) if v >= 0 else (up[i], down[i] + v)
    ax.plot(labels, [loss["total"] / 1e3 for loss in losses], "k_", markersize=18, label="measured difference")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel("data fraction / batch per GPU / GPUs per node (x nodes)")
    ax.set_ylabel("step time vs 1 GPU (ms)")
    ax.set_title(f"Where the step time went, against the 1-GPU point{_modes_title(sel)}", fontsize=10)
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir / "efficiency_loss.png")


MEMORY_CATEGORIES = [
    ("parameters", "darkgreen"),
    ("gradients", "mediumblue"),
    ("optimizer_state", "goldenrod"),
    ("activations", "red"),
    ("other", "grey"),
]  # torch's memory timeline's colours


def memory_category_figure(rows: list[RunRow], fraction: float, out_dir: Path) -> Path | None:
    """Peak memory stacked by category (torch's memory profiler) against batch size, a bar per GPU count."""
    sel = sorted(
        (r for r in rows if r.peak_mem_by_category and r.data_fraction == fraction),
        key=lambda r: (r.batch_size_per_gpu or 0, r.nodes or 1, r.gpus or 0),
    )
    if not sel:
        return None
    fig, ax = pyplot().subplots(figsize=(max(6, 0.6 * len(sel) + 2), 4))
    labels = [f"{r.batch_size_per_gpu}/{_shape_label((r.nodes or 1, r.gpus or 1), r.on_cpu)}" for r in sel]
    bottom = [0.0] * len(sel)
    for name, color in MEMORY_CATEGORIES:
        values = [(r.peak_mem_by_category or {}).get(name, 0) / 2**30 for r in sel]
        ax.bar(labels, values, bottom=bottom, color=color, label=name.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("batch per GPU / ranks")
    ax.set_ylabel("memory at the peak (GiB)")
    ax.set_title(f"Peak memory by category, {_data_title(sel, fraction)}{_modes_title(sel)}", fontsize=10)
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir / f"peak_memory_by_category_fraction{fraction:g}.png")


def plot_sweep(rows: list[RunRow], out_dir: Path) -> list[Path]:
    """Every figure the rows have data for (see the module doc); the paths written, the script's own metric
    first."""
    make_dirs(out_dir, "--out")
    fractions = sorted({r.data_fraction for r in rows if r.data_fraction is not None})
    written = [curves_figure(rows, out_dir)]
    written += [metric_figure(rows, m, f, out_dir) for m in STUDY_METRICS + PER_STEP_METRICS for f in fractions]
    written += [efficiency_figure(rows, out_dir), loss_figure(rows, out_dir)]
    written += [memory_category_figure(rows, f, out_dir) for f in fractions]
    written += [axis_figure(rows, key, m, out_dir) for key in swept_keys(rows) for m in AXIS_METRICS]
    return [p for p in written if p is not None]


# Against a swept key (sweep.axes): what a point's run measures as a whole.
AXIS_METRICS = [
    Metric("step_time", lambda r: r.step_time_us_mean.max, "Step time (slowest rank)", "step time (ms)", 1e-3),
    Metric("images_per_s", lambda r: r.images_per_s, "Throughput", "images/s", 1.0),
]


def swept_keys(rows: list[RunRow]) -> list[str]:
    """The keys of sweep.axes with more than one value among the rows, but the replica axis (a run's
    `replica`), whose values are repetitions, not a quantity."""
    replica_keys = {r.replica.split("=", 1)[0] for r in rows if r.replica}
    keys = dict.fromkeys(k for r in rows for k in (r.values or {}) if k not in replica_keys)
    return [k for k in keys if len({repr((r.values or {}).get(k)) for r in rows if r.values}) > 1]


def axis_figure(rows: list[RunRow], key: str, metric: Metric, out_dir: Path) -> Path | None:
    """The metric against one swept key's values, a line per job shape, data fraction, batch and the other
    keys' values; replicas at one value as their mean with a min-max bar. Numbers on a number line (log
    where they span 10x or more), other values (an arch, true/false) in their order of appearance."""
    sel = [r for r in rows if key in (r.values or {}) and metric.value(r) is not None]
    if len({repr((r.values or {})[key]) for r in sel}) < 2:
        return None
    raw = list(dict.fromkeys((r.values or {})[key] for r in sel))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
    # from 1: never 0 on a log axis
    position = {v: v if numeric and isinstance(v, (int, float)) else i + 1 for i, v in enumerate(raw)}
    cpu = _all_cpu(sel)
    lines: dict[str, list[XY]] = {}
    for r in sel:
        others = ", ".join(f"{k}={v}" for k, v in (r.values or {}).items() if k != key and f"{k}={v}" != r.replica)
        label = ", ".join(
            p
            for p in (
                _shape_label(r.shape, cpu),
                f"fraction {r.data_fraction:g}",
                f"batch {r.batch_size_per_gpu}",
                others,
            )
            if p
        )
        lines.setdefault(label, []).append((position[(r.values or {})[key]], (metric.value(r) or 0.0) * metric.scale))
    fig, ax = pyplot().subplots(figsize=(6, 4))
    _lines_against_batch(ax, lines, metric.ylabel, f"{metric.title} against {key}")
    ax.set_xlabel(key)
    numbers = sorted(v for v in raw if isinstance(v, (int, float)))  # every value, where numeric
    if numeric:
        from matplotlib.ticker import NullLocator

        positive = all(v > 0 for v in numbers)
        ax.set_xscale("log" if positive and max(numbers) >= 10 * min(numbers) else "linear")
        ax.set_xticks(numbers, [f"{v:g}" for v in numbers])
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        ax.set_xscale("linear")
        ax.set_xticks(range(1, len(raw) + 1), [str(v) for v in raw])
    safe = "".join(c if c.isalnum() else "_" for c in key)
    return save_figure(fig, out_dir / f"by_{safe}_{metric.key}.png")


def curves_figure(rows: list[RunRow], out_dir: Path) -> Path | None:
    """The script's own metric (analysis/explain/metric.py's choice) over its steps, a line a point: the mean
    of its replicas at the steps they all logged, with a band from the lowest to the highest. None where no
    run logged it."""
    choice = chosen(rows)
    if choice is None:
        return None
    fields = varying(rows)
    curves: dict[str, list[dict[int, float]]] = {}
    for r in rows:
        series = logged_metrics(Path(r.run_dir)).get(choice.name) if r.metrics and choice.name in r.metrics else None
        if series is not None:
            curves.setdefault(label_of(r, fields), []).append(dict(zip(series.steps, series.values, strict=True)))
    if not curves:
        return None
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for label, replicas in curves.items():
        steps = sorted(set.intersection(*(set(c) for c in replicas)))
        if not steps:
            continue
        at = [[c[s] for c in replicas] for s in steps]
        drawn = ax.plot(steps, [statistics.fmean(v) for v in at], label=label)
        if len(replicas) > 1:
            ax.fill_between(steps, [min(v) for v in at], [max(v) for v in at], color=drawn[0].get_color(), alpha=0.2)
    scripts = sorted({r.arch for r in rows if r.arch})
    of = f", {', '.join(scripts)}" if len(scripts) == 1 else ""
    band = " (mean over the replicas, band: lowest to highest)" if any(len(c) > 1 for c in curves.values()) else ""
    ax.set_title(textwrap.fill(f"{choice.name} over steps{of}{band}", 64), fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(choice.name)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    safe = "".join(c if c.isalnum() else "_" for c in choice.name)
    return save_figure(fig, out_dir / f"metric_{safe}.png")
