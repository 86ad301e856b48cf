"""Records as text: CSV, Markdown, aligned tables and JSON (`render`), and the tables that say why a
run does not scale (`why_tables`: per-rank breakdown, collectives, top kernels and operators, and
each sweep point's efficiency loss)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from analysis.explain.metric import best_line, chosen, metric_rows, missing_line, varying
from analysis.explain.replicas import noise_lines, replica_rows
from analysis.read.metrics import Choice
from analysis.records import RunRow, TraceRecord, as_row, ranks_words
from analysis.report.units import Formatter, human_columns, number
from hpc.core.ending import Outcome, PointState

TRACE_COLUMNS = [
    "file",
    "rank",
    "steps",
    "cpu_time_us",
    "cuda_time_us",
    "gpu_busy_us",
    "kernel_calls",
    "peak_gpu_mem_bytes",
    "peak_gpu_reserved_bytes",
    "peak_cpu_mem_bytes",
    "comm_time_us",
    "comm_overlap_pct",
]
TRAINING_FACTS = ("arch", "step_mode", "graph_check")  # the toolkit's training's: a script's run has none
RUN_COLUMNS = [
    "arch",
    "data_fraction",
    "batch_size_per_gpu",
    "gpus",
    "nodes",
    "step_mode",
    "graph_check",
    "outcome",
    "ranks",
    "step_time_us_mean_max",
    "rank_imbalance",
    "cpu_time_us_per_step_mean",
    "cuda_time_us_per_step_mean",
    "kernel_calls_per_step_mean",
    "peak_cpu_mem_bytes_max",
    "peak_gpu_mem_bytes_max",
    "images_per_s",
    "speedup",
    "scaling_efficiency",
    "epoch_time_s",
    "cpu_time_us_per_epoch_mean",
    "cuda_time_us_per_epoch_mean",
    "kernel_calls_per_epoch_mean",
    "step_skew_us",
    "straggler_rank",
    "idle_share_mean",
    "predicted_efficiency",
    "qos",
    "node_hours",
]


def rows_to_csv(records: list, columns: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in map(as_row, records):
        writer.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    return buf.getvalue()


def human_cells(records: list, columns: list[str]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of cells) in human units (analysis/report/units.py): what tables and report.html show."""
    rows = [as_row(r) for r in records]
    shown = human_columns(rows, columns)
    return [h for h, _ in shown], [
        [_cell(r.get(c), c, f) for c, (_, f) in zip(columns, shown, strict=True)] for r in rows
    ]


