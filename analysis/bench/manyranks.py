"""The analysis at many ranks, for the benchmark (`python -m analysis.bench.speed --ranks TRACE`): a real rank trace
copied to N ranks with per-rank jitter, and what analysing them costs (a benchmark, not a test).

`build_ranks(source, ranks, out)` writes `out/traces/rank<R>.synthetic.pt.trace.json.gz` for R < ranks: the
source's events with rank R's timeline stretched by a factor 1 + jitter (up to JITTER, spread over the ranks
by the golden ratio so neighbours differ), one rank (`slow_rank`) stretched by SLOW, and distributedInfo
saying rank R of N. Stretching times (from the trace's first event) and durations alike moves each rank's
collective launches later from its step starts, so the analysis's straggler and cross-rank spread have
something to find. Integer times stay integers (see analysis/bench/bigtrace.py). Never committed.

`measure(folder)` runs `python -m analysis folder --format json` as a whole process: its wall time, its own
peak resident memory (VmHWM) and the largest worker's (getrusage of the joined children). Workers analyse one
trace at a time (analysis/read/discover.py), so memory is bounded by parent + workers x the largest worker's peak,
whatever the rank count; time grows with the ranks. No torch import.
"""

from __future__ import annotations

import gzip
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

JITTER = 0.05  # a healthy rank's step is up to 5% slower than the source's
SLOW = 0.30  # the slow rank's: 30%
GOLDEN = (math.sqrt(5) - 1) / 2


def slow_rank(ranks: int) -> int:
    return ranks // 3


def stretch_of(rank: int, ranks: int) -> float:
    return 1 + (SLOW if rank == slow_rank(ranks) else JITTER * ((rank * GOLDEN) % 1.0))


def _stretched(events: list[dict[str, Any]], t0: float, factor: float) -> list[dict[str, Any]]:
    out = []
    for e in events:
        ts, dur = e.get("ts"), e.get("dur")
        copy = dict(e)
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            moved = t0 + (ts - t0) * factor
            copy["ts"] = round(moved) if type(ts) is int else moved
        if isinstance(dur, (int, float)) and not isinstance(dur, bool):
            copy["dur"] = round(dur * factor) if type(dur) is int else dur * factor
        out.append(copy)
    return out


def build_ranks(source: Path, ranks: int, out: Path) -> dict[str, int]:
    """Write `ranks` jittered copies of `source` under out/traces/; their total bytes and events."""
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        trace = msgspec.json.decode(f.read())
    events = trace["traceEvents"]
    t0 = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M")
    folder = out / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    encode, total = msgspec.json.Encoder().encode, 0
    for rank in range(ranks):
        info = {**(trace.get("distributedInfo") or {}), "rank": rank, "world_size": ranks}
        doc = {**trace, "distributedInfo": info, "traceEvents": _stretched(events, t0, stretch_of(rank, ranks))}
        path = folder / f"rank{rank}.synthetic.pt.trace.json.gz"
        path.write_bytes(gzip.compress(encode(doc), compresslevel=1))
        total += path.stat().st_size
    return {"bytes": total, "events": ranks * len(events)}


_CHILD = (
    "import atexit, resource, runpy, sys\n"
    "def _peaks():\n"
    "    kb = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "    sys.stderr.write('\\nhpc-bench-peaks %d %d\\n' % (int(kb) * 1024, kids * 1024))\n"
    "atexit.register(_peaks)\n"
    "runpy.run_module('analysis', run_name='__main__')\n"
)


def measure(folder: Path) -> dict[str, Any]:
    """`python -m analysis folder --format json` as a whole process: seconds, peaks, and its run record."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), "--format", "json"], capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    peaks = [line.split() for line in proc.stderr.splitlines() if line.startswith("hpc-bench-peaks")]
    if proc.returncode != 0 or not peaks:
        raise RuntimeError((proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200])
    run = msgspec.json.decode(proc.stdout).get("run") or {}
    return {
        "seconds": seconds,
        "parent_peak_bytes": int(peaks[-1][1]),
        "worker_peak_bytes": int(peaks[-1][2]),
        "workers": min(os.cpu_count() or 1, run.get("traces") or 1),
        "straggler_rank": run.get("straggler_rank"),
        "step_skew_us": run.get("step_skew_us"),
        "verdict": (run.get("verdict") or {}).get("line"),
    }
