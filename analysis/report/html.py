"""report.html: one self-contained page (figures embedded as data URIs, no script, no network) with
the study's figures, the sweep table, the efficiency loss, and for each run its per-rank breakdown,
collectives, top kernels and operators, and links to its traces for TensorBoard and Perfetto."""

from __future__ import annotations

import base64
import collections
import datetime as dt
import html
import os
from pathlib import Path

from analysis.explain.metric import METRIC_RULE, best_line, chosen, missing_line
from analysis.explain.replicas import NOISE_RULE, noise_lines, replica_rows
from analysis.explain.series import gpu_series
from analysis.records import RunRow, TraceRecord, as_row, ranks_words
from analysis.report.tables import (
    LOSS_COLUMNS,
    METRIC_COLUMNS,
    NOISE_TITLE,
    REPLICA_COLUMNS,
    REPLICAS_TITLE,
    human_cells,
    loss_rows,
    metric_table,
    mode_words,
    run_columns,
    run_tables,
    verdict_lines,
)
from hpc.core.ending import Outcome

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; max-width: 9em; vertical-align: bottom; }
td.text, th.text { text-align: left; } tr.oom td { color: #b00; }
.figures { display: flex; flex-wrap: wrap; gap: 8px; } .figures img { width: 480px; border: 1px solid #eee; }
details { margin: 0.5em 0; } summary { cursor: pointer; font-weight: 600; } code { background: #f6f6f6; }
"""


TEXT_COLUMNS = ("file", "name", "kind", "class", "arch", "outcome", "largest_term", "why", "swept", "what")  # left

# A column's name in words on the page (its unit follows, from analysis/report/units.py); the CSV and JSON keep
# the names the code uses. A column not named here has its underscores as spaces.
WORDS = {
    "arch": "model",
    "batch_size_per_gpu": "batch per GPU",
    "gpus": "GPUs a node",
    "swept": "swept values",
    "step_mode": "steps",
    "ranks": "ranks traced",
    "step_time_us_mean_max": "step time, slowest rank",
    "rank_imbalance": "slowest / fastest rank",
    "cpu_time_us_per_step_mean": "CPU time a step",
    "cuda_time_us_per_step_mean": "GPU time a step",
    "kernel_calls_per_step_mean": "kernel calls a step",
    "peak_cpu_mem_bytes_max": "peak CPU memory",
    "peak_gpu_mem_bytes_max": "peak GPU memory",
    "images_per_s": "images a second",
    "speedup": "speed-up",
    "epoch_time_s": "epoch time",
    "cpu_time_us_per_epoch_mean": "CPU time an epoch",
    "cuda_time_us_per_epoch_mean": "GPU time an epoch",
    "kernel_calls_per_epoch_mean": "kernel calls an epoch",
    "step_skew_us": "collective launch skew",
    "idle_share_mean": "GPU idle",
    "qos": "QOS",
    "node_hours": "node-hours",
    "self_cpu_us": "own host time",
    "self_device_us": "own device time",
    "total_us": "device time",
    "share_pct": "share",
}
# The runs of a sweep on the page: what fits beside each other at 1400 px (runs.csv and sweep.csv have all).
PAGE_RUN_COLUMNS = [
    "arch",
    "data_fraction",
    "batch_size_per_gpu",
    "gpus",
    "nodes",
    "swept",
    "step_mode",
    "outcome",
    "step_time_us_mean_max",
    "rank_imbalance",
    "images_per_s",
    "speedup",
    "scaling_efficiency",
    "predicted_efficiency",
    "peak_gpu_mem_bytes_max",
    "peak_cpu_mem_bytes_max",
    "node_hours",
]


def header_words(column: str, header: str) -> str:
    """A column's header in words, with the unit the human header carries ("step_time_mean_max (ms)")."""
    unit = header[header.rfind(" (") :] if header.endswith(")") else ""
    return WORDS[column] + unit if column in WORDS else header.replace("_", " ")


def runs_table(runs: list[RunRow]) -> str:
    """The runs on the page: one run as a list of what and its value; several, a row each of the columns
    that fit (PAGE_RUN_COLUMNS, and the swept values where the sweep has any)."""
    if len(runs) == 1:
        headers, (cells,) = human_cells(runs, run_columns(runs))
        pairs = [
            {"what": header_words(c, h), "value": v}
            for c, h, v in zip(run_columns(runs), headers, cells, strict=True)
            if v != "-"
        ]
        return table(pairs, ["what", "value"])
    return table(runs, [c for c in PAGE_RUN_COLUMNS if c in run_columns(runs)])


def table(records: list, columns: list[str]) -> str:
    """A table in human units (the unit in each header; the raw numbers are in the JSON and CSV files)."""
    headers, rows = human_cells(records, columns)
    head = "".join(
        f"<th{' class=text' if c in TEXT_COLUMNS else ''}>{html.escape(header_words(c, h))}</th>"
        for c, h in zip(columns, headers, strict=True)
    )
    body = []
    for r, shown in zip(map(as_row, records), rows, strict=True):
        cls = ' class="oom"' if r.get("outcome") == Outcome.OOM else ""
        cells = "".join(
            f"<td{' class=text' if c in TEXT_COLUMNS else ''}>{html.escape(cell)}</td>"
            for c, cell in zip(columns, shown, strict=True)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def verdict_section(traces: list[TraceRecord], runs: list[RunRow]) -> str:
    """What bounds each run (and why a multi-GPU point falls short of linear), first on the page; a sentence
    every point says, once (the text's Verdict keeps a line a point: what each run's reader greps)."""
    lines = said_once(verdict_lines(traces, runs), len(runs))
    items = "".join(f"<li><b>{html.escape(what)}</b>: {html.escape(text)}</li>" for what, text in lines)
    return f'<h2 id="verdict">Verdict</h2><ul class="verdict">{items}</ul>' if items else ""


def said_once(lines: list[tuple[str, str]], runs: int) -> list[tuple[str, str]]:
    """A sentence each of several runs says (a CPU run has no GPU to judge) as one line for every point,
    where it first stood (issue 88: eight lines of one sentence); a sentence some say stays each one's."""
    counts = collections.Counter(text for _, text in lines)
    out, said = [], set()
    for what, text in lines:
        if runs > 1 and counts[text] == runs:
            if text not in said:
                out.append((f"every point ({runs})", text))
                said.add(text)
        else:
            out.append((what, text))
    return out


def figure_tags(paths: list[Path]) -> str:
    tags = []
    for p in paths:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        tags.append(
            f'<img alt="{html.escape(p.stem)}" title="{html.escape(p.name)}" src="data:image/png;base64,{data}">'
        )
    return f'<div class="figures">{"".join(tags)}</div>'


def run_section(run: RunRow | None, traces: list[TraceRecord], report_dir: Path) -> str:
    """One run: where its time went, its collectives and top kernels and operators, links to its traces."""
    run_dir = Path(run.run_dir) if run else Path(traces[0].file).parent
    traces_dir = run_dir / "traces" if (run_dir / "traces").is_dir() else run_dir
    title = (
        f"fraction {run.data_fraction:g}, batch {run.batch_size_per_gpu} per rank, {ranks_words(run.gpus, run.on_cpu)}"
        + mode_words(run)
        + f": {run.outcome}"
        if run and run.data_fraction is not None
        else str(run_dir)
    )
    parts = [
        f"<details><summary>{html.escape(title)}</summary>",
        f'<p>traces: <a href="{html.escape(os.path.relpath(traces_dir, report_dir))}">'
        f"{html.escape(str(traces_dir))}</a> &mdash; TensorBoard: <code>python -m analysis.tensorboard "
        f"{html.escape(str(run_dir))}</code>; Perfetto: open a trace file at https://ui.perfetto.dev</p>",
    ]
    parts += [
        f"<h3>{html.escape(heading)}</h3>" + table(rows, columns) for heading, rows, columns in run_tables(traces)
    ]
    return "".join(parts) + "</details>"


def render_report(
    path: Path,
    source: Path,
    traces: list[TraceRecord],
    runs: list[RunRow],
    figures: list[Path],
    extra: list[str] | None = None,
) -> str:
    """The page's text (the caller writes it atomically to `path`); `extra`: sections of HTML placed
    before the figures (a second sweep compared with this one)."""
    extra = extra or []
    report_dir = path.parent
    by_run: dict[str, list[TraceRecord]] = {}
    for t in traces:
        run_dir = Path(t.file).parent.parent if Path(t.file).parent.name == "traces" else Path(t.file).parent
        by_run.setdefault(str(run_dir), []).append(t)
    sections = [
        f"<h1>{html.escape(str(source))}</h1><p>python -m analysis, "
        f"{dt.datetime.now().astimezone().isoformat(timespec='seconds')}: {len(runs)} run(s), "
        f"{len(traces)} trace(s)</p>"
    ]
    if len(runs) > 1 and chosen(runs) is not None:  # a sweep: the script's own metric leads (issue 88)
        sections.append(metric_html(runs))
    sections.append(verdict_section(traces, runs))
    if runs:
        sections.append(("<h2>The run</h2>" if len(runs) == 1 else "<h2>Runs</h2>") + runs_table(runs))
    if loss_rows(runs):
        sections.append(
            "<h2>Where the step time went, against the 1-GPU point (ms per step)</h2>"
            + table(loss_rows(runs), LOSS_COLUMNS)
        )
    replicas = replica_rows(runs)
    if replicas:
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in noise_lines(runs))
        sections.append(
            f"<h2>{html.escape(REPLICAS_TITLE)}</h2>"
            + table(replicas, REPLICA_COLUMNS)
            + (f"<h3>{html.escape(NOISE_TITLE)}</h3><p>{html.escape(NOISE_RULE)}</p><ul>{lines}</ul>" if lines else "")
        )
    series = gpu_series(traces)
    if series:
        items = "".join(f"<li><b>{html.escape(what)}</b>: {html.escape(why)}</li>" for what, why in series)
        sections.append(
            "<h2>Why the step changes with the GPU count</h2><p>Each step up in GPUs against the one before it "
            "(rank 0's traces; <code>python -m analysis compare</code> gives every figure):</p>"
            f"<ul>{items}</ul>"
        )
    sections += extra
    if figures:
        sections.append("<h2>Figures</h2>" + figure_tags(figures))
    sections.append("<h2>Each run</h2>")
    for run in runs:
        sections.append(run_section(run, by_run.get(run.run_dir, []), report_dir))
    if not runs:
        sections.append(run_section(None, traces, report_dir))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(source.name)}: analysis</title>"
        f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>\n"
    )


def metric_html(runs: list[RunRow]) -> str:
    """The script's own metric: which one and why, each point's final and best values over its replicas, the
    best point against the noise (analysis/explain/metric.py); one line where none was logged."""
    choice = chosen(runs)
    missing = missing_line(runs, choice)
    if choice is None:
        return f"<h2>The script's own metric</h2><p>{html.escape(missing or '')}</p>"
    lines = [f"metric: {choice.why}", best_line(runs, choice), missing]
    said = "".join(f"<p>{html.escape(line)}</p>" for line in lines if line)
    return (
        f"<h2>{html.escape(choice.name)}, by point</h2>"
        + table(metric_table(runs, choice), METRIC_COLUMNS)
        + said
        + f"<p><small>{html.escape(METRIC_RULE)}</small></p>"
    )


SWEEPS_COLUMNS = ["name", "step_time_us_a", "step_time_us_b", "largest_term", "why"]


def sweeps_section(rows: list[dict], label_a: str, label_b: str) -> str:
    """Two sweeps of one grid, point by point (analysis/explain/series.py)."""
    if not rows:
        return f"<h2>{html.escape(label_a)} against {html.escape(label_b)}</h2><p>No point is in both sweeps.</p>"
    return f"<h2>{html.escape(label_a)} (a) against {html.escape(label_b)} (b), point by point</h2>" + table(
        rows, SWEEPS_COLUMNS
    )
