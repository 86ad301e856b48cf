"""The analysis's one entry for the rest of the toolkit (the launcher's status, a local run's closing
numbers, the study's report job): what they ask of it, so that none assembles it from its pieces. No
torch import; every function takes and returns plain paths, records and text.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from analysis.explain.verdict import headline
from analysis.pipeline import analyze_run
from analysis.read.discover import print_warnings
from analysis.read.metrics import choose, logged_metrics
from analysis.records import RunRow, TraceRecord
from analysis.report.tables import render, run_label, verdict_lines
from hpc.core.cli import check_output_dir
from hpc.core.files import read_json
from hpc.core.rundir import SweepPaths

__all__ = [
    "end_of_run_lines",
    "latest_metrics",
    "render",
    "report",
    "reported_headlines",
    "run_numbers",
    "run_verdict",
    "verdict_headline",
]


def run_numbers(run_dir: Path) -> tuple[list[TraceRecord], RunRow | None]:
    """A run's per-trace records and its run record, from its own files; what was skipped is printed as
    warnings (one line each)."""
    warnings: list[str] = []
    traces, run = analyze_run(run_dir, warnings)
    print_warnings(warnings)
    return traces, run


# Of the lines the analysis gives a run, those its end repeats: the verdict and what happened to its ranks
# (separate copies); its GPUs' samples and a sweep's scaling are the report's.
END_OF_RUN = ("", ", ranks")


def end_of_run_lines(run: RunRow) -> list[str]:
    """What a run's last lines say of it: `verdict: ...`, then `verdict, ranks: ...` where its ranks each
    trained a separate copy."""
    label = run_label(run)
    said = [(what.removeprefix(label), text) for what, text in verdict_lines([], [run])]
    return [f"verdict{suffix}: {text}" for suffix, text in said if suffix in END_OF_RUN]


class ReportedVerdict(msgspec.Struct):
    """A verdict as a run's record holds it (explain/verdict.py's, in runs.json): what bounds the run, and
    what would next; the rest of it is the report's."""

    bound: str
    secondary: str | None = None


class ReportedRun(msgspec.Struct):
    """A run of the report's runs.json, as far as a status reads it: its directory and its verdict."""

    run_dir: str
    verdict: ReportedVerdict | None = None


def verdict_headline(verdict: object) -> str | None:
    """`bound (then secondary)` of a verdict record (as runs.json holds it), None for anything else."""
    try:
        said = msgspec.convert(verdict, ReportedVerdict)
    except msgspec.ValidationError:
        return None
    return headline(said.bound, said.secondary)


def reported_headlines(runs_json: Path) -> dict[str, str]:
    """Each run's verdict headline as the report's runs.json has it, by its directory's name (a sweep moves);
    a run not of that shape, or a file that is none, gives none."""
    records = read_json(runs_json) if runs_json.is_file() else None
    out = {}
    for record in records if isinstance(records, list) else []:
        try:
            run = msgspec.convert(record, ReportedRun)
        except msgspec.ValidationError:
            continue
        if run.verdict is not None:
            out[Path(run.run_dir).name] = headline(run.verdict.bound, run.verdict.secondary)
    return out


def run_verdict(run_dir: Path) -> str | None:
    """What bounds a finished run, from its own traces (quietly: a status line, not a report)."""
    _, run = analyze_run(run_dir, [])
    return verdict_headline(run.verdict) if run is not None else None


def report(sweep_dir: Path, fmt: str = "table") -> int:
    """What `python -m analysis SWEEP --report` does, from values: the tables (printed in `fmt`), figures
    and report.html in SWEEP/analysis; its exit code."""
    from analysis.__main__ import analyse

    out = SweepPaths(sweep_dir).analysis
    check_output_dir(out, f"the report (writes {out})")
    return analyse(sweep_dir, out, fmt, plots=True, report=True)


def latest_metrics(run_dirs: list[Path], wanted: str | None = None, mode: str | None = None) -> dict[Path, str]:
    """Each run's latest value of the metric its sweep is judged by (`wanted`, sweep.metric; else the first
    loss or accuracy any run logged), as `val/loss 0.2113 @24` (its step): what hpc.study status shows while
    the sweep runs. A run that logged none has no entry."""
    found = {run: logged_metrics(run) for run in run_dirs}
    choice = choose((name for metrics in found.values() for name in metrics), wanted, mode)
    if choice is None:
        return {}
    out = {}
    for run, metrics in found.items():
        series = metrics.get(choice.name)
        if series is not None:
            out[run] = f"{choice.name} {series.values[-1]:.4g} @{series.steps[-1]}"
    return out
