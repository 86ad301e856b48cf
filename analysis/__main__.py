"""python -m analysis PATH [--format table|csv|json|md] [--out DIR] [--plots] [--report]
   python -m analysis compare A B            (why two runs differ: analysis/compare.py)

PATH: a trace file, a run directory (what hpc.train writes) or a sweep directory (with index.json).
Prints the most aggregated table for PATH (json: that level's records, with their verdicts, and the
per-trace records under "traces"), then where the time went
(breakdowns, collectives, top kernels and operators; for a sweep, each point's efficiency loss);
--out DIR also writes traces.json, runs.csv/.md/.json, why.md and, for a sweep, sweep.csv/.md;
--plots draws the study's figures; --report writes them with every table into report.html.
Unusable files are warned about and skipped; exit 2 when nothing was usable. No torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from analysis import compare
from analysis.explain.series import sweeps_side_by_side
from analysis.pipeline import analyze_files, analyze_run, analyze_sweep
from analysis.read.discover import Warnings, print_warnings, run_traces
from analysis.records import RunRow, TraceRecord
from analysis.report.figures import plot_sweep
from analysis.report.hparams import write_hparams
from analysis.report.html import SWEEPS_COLUMNS, render_report, sweeps_section
from analysis.report.runfigures import plot_run
from analysis.report.tables import (
    TRACE_COLUMNS,
    json_document,
    metric_section,
    render,
    rows_to_csv,
    rows_to_markdown,
    run_columns,
    to_json,
    why_tables,
)
from analysis.runs.apart import runs_in_folder, trace_runs
from analysis.runs.fold import why_no_trace
from hpc.core.cli import Parser, check_output_dir, inspect_path, run
from hpc.core.ending import Outcome
from hpc.core.errors import EXIT_OK, UsageError, WriteError
from hpc.core.files import write_atomic, write_failure
from hpc.core.logs import TO_STDERR
from hpc.core.owner import make_dirs
from hpc.core.rundir import (
    REPORT,
    RUNS_CSV,
    RUNS_JSON,
    RUNS_MD,
    SWEEP_CSV,
    SWEEP_TABLE,
    TRACES_JSON,
    WHY_TABLE,
    RunPaths,
    SweepPaths,
)

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python -m analysis",
        usage="%(prog)s PATH [OTHER] [--format {table,csv,json,md}] [--out OUT] [--plots] [--report]\n"
        "       %(prog)s compare A B",
        description=__doc__.split("\n\n")[1],
        epilog="python -m analysis compare A B: why two runs, or two sweeps' points, differ (its own --help).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        needs_args=True,
    )
    parser.add_argument("path", help="trace file (.json/.json.gz), run directory or sweep directory")
    parser.add_argument(
        "other", nargs="?", help="a second sweep of the same grid (graphed against eager, say): compared point by point"
    )
    parser.add_argument(
        "--format", choices=["table", "csv", "json", "md"], default="table", help="how it is printed (default table)"
    )
    parser.add_argument("--out", help="directory for traces.json, runs.csv/md/json, sweep.csv/md and figures/")
    parser.add_argument(
        "--plots", action="store_true", help="draw the study's figures (needs --out or a directory PATH)"
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="write report.html: figures, tables and each run's breakdowns in one self-contained page "
        "(implies --plots)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:  # python -m analysis compare A B (analysis/compare.py)
        return compare.main(argv[1:])
    args = parse_args(argv)
    path = Path(args.path)
    if inspect_path(path, "path") is None:
        raise UsageError(f"{args.path}: no such file or directory")
    args.plots = args.plots or args.report
    flag = "--report" if args.report else "--plots"
    out = Path(args.out) if args.out else (SweepPaths(path).analysis if args.plots and path.is_dir() else None)
    if args.plots and out is None:
        raise UsageError(f"{flag} with the trace file {args.path}: give --out DIR for the figures")
    check_output_dir(out, "--out" if args.out else f"{flag} (writes {out})")  # before any work
    return analyse(path, out, args.format, args.plots, args.report, Path(args.other) if args.other else None)


def analyse(path: Path, out: Path | None, fmt: str, plots: bool, report: bool, other: Path | None = None) -> int:
    """The analysis of `path` printed in `fmt`, and (with `out`, checked by the caller) its tables, with
    plots its figures, with report its report.html written there; `other`: a second sweep beside it."""
    traces, runs, sweep_rows = analyze_path(path)
    print_tables(traces, runs, sweep_rows, fmt)
    extra = print_second_sweep(path, other, traces, fmt) if other is not None else []
    if out is None:
        return EXIT_OK
    try:  # each file is written whole (write_atomic); a folder that cannot be made is one line too
        figures = write_outputs(out, traces, runs, sweep_rows, plots)
        if report:
            write_atomic(out / REPORT, render_report(out / REPORT, path, traces, runs, figures, extra))
            log.info(f"report: {out / REPORT}", extra=TO_STDERR)
    except OSError as e:
        raise e if isinstance(e, WriteError) else write_failure(e.filename or out, e, False) from None
    return EXIT_OK


def print_second_sweep(path: Path, other: Path, traces: list[TraceRecord], fmt: str) -> list[str]:
    """A second sweep against the first, point by point: printed, and the report's section (HTML)."""
    for p in (path, other):
        if not SweepPaths(p).index.is_file():
            raise UsageError(f"{p}: two paths are two sweeps of one grid, and this is not a sweep directory")
    other_traces, _, _ = analyze_path(other)
    rows = sweeps_side_by_side(traces, other_traces, path.name, other.name)
    print(f"\n{path.name} (a) against {other.name} (b), point by point:")
    sys.stdout.write(render(rows, SWEEPS_COLUMNS, "md" if fmt == "md" else "table" if fmt == "table" else fmt))
    return [sweeps_section(rows, path.name, other.name)]


