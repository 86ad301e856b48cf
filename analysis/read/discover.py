"""Finding traces and analysing many at once: the trace files under a directory, and their records
computed in parallel, one process per core. What could not be used is not raised but noted: every
function that may skip something takes `warnings`, a list it appends one message to per skipped file
or field, and the command prints them once it knows whether it has a result.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from analysis.measure.device import TOP_N
from analysis.measure.trace import analyze_trace
from analysis.records import TraceRecord
from hpc.core.errors import TraceError
from hpc.core.rundir import RANK_SIDE_SUFFIXES, SIDE_FILES, TRACE_PATTERNS, RunPaths

Warnings = list[str]  # messages about what was skipped, in the order met


def print_warnings(warnings: Warnings) -> None:
    """Each warning as one line on stderr."""
    for message in warnings:
        print(f"analysis: warning: {' '.join(message.split())[:400]}", file=sys.stderr)


MAX_DEPTH = 3  # a run's traces lie in it, in traces/, or one level further (a folder of runs' traces)
MAX_ENTRIES = 20_000  # a directory with more below it is no run (`python -m analysis /` must not walk the disk)


def find_traces(directory: Path, warnings: Warnings | None = None) -> list[Path]:
    """The trace files in `directory`, at most MAX_DEPTH levels down, links not followed (our own JSON
    side files are not traces). Looking stops after MAX_ENTRIES entries, said in `warnings`."""
    found, seen = [], 0
    for top, dirs, files in os.walk(directory, onerror=lambda e: None):
        depth = len(Path(top).relative_to(directory).parts)
        if depth >= MAX_DEPTH:
            dirs[:] = []
        seen += len(dirs) + len(files)
        if seen > MAX_ENTRIES:
            if warnings is not None:
                warnings.append(
                    f"{directory}: stopped looking for traces after {MAX_ENTRIES:,} entries; "
                    "give a run or sweep directory, or a trace file"
                )
            break
        found += [Path(top) / f for f in files if any(fnmatch.fnmatch(f, p) for p in TRACE_PATTERNS)]
    return sorted(
        p
        for p in found
        if p.name not in SIDE_FILES and not p.name.endswith((".tmp", *RANK_SIDE_SUFFIXES)) and p.is_file()
    )


def run_traces(run_dir: Path, warnings: Warnings | None = None) -> list[Path]:
    """A run's traces: under traces/ when it has one (hpc.train's layout), else anywhere in it."""
    traces = RunPaths(run_dir).traces
    return find_traces(traces if traces.is_dir() else run_dir, warnings)


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
