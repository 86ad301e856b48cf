"""Time the trace analysis against torch-tb-profiler's loader and HolisticTraceAnalysis on the same
files: wall seconds and peak memory, each tool in a fresh process (a benchmark, not a test).

    python -m analysis.bench.speed [TRACE ...]        # default: every trace in ../shared/traces
    python -m analysis.bench.speed --repeat 3 --json out.json
    python -m analysis.bench.speed --big /tmp/big   # the million-event traces (built there, ~1.6 GB of disk)
    python -m analysis.bench.speed --ranks TRACE --counts 32,64,128,256 --big /tmp/many   # one rank's trace
        copied to N jittered ranks there (analysis/bench/manyranks.py): time and memory against the rank count

What each tool does: ours, the whole per-trace record (every number `python -m analysis` shows,
breakdowns, collectives, top kernels and operators included); torch-tb-profiler, its loader
(RunProfileData.parse); HTA, its loader plus its kernel and temporal breakdowns (a trace with no
GPU kernels makes HTA's breakdowns fail: the error is shown).

Peak memory is the process's VmHWM (peak resident set) minus its value after imports, so library
import cost is not charged to parsing. Tools that are not installed are reported as such.
"""

from __future__ import annotations

import json
import stat
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, check_output_file, counts, inspect_path, run
from hpc.core.errors import EXIT_OK, UsageError
from hpc.core.files import write_atomic

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces"

_RUNNERS = {
    "analysis": ("import analysis.pipeline", "analysis.pipeline.analyze_trace(path)"),
    "torch-tb-profiler": (
        "import tempfile, analysis.tensorboard\nfrom torch_tb_profiler.profiler.data import RunProfileData",
        "RunProfileData.parse('rank0', '1', path, tempfile.mkdtemp())",
    ),
    "hta": (
        "import os, shutil, tempfile, logging\nlogging.disable(logging.WARNING)\n"
        "from hta.trace_analysis import TraceAnalysis",
        "d = tempfile.mkdtemp(); shutil.copy(path, d)\n"
        "t = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)\n"
        "t.get_gpu_kernel_breakdown(visualize=False); t.get_temporal_breakdown(visualize=False)",
    ),
}

_CHILD = """
import sys, time
{imports}
def hwm():
    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) * 1024
path = sys.argv[1]
base = hwm()
t0 = time.perf_counter()
{call}
print(time.perf_counter() - t0, hwm() - base)
"""


def _runs(repeat: int) -> int:
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: must be >= 1")
    return repeat


def measure(tool: str, path: Path) -> tuple[float, int] | str:
    imports, call = _RUNNERS[tool]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(imports=imports, call=call), str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return "not installed" if "ModuleNotFoundError" in proc.stderr else last[:80]
    seconds, mem = proc.stdout.strip().splitlines()[-1].split()
    return float(seconds), int(mem)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m analysis.bench.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", help="trace files (default: ../shared/traces)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and file; the median is shown")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--big", metavar="DIR", help="instead: build the million-event traces in DIR and print the ratios"
    )
    parser.add_argument("--ranks", metavar="TRACE", help="instead: TRACE copied to --counts ranks under --big DIR")
    parser.add_argument("--counts", default="32,64,128,256", help="with --ranks: the rank counts")
    args = parser.parse_args(argv)
    if args.ranks:
        return print_ranks(Path(args.ranks), args.counts, Path(args.big or "many-ranks"), args.json)
    if args.big:
        return print_big(Path(args.big), args.json, _runs(args.repeat))
    files = [Path(p) for p in args.traces] or sorted(DEFAULT_DIR.rglob("*.json.gz"))
    if not files:
        raise UsageError(f"no trace files (looked in {DEFAULT_DIR})")
    for path in files:
        status = inspect_path(path, "trace")
        if status is None or not stat.S_ISREG(status.st_mode):
            raise UsageError(f"{path}: not a trace file")
    repeat = _runs(args.repeat)
    check_output_file(args.json, "--json")
    results = []
    print(f"{'file':42} {'MB':>6}  " + "  ".join(f"{t + ' s':>20} {'peak MB':>8}" for t in _RUNNERS))
    for path in files:
        row: dict[str, Any] = {"file": str(path), "bytes": path.stat().st_size}
        cells = []
        for tool in _RUNNERS:
            runs = [measure(tool, path) for _ in range(repeat)]
            ok = [r for r in runs if isinstance(r, tuple)]
            if not ok:
                row[tool] = {"error": runs[0]}
                cells.append(f"{runs[0]:>29}")
                continue
            seconds = statistics.median(r[0] for r in ok)
            mem = statistics.median(r[1] for r in ok)
            row[tool] = {"seconds": seconds, "peak_bytes": mem}
            cells.append(f"{seconds:20.3f} {mem / 2**20:8.1f}")
        results.append(row)
        print(f"{path.name[:42]:42} {row['bytes'] / 2**20:6.1f}  " + "  ".join(cells), flush=True)
    if args.json:
        write_atomic(args.json, json.dumps(results, indent=2))
    return EXIT_OK


BIG_SOURCE = DEFAULT_DIR / "hta_single" / "df_index_resolver.json.gz"
ANALYSIS = "import runpy\nrunpy.run_module('analysis', run_name='__main__')"  # python -m analysis ARGS
HTA_BREAKDOWN = (
    "import logging, sys\nlogging.disable(logging.WARNING)\nfrom hta.trace_analysis import TraceAnalysis\n"
    "TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)"
)