def rows_to_markdown(records: list, columns: list[str]) -> str:
    headers, cells = human_cells(records, columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def rows_to_table(records: list, columns: list[str]) -> str:
    headers, rows = human_cells(records, columns)
    cells = [headers, *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    left = [c in ("name", "kind", "class", "error", "verdict") for c in columns]  # words read better left-aligned
    aligned = (
        "  ".join(cell.ljust(w) if lj else cell.rjust(w) for cell, w, lj in zip(row, widths, left, strict=True))
        for row in cells
    )
    return "\n".join(line.rstrip() for line in aligned) + "\n"


def _cell(value: Any, column: str, fmt: Formatter = number) -> str:
    if column == "file":
        return Path(str(value)).name
    if column == "name":  # kernel and operator names: C++ signatures can run to hundreds of characters
        text = str(value)
        return text if len(text) <= 90 else text[:87] + "..."
    return fmt(value)


def to_json(records: list) -> str:
    return json.dumps([as_row(r) for r in records], indent=2) + "\n"


def json_document(traces: list, runs: list, sweep_rows: list | None) -> str:
    """`--format json`: the level the table shows for the path first (a sweep's points, a folder's runs, a
    run's record: each with its verdict, memory by category and the rest), the per-trace records under
    `traces`; `level` says which: sweep, runs, run or trace (a trace file: its record, with its verdict)."""
    if sweep_rows is not None:
        doc: dict[str, Any] = {"level": "sweep", "points": [as_row(r) for r in sweep_rows]}
    elif len(runs) > 1:
        doc = {"level": "runs", "runs": [as_row(r) for r in runs]}
    elif runs:
        doc = {"level": "run", "run": as_row(runs[0])}
    else:
        doc = {"level": "trace"}
    doc["traces"] = [as_row(t) for t in traces]
    return json.dumps(doc, indent=2) + "\n"


def render(records: list, columns: list[str], fmt: str) -> str:
    """Records (or plain rows) in a format: json (every field), csv, md or table (the columns)."""
    if fmt == "json":
        return to_json(records)
    if fmt == "csv":
        return rows_to_csv(records, columns)
    if fmt == "md":
        return rows_to_markdown(records, columns)
    return rows_to_table(records, columns)


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def breakdown_rows(traces: list[TraceRecord]) -> list[dict]:
    """Per trace: where the device time of the profiled window went (ms), and why the GPU was idle."""
    rows = []
    for t in traces:
        tb, ib = t.temporal_breakdown_us, t.idle_breakdown_us
        if not tb or not ib:
            continue
        rows.append(
            {
                "file": t.file,
                "rank": t.rank,
                "span_ms": _ms(tb["span_us"]),
                "computation_ms": _ms(tb["computation_us"]),
                "communication_ms": _ms(tb["communication_us"]),
                "memory_ms": _ms(tb["memory_us"]),
                "idle_ms": _ms(tb["idle_us"]),
                "idle_pct": 100 * tb["idle_us"] / tb["span_us"] if tb["span_us"] else None,
                "host_wait_ms": _ms(ib["host_wait_us"]),
                "kernel_wait_ms": _ms(ib["kernel_wait_us"]),
                "other_wait_ms": _ms(ib["other_us"]),
            }
        )
    return rows


BREAKDOWN_COLUMNS = [
    "file",
    "rank",
    "span_ms",
    "computation_ms",
    "communication_ms",
    "memory_ms",
    "idle_ms",
    "idle_pct",
    "host_wait_ms",
    "kernel_wait_ms",
    "other_wait_ms",
]
COLLECTIVE_COLUMNS = [
    "rank",
    "kind",
    "calls",
    "time_us",
    "mean_us",
    "bytes_per_call",
    "group_size",
    "algbw_GBps",
    "busbw_GBps",
    "overlap_pct",
]


def run_columns(runs: list[RunRow]) -> list[str]:
    """RUN_COLUMNS, and the values of the sweep's other axes (sweep.axes) after the study's where a run has any.
    Your own scripts' runs leave out a data fraction and a batch size that never changed: the script may
    never have received them (a command without {fraction} or {batch}), and the toolkit's own facts (its
    model, how its steps ran) where no run has them."""
    columns = RUN_COLUMNS
    if runs and all(r.data_source == "script" for r in runs):
        fixed = {"data_fraction", "batch_size_per_gpu"} - set(varying(runs))
        fixed |= {c for c in TRAINING_FACTS if all(getattr(r, c) is None for r in runs)}
        columns = [c for c in columns if c not in fixed]
    if not any(r.swept for r in runs):
        return columns
    at = columns.index("nodes") + 1
    return [*columns[:at], "swept", *columns[at:]]


KERNEL_COLUMNS = ["calls", "total_us", "share_pct", "class", "name"]
OP_COLUMNS = ["calls", "self_cpu_us", "self_device_us", "name"]
LOSS_COLUMNS = [
    "data_fraction",
    "batch_size_per_gpu",
    "gpus",
    "nodes",
    "total_ms",
    "computation_ms",
    "communication_ms",
    "memory_ms",
    "idle_ms",
    "imbalance_ms",
    "scaling_efficiency",
    "predicted_efficiency",
]


def loss_rows(runs: list[RunRow]) -> list[dict]:
    """Each multi-GPU point's step-time difference to its 1-GPU point, in parts that add up (ms)."""
    return [
        {
            "data_fraction": r.data_fraction,
            "batch_size_per_gpu": r.batch_size_per_gpu,
            "gpus": r.gpus,
            "nodes": r.nodes,
            **{f"{k}_ms": v / 1e3 for k, v in r.loss_us.items()},
            "scaling_efficiency": r.scaling_efficiency,
            "predicted_efficiency": r.predicted_efficiency,
        }
        for r in runs
        if r.loss_us
    ]


def _first_of_each_rank(traces: list[TraceRecord]) -> list[TraceRecord]:
    seen, out = set(), []
    for t in sorted(traces, key=lambda t: (t.rank is None, t.rank or 0, t.file)):
        if t.rank not in seen:
            seen.add(t.rank)
            out.append(t)
    return out


def run_tables(traces: list[TraceRecord]) -> list[tuple[str, list[dict], list[str]]]:
    """(title, rows, columns) of one run's tables: the device-time breakdown per trace, the collectives
    per rank, the lowest rank's top kernels and operators (one trace per rank). The text output and
    report.html both show these."""
    parts = []
    breakdown = breakdown_rows(traces)
    if breakdown:
        parts.append(("Device time of the profiled window, per trace", breakdown, BREAKDOWN_COLUMNS))
    ranks = _first_of_each_rank(traces)
    collectives = [{"rank": t.rank, **c} for t in ranks for c in t.collectives or []]
    if collectives:
        parts.append(("Collectives", collectives, COLLECTIVE_COLUMNS))
    if ranks and ranks[0].top_kernels:
        parts.append((f"Top kernels, rank {ranks[0].rank}", ranks[0].top_kernels, KERNEL_COLUMNS))
    if ranks and ranks[0].top_ops:
        parts.append((f"Top operators, rank {ranks[0].rank}", ranks[0].top_ops, OP_COLUMNS))
    return parts


def mode_words(run: RunRow) -> str:
    """ ", eager steps" or ", graph steps" where the run's summary says how its steps ran, else ""."""
    check = f" (graph check {run.graph_check})" if run.graph_check and run.graph_check != "passed" else ""
    return f", {run.step_mode} steps{check}" if run.step_mode else ""


def run_label(run: RunRow) -> str:
    """The run as the verdicts name it, with its step mode (eager or graph) where the summary says."""
    mode = mode_words(run)
    if run.data_fraction is None:
        return (Path(run.run_dir).name or run.run_dir) + mode
    nodes = f" x {run.nodes} nodes" if (run.nodes or 1) > 1 else ""
    ranks = ranks_words(run.gpus, run.on_cpu)
    swept = f", {run.swept}" if run.swept else ""
    return f"fraction {run.data_fraction:g}, batch {run.batch_size_per_gpu}{swept}, {ranks}{nodes}{mode}"


def verdict_lines(traces: list[TraceRecord], runs: list[RunRow]) -> list[tuple[str, str]]:
    """(what, the verdict in words) for each run (over its ranks) and, for a multi-GPU sweep point, why it
    falls short of linear; for traces analysed alone, each trace's."""
    out: list[tuple[str, str]] = []
    several = len(runs) > 1 and all(run.job_id is None for run in runs)  # a folder of runs, not a sweep
    for run in runs:
        label = run_label(run)
        name = Path(run.run_dir).name
        label = f"{name}: {label}" if several and not label.startswith(name) else label
        gpus = [(f"{label}, GPUs", run.gpu_line)] if run.gpu_line else []
        if run.outcome == Outcome.OOM:
            out += [(label, "out of memory: no timings to judge"), *gpus]
            continue
        if run.verdict:
            # no summary.json: a crashed (or still running) run, or traces copied without it
            partial = " (no summary: judged from the traces alone)" if run.outcome == PointState.UNFINISHED else ""
            out.append((label + partial, run.verdict.line))
        if run.separate_copies:
            out.append((f"{label}, ranks", f"{run.separate_copies}; no imbalance is judged"))
        if run.scaling_note:
            out.append((f"{label}, scaling", run.scaling_note))
        out += gpus
    if not runs:
        out += [(Path(t.file).name, t.verdict.line) for t in traces if t.verdict]
    return out


def why_tables(traces: list[TraceRecord], runs: list[RunRow], fmt: str) -> str:
    """What bounds each run, in words, then the tables that say where the time went: for one run, its
    run_tables; for a sweep, each point's efficiency loss."""
    if len(runs) > 1:
        parts = (
            [("Efficiency loss against the 1-GPU point (ms per step)", loss_rows(runs), LOSS_COLUMNS)]
            if loss_rows(runs)
            else []
        )
        replicas = replica_rows(runs)
        if replicas:
            parts.append((REPLICAS_TITLE, replicas, REPLICA_COLUMNS))
    else:
        parts = run_tables(traces)
    heading = "## {}\n\n" if fmt == "md" else "\n{}:\n"
    verdicts = verdict_lines(traces, runs)
    said = heading.format("Verdict") + "".join(
        (f"- **{what}**: {text}\n" if fmt == "md" else f"  {what}: {text}\n") for what, text in verdicts
    )
    noise = noise_lines(runs) if len(runs) > 1 else []
    judged = heading.format(NOISE_TITLE) + "".join((f"- {line}\n" if fmt == "md" else f"  {line}\n") for line in noise)
    return (
        (said if verdicts else "")
        + "".join(heading.format(title) + render(rows, columns, fmt) for title, rows, columns in parts)
        + (judged if noise else "")
    )


METRIC_COLUMNS = ["point", "replicas", "final", "final_sd", "best", "best_sd", "last_step"]


def metric_section(runs: list[RunRow], fmt: str) -> str:
    """The script's own metric first (analysis/explain/metric.py): which one and why, each point's final and
    best values over its replicas, and the best point against the noise; one line where none was logged."""
    heading = "## {}\n\n" if fmt == "md" else "\n{}:\n"
    line = "{}\n\n" if fmt == "md" else "  {}\n"
    choice = chosen(runs)
    missing = missing_line(runs, choice)
    if choice is None:
        return heading.format("The script's own metric") + line.format(missing)
    best = best_line(runs, choice)
    return (
        heading.format(f"{choice.name}, by point")
        + line.format(f"metric: {choice.why}")
        + render(metric_table(runs, choice), METRIC_COLUMNS, fmt)
        + ("\n" if fmt == "md" else "")
        + "".join(line.format(text) for text in (best, missing) if text)
    )


def metric_table(runs: list[RunRow], choice: Choice) -> list[dict[str, Any]]:
    """The metric's rows with its values to 4 significant digits: a loss of 0.2113 is not 0.21, nor an
    accuracy of 0.9987 1.0."""
    return [{k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()} for row in metric_rows(runs, choice)]


REPLICAS_TITLE = "Replicas (sweep.replicas): each point's mean and standard deviation over them"
REPLICA_COLUMNS = [
    "point",
    "series",
    "replicas",
    "images_per_s_mean",
    "images_per_s_sd",
    "step_time_ms_mean",
    "step_time_ms_sd",
]
NOISE_TITLE = "Beyond the run-to-run noise?"
