"""Collectives from their NCCL kernels: calls, time, message size, bandwidth, overlap, launch times.

PyTorch 2.x writes each collective's metadata on its NCCL kernel (`Collective name`, `In msg nelems`,
`Out msg nelems`, `dtype`, `Group size`); older traces have the kernel name only
(`ncclKernel_AllReduce_RING_LL_Sum_float`), so the kind comes from it and the size is unknown.

Bandwidth as nccl-tests defines it (NCCL's doc/PERFORMANCE.md): the size S of a call is its larger
message (all_reduce and broadcast: the buffer; all_gather: the gathered output; reduce_scatter: the
input), algorithm bandwidth = S / time, bus bandwidth = algorithm bandwidth x (2(n-1)/n for
all_reduce; (n-1)/n for all_gather, reduce_scatter, all_to_all; 1 for broadcast, reduce, send/recv),
n the group size. Per kind: S summed over calls / time summed over calls. Time is the kernel's
duration, which includes waiting for the slowest peer: a straggler lowers everyone's bandwidth.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from analysis.measure.intervals import overlap_us, union_us
from analysis.read.events import int_args

_KIND_BY_NAME = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send_recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
_KERNEL_KIND_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "short": 2,
    "int16": 2,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "bool": 1,
    "complexfloat": 8,
    "complexdouble": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


@functools.lru_cache(maxsize=4096)  # a handful of (name, kernel) pairs repeat thousands of times
def collective_kind(name: str | None, kernel_name: str) -> str:
    """all_reduce, all_gather, ...: from the kernel's `Collective name` arg, else from its name."""
    if not name:
        m = _KERNEL_KIND_RE.search(kernel_name)
        name = m.group(1) if m else ""
    key = re.sub(r"[^a-z]", "", name.lower())
    return _KIND_BY_NAME.get(key, key[:40] or "unknown")


def message_bytes(args: Any) -> float:
    """S of the call (see the module doc), NaN when the trace does not record the size or type."""
    counts = [c for c in (args.in_nelems, args.out_nelems) if type(c) is int and 0 <= c < 1 << 50]
    dtype = args.dtype
    size = DTYPE_BYTES.get(dtype.lower()) if isinstance(dtype, str) else None
    return float(max(counts) * size) if counts and size else float("nan")


class Collectives:
    """One row per communication kernel: kind, start, end, bytes, group size, correlation id."""

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}
        self._columns: list[tuple[np.ndarray, ...]] = []  # per window: kind, group, corr, start, end, bytes

    def add(self, args: list, kernel_names: list[str], ts: np.ndarray, dur: np.ndarray) -> None:
        """A window's communication kernels: their events.Args, names, starts and durations."""
        kinds = [
            collective_kind(a.collective if isinstance(a.collective, str) else None, name)
            for a, name in zip(args, kernel_names, strict=False)
        ]
        self._columns.append(
            (
                np.array([self.kinds.setdefault(k, len(self.kinds)) for k in kinds], dtype=np.int32),
                np.array(
                    [g if type(g) is int and 0 < g < 1 << 20 else -1 for g in (a.group_size for a in args)],
                    dtype=np.int64,
                ),
                int_args([a.correlation for a in args]),
                ts,
                ts + dur,
                np.array([message_bytes(a) for a in args]),
            )
        )

    def result(self, compute: tuple[np.ndarray, np.ndarray], world_size: int | None) -> list[dict]:
        """One row per kind, most time first (see the module doc for the bandwidth definitions)."""
        if not self._columns:
            return []
        kind, group, _, start, end, nbytes = (np.concatenate(c) for c in zip(*self._columns, strict=False))
        rows = []
        for name, k in self.kinds.items():
            sel = kind == k
            time_us = float((end[sel] - start[sel]).sum())
            sized = sel & ~np.isnan(nbytes)
            n = int(group[sel].max()) if (group[sel] > 0).any() else world_size
            algbw = (
                float(nbytes[sized].sum()) / float((end[sized] - start[sized]).sum()) / 1e3
                if sized.any() and (end[sized] - start[sized]).sum() > 0
                else None
            )  # bytes/µs / 1e3 = GB/s
            factor = BUS_FACTOR.get(name)
            busbw = algbw * factor(n) if algbw is not None and factor and n and n > 0 else None
            own = (start[sel], end[sel])
            own_us = union_us(*own)
            rows.append(
                {
                    "kind": name,
                    "calls": int(sel.sum()),
                    "time_us": time_us,
                    "mean_us": time_us / int(sel.sum()),
                    "bytes_per_call": float(nbytes[sized].mean()) if sized.any() else None,
                    "group_size": n,
                    "algbw_GBps": algbw,
                    "busbw_GBps": busbw,
                    "overlap_pct": 100.0 * overlap_us(own, compute) / own_us if own_us else None,
                }
            )
        return sorted(rows, key=lambda r: -r["time_us"])

    def launch_offsets(self, launches: Any, step_ranges: list[tuple[float, float]]) -> list[list[float]] | None:
        """Per profiled step, when each collective was launched (its runtime call), in µs from the
        step's start, in launch order: what the run compares across ranks to find the last to arrive."""
        if not step_ranges or not self._columns:
            return None
        launch = launches.lookup(np.concatenate([c[2] for c in self._columns]))
        launch = np.sort(launch[~np.isnan(launch)])
        return [[round(float(t - s0), 3) for t in launch[(launch >= s0) & (launch < s1)]] for s0, s1 in step_ranges]