def print_big(folder: Path, json_out: str | None, repeat: int = 3) -> int:
    """Ten copies of HTA's df_index_resolver trace end to end (2.2 million events): the whole analysis
    against traceinsight's kernel breakdown, each a whole process run `repeat` times (the median time, the
    largest peak); then enough copies for 1 GB of JSON: the analysis's peak memory per event and per byte."""

    if not BIG_SOURCE.is_file():
        raise UsageError(f"--big needs {BIG_SOURCE} (the shared traces)")
    check_output_file(str(folder / "x"), "--big")
    results: dict[str, Any] = {}
    copies, per_copy = 10, 0
    for name, with_hta in (("2.2M events", True), ("1 GB", False)):
        if per_copy:  # enough copies for a gigabyte (10^9 bytes) of JSON
            copies = -(-1_000_000_000 // per_copy)
        where = folder / f"x{copies}"
        where.mkdir(parents=True, exist_ok=True)
        size = built(copies, where / "rank1.trace.json")
        per_copy = size["bytes"] // copies
        ours = median_run(ANALYSIS, [str(where / "rank1.trace.json"), "--format", "json"], repeat)
        theirs = median_run(HTA_BREAKDOWN, [str(where)], repeat) if with_hta else None
        results[name] = {**size, "copies": copies, "analysis": ours, "traceinsight_kernel_breakdown": theirs}
        print(big_line(name, copies, size, ours, theirs), flush=True)
        (where / "rank1.trace.json").unlink()
    if json_out:
        write_atomic(json_out, json.dumps(results, indent=2))
    return EXIT_OK


def median_run(code: str, argv: list[str], repeat: int) -> tuple[float, int] | str:
    """`repeat` whole-process runs: (the median wall seconds, the largest peak), or the first error."""
    from analysis.bench.bigtrace import whole_process

    runs = [whole_process(code, argv) for _ in range(repeat)]
    ok = [r for r in runs if isinstance(r, tuple)]
    if len(ok) < len(runs):
        return next(r for r in runs if not isinstance(r, tuple))
    return statistics.median(r[0] for r in ok), max(r[1] for r in ok)


def built(copies: int, out: Path) -> dict[str, int]:
    """bigtrace.build in a process of its own, so that this one stays small while the others run."""
    code = (
        "import json, sys\nfrom pathlib import Path\nfrom analysis.bench.bigtrace import build\n"
        "print(json.dumps(build(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(BIG_SOURCE), str(copies), str(out)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise UsageError(f"--big: could not write {out} ({(proc.stderr.strip().splitlines() or ['?'])[-1]})")
    return json.loads(proc.stdout)


def big_line(name: str, copies: int, size: dict, ours: Any, theirs: Any) -> str:
    head = f"{name} ({copies} x df_index_resolver, {size['events']:,} events, {size['bytes'] / 1e6:,.0f} MB):"
    if not isinstance(ours, tuple):
        return f"{head} analysis failed: {ours}"
    line = (
        f"{head} analysis {ours[0]:.1f} s, peak {ours[1] / 2**20:,.0f} MiB "
        f"({ours[1] / size['events']:.0f} bytes per event, {ours[1] / size['bytes']:.2f} of the file)"
    )
    if isinstance(theirs, tuple):
        line += (
            f"; traceinsight get_gpu_kernel_breakdown {theirs[0]:.1f} s, peak {theirs[1] / 2**20:,.0f} MiB: "
            f"{theirs[0] / ours[0]:.1f}x faster, 1/{theirs[1] / ours[1]:.1f} of its memory"
        )
    elif theirs is not None:
        line += f"; traceinsight failed: {theirs}"
    return line


def print_ranks(source: Path, counts_text: str, folder: Path, json_out: str | None) -> int:
    """The analysis of `source` copied to each rank count: seconds, per rank, and the memory bound."""
    from analysis.bench.manyranks import build_ranks, measure, slow_rank

    if not source.is_file():
        raise UsageError(f"--ranks {source}: not a trace file")
    rank_counts = counts(counts_text, "--counts", 2, "32,64,128,256")
    check_output_file(json_out, "--json")
    print(
        "| ranks | MB (gz) | seconds | per rank (s) | parent peak (MiB) | worker peak (MiB) x workers "
        "| step skew (ms) | straggler found (built) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for count in rank_counts:
        size = build_ranks(source, count, folder / f"r{count}")
        m = measure(folder / f"r{count}")
        results.append({"ranks": count, **size, **m})
        print(
            f"| {count} | {size['bytes'] / 1e6:.0f} | {m['seconds']:.1f} | {m['seconds'] / count:.3f} | "
            f"{m['parent_peak_bytes'] / 2**20:.0f} | {m['worker_peak_bytes'] / 2**20:.0f} x {m['workers']} | "
            f"{(m['step_skew_us'] or 0) / 1e3:.1f} | {m['straggler_rank']} ({slow_rank(count)}) |",
            flush=True,
        )
    if json_out:
        write_atomic(json_out, json.dumps(results, indent=2))
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m analysis.bench.speed`, or its console script): errors as one line, exit 2."""
    return run("analysis.bench.speed", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
