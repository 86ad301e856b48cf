"""Big traces for the benchmark (analysis/bench/speed.py --big): a real trace laid end to end in time, N copies,
with its ids kept unique; and what a whole process costs (wall time and peak resident memory).

`build(source, copies, out)` writes plain JSON: the source's header, then its events N times, copy k
shifted by k times its span (plus a millisecond), its correlation, flow and external ids by k times
their largest value plus one, and its `ProfilerStep#N` renumbered, so that each copy reads as more
profiled steps of the same run. Metadata events (`ph: M`) are written once. A copy's times are written
as the source's are: integer times are shifted by an integer span, because an integer shifted by a
float would be written `...578.0`, which msgspec reads about ten times more slowly than the integer
(an exactly representable 17-digit decimal takes its slow path): an artifact of the copy, not of the
trace. Nothing here is a test fixture: the files are built where the benchmark is run, never committed.
No torch import.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

ARG_IDS = ("correlation", "External id", "Ev Idx", "Python id", "Python parent id")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
GAP_US = 1000  # between copies


def _largest(events: list[dict[str, Any]]) -> dict[str, int]:
    """The largest value of each id field (0 where absent)."""
    top = dict.fromkeys(("id", *ARG_IDS), 0)
    for e in events:
        if type(e.get("id")) is int:
            top["id"] = max(top["id"], e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for k in ARG_IDS:
                if type(args.get(k)) is int:
                    top[k] = max(top[k], args[k])
    return top


def _shift(events: list[dict[str, Any]], dt_us: float, ids: dict[str, int], steps: int) -> None:
    """One copy further on, in place: times, ids, step numbers."""
    for e in events:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += dt_us
        if type(e.get("id")) is int:
            e["id"] += ids["id"] + 1
        args = e.get("args")
        if isinstance(args, dict):
            for k in ARG_IDS:
                if type(args.get(k)) is int:
                    args[k] += ids[k] + 1
        m = STEP.match(e.get("name") or "") if isinstance(e.get("name"), str) else None
        if m:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + steps}"


def build(source: Path, copies: int, out: Path) -> dict[str, int]:
    """Write `copies` copies of `source` end to end as `out` (plain JSON); its events and bytes."""
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        trace = json.load(f)
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    events = [e for e in trace["traceEvents"] if e.get("ph") != "M"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed) + GAP_US
    if all(type(e["ts"]) is int for e in timed):
        span = math.ceil(span)  # integer times stay integers (see the module doc)
    ids = _largest(events)
    steps = 1000  # more than any source's step count
    header = {k: v for k, v in trace.items() if k != "traceEvents"}
    encode = msgspec.json.Encoder().encode
    with open(out, "wb") as f:
        f.write(encode(header)[:-1] + b', "traceEvents": [')
        f.write(encode(meta)[1:-1] + b",")
        for k in range(copies):
            if k:
                _shift(events, span, ids, steps)
            f.write((b"," if k else b"") + encode(events)[1:-1])
        f.write(b"]}")
        f.flush()
        os.fsync(f.fileno())  # on disk before anything is timed: its write-back would be charged to the first tool
    return {"events": len(meta) + copies * len(events), "bytes": out.stat().st_size}


PEAK = "hpc-bench-peak-bytes"
_PRELUDE = (
    "import atexit, sys\n"
    "def _peak():\n"
    "    kb = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    f"    sys.stderr.write('\\n{PEAK} %d\\n' % (int(kb) * 1024))\n"
    "atexit.register(_peak)\n"
)


def whole_process(code: str, argv: Sequence[str]) -> tuple[float, int] | str:
    """(wall seconds, peak resident bytes) of Python `code` run as a whole process with `argv`, or its
    last error line. The peak is the process's own high-water mark (VmHWM) as it exits, imports
    included: not getrusage's, which on Linux also counts what the parent held when it forked."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + code, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seconds = time.perf_counter() - start
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith(PEAK):
        said = [line for line in lines if not line.startswith(PEAK)]
        return (said or [f"exit {proc.returncode}"])[-1][:120]
    return seconds, int(lines[-1].split()[1])
