"""python -m analysis compare A B [--rank R] [--format table|md|json]
   python -m analysis compare SWEEP --point batch=512,gpus=1 --point batch=512,gpus=4
   python -m analysis compare SWEEP_A SWEEP_B --point batch=512,gpus=4
   python -m analysis compare SWEEP --point lr=0.1,seed=1 --point lr=0.01,seed=1   # sweep.axes too

Why two runs differ, per step: A and B side by side and B - A: what a step is made of (device time by
kernel class, exposed communication and memory copies, idle time waiting for the host or not), kernel
calls, the host's launch time, the operators and kernels that changed most, collectives, peak memory;
first, one sentence naming the term that accounts for most of the difference. A and B are each a trace
file, a run directory (rank --rank's traces, default 0) or a sweep point (--point: a sweep and the
point's axes; two sweeps and one point compare the same point of each). No torch import.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from analysis.pipeline import analyze_files
from analysis.read.discover import Warnings, print_warnings, run_traces
from analysis.records import TraceRecord
from analysis.report.units import number
from analysis.runs.diff import Profile, compare, profile
from hpc.core.cli import Parser, inspect_path, run
from hpc.core.errors import EXIT_OK, UsageError
from hpc.core.rundir import AxisValue, SweepPaths, read_index

AXES = {
    "batch": "batch_size",
    "batch_size": "batch_size",
    "gpus": "gpus",
    "nodes": "nodes",
    "fraction": "data_fraction",
    "data_fraction": "data_fraction",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python -m analysis compare",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        needs_args=True,
    )
    parser.add_argument("paths", nargs="+", help="A and B: trace files or run directories; or one or two sweeps")
    parser.add_argument(
        "--point", action="append", default=[], help="a sweep point by its axes, e.g. batch=512,gpus=4 or lr=0.1,seed=1"
    )
    parser.add_argument("--rank", type=int, default=0, help="the rank whose traces stand for a run (default 0)")
    parser.add_argument(
        "--format", choices=["table", "md", "json"], default="table", help="how it is printed (default table)"
    )
    return parser.parse_args(argv)


def sides(paths: list[str], points: list[str]) -> list[tuple[str, Path]]:
    """(label, run directory or trace file) of A and B, from the paths and --point given."""
    if len(paths) == 2 and not points:
        return [(Path(p).name if Path(p).is_file() else p, Path(p)) for p in paths]
    if len(paths) == 1 and len(points) == 2:
        return [(f"{q}", point_dir(Path(paths[0]), q)) for q in points]
    if len(paths) == 2 and len(points) == 1:
        return [(f"{p} {points[0]}", point_dir(Path(p), points[0])) for p in paths]
    raise UsageError(
        f"compare takes A and B: two traces or runs, one sweep and two --point, or two sweeps and one --point "
        f"(got {len(paths)} path(s) and {len(points)} --point)"
    )


def parse_point(spec: str, swept: tuple[str, ...] = ()) -> tuple[dict[str, float], dict[str, AxisValue]]:
    """`batch=512,gpus=4,lr=0.1` -> ({batch_size: 512, gpus: 4}, {lr: 0.1}): the study's axes, then the
    sweep's others (`swept`: sweep.axes, index.json's `values`), a value read as a number, true/false or text."""
    wanted: dict[str, float] = {}
    values: dict[str, AxisValue] = {}
    for part in spec.split(","):
        key, eq, value = (w.strip() for w in part.partition("="))
        if not eq or (key not in AXES and key not in swept):
            known = sorted({*AXES, *swept})
            raise UsageError(f"--point {spec!r}: {part!r} is not AXIS=VALUE with an axis of {known}")
        if key in swept:
            values[key] = scalar(value)
            continue
        try:
            wanted[AXES[key]] = float(value)
        except ValueError:
            raise UsageError(f"--point {spec!r}: {value!r} is not a number") from None
    return wanted, values


def scalar(text: str) -> AxisValue:
    """A swept value as written on the command line: an int, a float, true/false, else the text itself."""
    for kind in (int, float):
        try:
            number: AxisValue = kind(text)
        except ValueError:
            continue
        return number
    return {"true": True, "false": False}.get(text.lower(), text)


def point_dir(sweep: Path, spec: str) -> Path:
    """The run directory of the one point of `sweep` that has the axes of `spec`."""
    paths = SweepPaths(sweep)
    if not paths.index.is_file():
        raise UsageError(f"--point {spec!r}: {sweep} is not a sweep directory (no {paths.index.name})")
    points = read_index(paths.index)
    swept = tuple(dict.fromkeys(k for p in points for k in p.values))
    wanted, values = parse_point(spec, swept)
    found = [
        p
        for p in points
        if all(getattr(p, k) == v for k, v in wanted.items())
        and all(same_value(p.values.get(k), v) for k, v in values.items())
    ]
    if len(found) != 1:
        how = "no point" if not found else f"{len(found)} points (add an axis)"
        raise UsageError(f"--point {spec!r}: {how} of {sweep} has these axes")
    return paths.run(found[0].run_dir).root


def same_value(recorded: AxisValue | None, given: AxisValue) -> bool:
    """A recorded value and one typed on the command line: equal, numbers as numbers (0.10 is 0.1; true is
    not 1)."""
    if isinstance(recorded, bool) or isinstance(given, bool):
        return recorded is given
    return recorded == given or str(recorded) == str(given)


def records_of(label: str, path: Path, rank: int, warnings: Warnings) -> list[TraceRecord]:
    """The traces standing for one side, analysed with every operator and kernel."""
    if inspect_path(path, label) is None:
        raise UsageError(f"{label}: no such file or directory")
    files = [path] if path.is_file() else run_traces(path, warnings)
    records = analyze_files(files, warnings, top_n=None)
    ranked = [r for r in records if r.rank == rank]
    chosen = ranked if ranked else records if len({r.rank for r in records}) <= 1 else []
    if not chosen:
        raise UsageError(f"{label}: no usable trace of rank {rank}" + (f" ({warnings[-1]})" if warnings else ""))
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings: Warnings = []
    (la, pa), (lb, pb) = sides(args.paths, args.point)
    a = profile(la, records_of(la, pa, args.rank, warnings))
    b = profile(lb, records_of(lb, pb, args.rank, warnings))
    print_warnings(warnings)
    result = compare(a, b)
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.format == "json" else render(result, args.format))
    return EXIT_OK


def render(result: dict[str, Any], fmt: str) -> str:
    """The comparison as text tables (table) or Markdown (md); times in ms per step."""
    a, b = result["a"], result["b"]
    lines = [result["explanation"]["sentence"], ""]
    lines += [
        f"A: {a['label']} ({len(a['files'])} trace(s), {a['steps']} step(s))",
        f"B: {b['label']} ({len(b['files'])} trace(s), {b['steps']} step(s))",
    ]
    lines += [f"note: {s['note']}" for s in (a, b) if s["note"]]
    sections = [
        ("per step (times in ms, memory in GiB)", result["summary"], "name", ("a", "b", "delta")),
        ("what a step is made of (ms)", result["terms_us"], "name", ("a", "b", "delta")),
        ("device time by kernel class (ms per step)", result["kernel_time_by_class_us"], "name", ("a", "b", "delta")),
        ("kernel calls by class (per step)", result["kernel_calls_by_class"], "name", ("a", "b", "delta")),
        ("idle on the busiest stream (ms per step)", result["idle_us"], "name", ("a", "b", "delta")),
        (
            "operators by change (ms per step)",
            result["top_operators"],
            "name",
            ("calls_a", "calls_b", "us_a", "us_b", "delta_us"),
        ),
        (
            "kernels by change (ms per step)",
            result["top_kernels"],
            "name",
            ("calls_a", "calls_b", "us_a", "us_b", "delta_us"),
        ),
        (
            "collectives (per step)",
            result["collectives"],
            "kind",
            ("calls_a", "calls_b", "time_us_a", "time_us_b", "delta_time_us", "busbw_GBps_a", "busbw_GBps_b"),
        ),
    ]
    for title, rows, key, cols in sections:
        if rows:
            lines += ["", f"## {title}" if fmt == "md" else f"{title}:", *_table(rows, key, cols, fmt, title)]
    return "\n".join(lines) + "\n"


def _value(row: dict[str, Any], col: str, title: str) -> str:
    """A cell in the unit its title or row says: µs shown as ms, bytes as GiB."""
    v = row.get(col)
    name = str(row.get("name", ""))
    if v is not None and (
        "us" in col.split("_") or (col in ("a", "b", "delta") and ("ms" in title or name.endswith("_us")))
    ):
        v = v / 1e3
    elif v is not None and col in ("a", "b", "delta") and name.endswith("_bytes"):
        v = v / 2**30
    return "-" if v is None else number(v)


def _table(rows: list[dict], key: str, cols: tuple[str, ...], fmt: str, title: str) -> list[str]:
    cells = [[str(r[key])[:70], *(_value(r, c, title) for c in cols)] for r in rows]
    header = [key, *cols]
    if fmt == "md":
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(c) + " |" for c in cells
        ]
    widths = [max(len(x[i]) for x in [header, *cells]) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *cells]
    ]


def cli(argv: list[str] | None = None) -> int:
    return run("analysis", main, argv)  # errors read `analysis: error: ...`, as `python -m analysis compare`'s


__all__ = ["Profile", "cli", "main"]

if __name__ == "__main__":
    sys.exit(cli())
