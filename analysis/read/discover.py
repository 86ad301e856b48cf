"""Finding traces: the trace files under a directory, or a run's. What could not be used is not raised
but noted: every function that may skip something takes `warnings`, a list it appends one message to
per skipped file or field, and the command prints them once it knows whether it has a result.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

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