def analyze_path(path: Path) -> tuple[list[TraceRecord], list[RunRow], list[RunRow] | None]:
    """(per-trace records, run rows, sweep rows or None) for a trace file, a run or a sweep directory;
    what was skipped is printed as warnings, or, when nothing was usable, is the error."""
    warnings: Warnings = []
    runs: list[RunRow] = []
    sweep_rows: list[RunRow] | None = None
    if path.is_file():
        traces = analyze_files([path], warnings)
    elif SweepPaths(path).index.exists():
        traces, sweep_rows = analyze_sweep(path, warnings)
        runs = sweep_rows
    elif several := runs_in_folder(path):  # each run on its own: its traces are not one run's ranks
        traces = []
        for run_dir in several:
            some, one = analyze_run(run_dir, warnings)
            traces, runs = traces + some, runs + ([one] if one else [])
        say_apart(path, [d.name for d in several])
    elif RunPaths(path).holds_run():
        traces, one = analyze_run(path, warnings)
        runs = [one] if one else []
    else:  # traces in a folder: TensorBoard's layout, or gathered; one run only where they can be one
        traces = analyze_files(run_traces(path, warnings), warnings)
        found = trace_runs(path, traces)
        for name, some in found:
            _, one = analyze_run(path, warnings, some)
            runs += [dataclasses.replace(one, run_dir=name if len(found) > 1 else one.run_dir)] if one else []
        if len(found) > 1:
            say_apart(path, [name for name, _ in found])
    if not traces and not runs:  # the skipped files are the reason: one line, naming the first
        said = why_no_trace(path) if path.is_dir() else None
        if said is not None:
            raise UsageError(f"{path}: the command recorded no trace: {said}")
        why = f" ({len(warnings)} problem(s); first: {warnings[0]})" if warnings else ""
        raise UsageError(f"{path}: no usable trace{why}")
    print_warnings(warnings)
    return traces, runs, sweep_rows


def say_apart(path: Path, names: list[str]) -> None:
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    log.info(f"analysis: {path} holds {len(names)} runs, each analysed on its own: {shown}", extra=TO_STDERR)


