"""The stages run in order, each result judged: read (a run's trace files found) -> measure (each trace's
numbers, many files in parallel) -> runs (a run's ranks folded, a sweep's points set against their 1-GPU
point) -> explain (the verdicts and scaling notes, attached here, above the stages that measure and fold).
The commands (analysis/__main__.py, analysis/compare.py) and api.py call these; no stage calls up into a
later one (tests/unit/test_architecture.py holds it). No torch import.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable
from pathlib import Path

from analysis.explain.verdict import judged_run, judged_trace, scaling_note
from analysis.measure.device import TOP_N
from analysis.measure.trace import measure_trace
from analysis.read.discover import Warnings, run_traces
from analysis.records import RunRow, TraceRecord
from analysis.runs.fold import fold_run
from analysis.runs.sweep import fold_sweep, with_scaling
from hpc.core.errors import TraceError
from hpc.core.rundir import RunPaths
from hpc.core.summary import current_summary


def analyze_trace(path: Path, top_n: int | None = TOP_N) -> TraceRecord:
    """One trace's record, measured, with its verdict (TraceError: not a usable trace)."""
    return judged_trace(measure_trace(path, top_n))


def _analyze_one(path: Path, top_n: int | None = TOP_N) -> tuple[TraceRecord | None, str | None]:
    """(record, warning) of one file; runs in a worker process, so the warning travels back."""
    try:
        rec = analyze_trace(path, top_n)
    except TraceError as e:
        return None, f"{path}: skipped: {e}"
    return rec, (f"{path}: {rec.bad_events} event(s) with mistyped fields skipped" if rec.bad_events else None)


def analyze_files(
    paths: Iterable[Path], warnings: Warnings, workers: int | None = None, top_n: int | None = TOP_N
) -> list[TraceRecord]:
    """The records of the usable files, in order, analysed in parallel over the machine's cores
    (`workers`, default: one per core, at most one per file), with `top_n` kernels and operators listed
    (None: all); unusable files go to `warnings`."""
    paths = list(paths)
    workers = min(len(paths), workers or os.cpu_count() or 1)
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_analyze_one, paths, itertools.repeat(top_n)))
    else:
        results = [_analyze_one(p, top_n) for p in paths]
    warnings.extend(message for _, message in results if message)
    return [rec for rec, _ in results if rec is not None]


def analyze_run(
    run_dir: Path, warnings: Warnings, records: list[TraceRecord] | None = None
) -> tuple[list[TraceRecord], RunRow | None]:
    """Per-trace records of a run (with the run's summary attached) and the run-level record with its
    verdict; the records are made here unless given (a sweep analyses all its points' traces at once)."""
    records = analyze_files(run_traces(run_dir, warnings), warnings) if records is None else records
    summary = current_summary(RunPaths(run_dir), warnings.append)
    records, run, judged = fold_run(run_dir, records, summary)
    return records, (judged_run(run, records, summary) if run is not None and judged else run)


def analyze_sweep(sweep_dir: Path, warnings: Warnings) -> tuple[list[TraceRecord], list[RunRow]]:
    """Per-trace records of every point and one row per point (data fraction x batch x GPUs x nodes),
    each judged, each multi-GPU point with the note on why it falls short of linear."""
    traces, rows = fold_sweep(sweep_dir, warnings, analyze_files, analyze_run)
    return traces, [dataclasses.replace(r, scaling_note=scaling_note(r)) for r in with_scaling(rows)]