def print_tables(traces: list[TraceRecord], runs: list[RunRow], sweep_rows: list[RunRow] | None, fmt: str) -> None:
    if fmt == "json":  # the same level as the table, the traces under their own key
        sys.stdout.write(json_document(traces, runs, sweep_rows))
    elif not traces:  # a run that ended out of memory before any trace: its row says so
        sys.stdout.write(render(runs, run_columns(runs), fmt))
    elif sweep_rows is not None:
        if fmt in ("table", "md"):  # the script's own metric first, then how fast each point ran
            performance = "## Performance\n\n" if fmt == "md" else "\nperformance:\n"
            sys.stdout.write(metric_section(sweep_rows, fmt) + performance)
        sys.stdout.write(render(sweep_rows, run_columns(sweep_rows), fmt))
    elif len(runs) > 1:  # a folder of runs: one row each, named by its directory
        sys.stdout.write(render(runs, ["run_dir", *run_columns(runs)], fmt))
    else:
        sys.stdout.write(render(traces, TRACE_COLUMNS, fmt))
        if runs and fmt == "table" and runs[0].outcome == Outcome.OOM:
            print(f"run: {len(traces)} trace(s) of an aborted window; the run ended OUT OF MEMORY (summary.json: oom)")
        elif runs and fmt == "table":
            r = runs[0]
            if r.profiled_ranks and (r.gpus or 0) > len(r.profiled_ranks):  # profiler.ranks: a subset traced
                print(f"profiled: ranks {','.join(map(str, r.profiled_ranks))} of {r.gpus} (the rest: summary.json)")
            print(
                f"run: {r.outcome or 'no record of its end'}; {len(traces)} trace(s), {r.ranks} rank(s); step time "
                "mean/max over ranks "
                f"{_ms(r.step_time_us_mean.mean)}/{_ms(r.step_time_us_mean.max)} ms, imbalance "
                f"{r.rank_imbalance if r.rank_imbalance is None else round(r.rank_imbalance, 3)}"
            )
    if traces and fmt in ("table", "md"):
        sys.stdout.write(why_tables(traces, runs, fmt))


def write_outputs(
    out: Path, traces: list[TraceRecord], runs: list[RunRow], sweep_rows: list[RunRow] | None, plots: bool
) -> list[Path]:
    """The tables and JSON records (and with plots, the figures) under out; the figures written."""
    make_dirs(out, "--out")
    write_atomic(out / TRACES_JSON, to_json(traces))
    if runs:
        write_atomic(out / RUNS_JSON, to_json(runs))
        write_atomic(out / RUNS_CSV, rows_to_csv(runs, run_columns(runs)))
        write_atomic(out / RUNS_MD, rows_to_markdown(runs, run_columns(runs)))
    if sweep_rows is not None:
        write_atomic(out / SWEEP_CSV, rows_to_csv(sweep_rows, run_columns(sweep_rows)))
        performance = "## Performance\n\n" + rows_to_markdown(sweep_rows, run_columns(sweep_rows))
        write_atomic(out / SWEEP_TABLE, metric_section(sweep_rows, "md") + performance)
        write_hparams(out, sweep_rows)  # TensorBoard's HParams view of the points (analysis/report/hparams.py)
    why = why_tables(traces, runs, "md")
    if why:
        write_atomic(out / WHY_TABLE, why)
    if not plots or not runs:
        written = []
    elif sweep_rows is None and len(runs) == 1:  # one run: its own figures, where a sweep's would be one dot each
        written = plot_run(runs[0], traces, out / "figures")
    else:
        written = plot_sweep(runs, out / "figures")
    log.info(f"wrote {out}" + (f" ({len(written)} figures)" if written else ""), extra=TO_STDERR)
    return written


def _ms(us):
    return "-" if us is None else f"{us / 1000:.1f}"


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m analysis`, or its console script): errors as one line, exit 2."""
    return run("analysis", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
