"""The device timeline of one trace: kernels, memcpys and memsets, and what they say about a step.

`DeviceActivity` keeps one row per device event (start, end, kind, stream, correlation id, name id:
a few numbers, not the event) and, once the file is read, computes from those arrays:
- the totals (device time, busy time, kernel calls by class, communication and its overlap);
- `temporal_breakdown`: the time from the first device event's start to the last one's end, split
  into computation, communication, memory and idle. Computation is the union of compute kernels;
  communication the part of the communication kernels' union that no compute kernel covers
  (exposed communication); memory the part of the memcpy/memset union that neither covers; idle the
  rest. The four add up to the span. HTA's `get_temporal_breakdown` has the same idle and
  computation; its non-compute time is our communication + memory;
- `idle_breakdown`: HTA's `get_idle_time_breakdown` for the stream with the most device time: the
  gap before each event on it is host wait when the event was launched (its runtime call, by
  correlation id) after the previous event on the stream ended, else kernel wait when shorter than
  `KERNEL_WAIT_US`, else other;
- per profiled step, the same breakdown over the events launched in that step;
- `collectives` (collective.py) and `top_kernels`.
"""

from __future__ import annotations

from array import array
from collections import Counter

import numpy as np

from analysis.collective import Collectives
from analysis.intervals import overlap_us, union_us
from analysis.kernels import KERNEL_CLASSES, classify_kernel
from analysis.records import DeviceTotals

COMPUTE, COMMUNICATION, MEMORY = 0, 1, 2
KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay default (30, in the trace's µs)
TOP_N = 10


def _int_arg(args: dict, key: str) -> int:
    value = args.get(key)
    return value if type(value) is int and -(1 << 62) < value < 1 << 62 else -1


def temporal_breakdown(start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> dict[str, float] | None:
    """Computation, exposed communication, memory and idle over the span of the given events (µs)."""
    if start.size == 0:
        return None
    span = float(end.max() - start.min())
    busy = union_us(start, end)
    compute = union_us(start[kind == COMPUTE], end[kind == COMPUTE])
    compute_or_comm = union_us(start[kind <= COMMUNICATION], end[kind <= COMMUNICATION])
    return {"computation_us": compute, "communication_us": compute_or_comm - compute,
            "memory_us": busy - compute_or_comm, "idle_us": span - busy, "span_us": span}


def idle_breakdown(start: np.ndarray, end: np.ndarray, stream: np.ndarray, launch: np.ndarray) -> dict[str, float]:
    """HTA's idle categories (host wait, kernel wait, other) on the stream with the most device time
    (the compute stream of a training step: other streams idle while it works, by design), in µs."""
    streams, inverse = np.unique(stream, return_inverse=True)
    busiest = streams[np.argmax(np.bincount(inverse, weights=end - start))]
    sel = stream == busiest
    order = np.argsort(start[sel], kind="stable")
    s, e, la = start[sel][order], end[sel][order], launch[sel][order]
    gap = s[1:] - e[:-1]
    host = la[1:] > e[:-1]  # launched after the stream went idle; a NaN launch (not found) is not
    kernel = ~host & (gap < KERNEL_WAIT_US)
    return {"stream": int(busiest), "host_wait_us": float(gap[host].sum()), "kernel_wait_us": float(gap[kernel].sum()),
            "other_us": float(gap[~host & ~kernel].sum())}


class DeviceActivity:
    """Kernels, memcpys and memsets, one row of numbers each; see the module doc for what it computes."""

    def __init__(self) -> None:
        self.start, self.end = array("d"), array("d")
        self.kind = array("b")
        self.stream, self.corr, self.name = array("q"), array("q"), array("i")
        self.name_ids: dict[str, int] = {}
        self.kernel_classes: Counter = Counter({c: 0 for c in KERNEL_CLASSES})
        self.kernel_us = self.memcpy_us = self.memset_us = 0.0
        self.collectives = Collectives()

    def _row(self, args: dict, ts: float, dur: float, kind: int, name_id: int) -> None:
        self.start.append(ts)
        self.end.append(ts + dur)
        self.kind.append(kind)
        self.stream.append(_int_arg(args, "stream"))
        self.corr.append(_int_arg(args, "correlation"))
        self.name.append(name_id)

    def kernel(self, args: dict, ts: float, dur: float, name: str) -> None:
        self.kernel_us += dur
        cls = classify_kernel(name)
        self.kernel_classes[cls] += 1
        name_id = self.name_ids.setdefault(name, len(self.name_ids))
        self._row(args, ts, dur, COMMUNICATION if cls == "communication" else COMPUTE, name_id)
        if cls == "communication":
            self.collectives.add(args, name, ts, dur)

    def copy(self, args: dict, ts: float, dur: float, memset: bool) -> None:
        if memset:
            self.memset_us += dur
        else:
            self.memcpy_us += dur
        self._row(args, ts, dur, MEMORY, -1)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.frombuffer(self.start, dtype=np.float64), np.frombuffer(self.end, dtype=np.float64),
                np.frombuffer(self.kind, dtype=np.int8))

    def time_by_correlation(self) -> dict[int, float]:
        """Device time per correlation id (what one runtime call launched), for operators' device time."""
        start, end, _ = self.arrays()
        corr = np.frombuffer(self.corr, dtype=np.int64)
        keep = corr >= 0
        keys, inverse = np.unique(corr[keep], return_inverse=True)
        sums = np.bincount(inverse, weights=(end - start)[keep], minlength=keys.size)
        return dict(zip(keys.tolist(), sums.tolist()))

    def result(self, launches: "Launches", step_ranges: list[tuple[float, float]],
               world_size: int | None) -> DeviceTotals:
        """The device figures (all None for a trace with no device activity: a CPU run)."""
        if not self.start:
            return DeviceTotals()
        start, end, kind = self.arrays()
        launch = launches.lookup(np.frombuffer(self.corr, dtype=np.int64))
        comm = (start[kind == COMMUNICATION], end[kind == COMMUNICATION])
        compute = (start[kind == COMPUTE], end[kind == COMPUTE])
        comm_us = union_us(*comm)
        kernels = int((kind != MEMORY).sum())
        return DeviceTotals(
            cuda_time_us=self.kernel_us + self.memcpy_us + self.memset_us, kernel_time_us=self.kernel_us,
            memcpy_time_us=self.memcpy_us, memset_time_us=self.memset_us, gpu_busy_us=union_us(start, end),
            kernel_calls=kernels, kernel_calls_by_class=dict(self.kernel_classes), comm_time_us=comm_us,
            comm_overlap_pct=100.0 * overlap_us(comm, compute) / comm_us if comm_us else None,
            temporal_breakdown_us=temporal_breakdown(start, end, kind),
            idle_breakdown_us=idle_breakdown(start, end, np.frombuffer(self.stream, dtype=np.int64), launch),
            steps_breakdown_us=self.per_step(start, end, kind, launch, step_ranges),
            collectives=self.collectives.result(compute, world_size),
            collective_launch_us=self.collectives.launch_offsets(launches, step_ranges),
            top_kernels=self.top_kernels(start, end, kind))

    def per_step(self, start, end, kind, launch, step_ranges) -> list[dict] | None:
        """The temporal breakdown of the events launched in each profiled step (by their runtime call's
        time; an event with no runtime call found, by its own start)."""
        if not step_ranges:
            return None
        when = np.where(np.isnan(launch), start, launch)
        rows = []
        for i, (s0, s1) in enumerate(step_ranges):
            sel = (when >= s0) & (when < s1)
            rows.append({"step": i, **(temporal_breakdown(start[sel], end[sel], kind[sel]) or {})})
        return rows

    def top_kernels(self, start, end, kind, n: int = TOP_N) -> list[dict]:
        """The n kernels (by name) with the most device time: calls, total time, share, class."""
        is_kernel = kind != MEMORY
        names = np.frombuffer(self.name, dtype=np.int32)[is_kernel]
        dur = (end - start)[is_kernel]
        total = np.bincount(names, weights=dur, minlength=len(self.name_ids))
        calls = np.bincount(names, minlength=len(self.name_ids))
        by_id = {v: k for k, v in self.name_ids.items()}
        all_device_us = float((end - start).sum())
        return [{"name": by_id[i], "calls": int(calls[i]), "total_us": float(total[i]),
                 "share_pct": 100.0 * float(total[i]) / all_device_us if all_device_us else None,
                 "class": classify_kernel(by_id[i])}
                for i in np.argsort(-total, kind="stable")[:n].tolist()]


class Launches:
    """Runtime calls (cudaLaunchKernel, cudaMemcpyAsync ...) by correlation id: when each device event
    was asked for, on the CPU."""

    def __init__(self) -> None:
        self.corr, self.ts = array("q"), array("d")

    def add(self, args: dict, ts: float) -> int:
        """Keep the call's time under its correlation id; return the id (-1: none)."""
        corr = _int_arg(args, "correlation")
        if corr >= 0:
            self.corr.append(corr)
            self.ts.append(ts)
        return corr

    def lookup(self, corr: np.ndarray) -> np.ndarray:
        """The launch time of each correlation id; NaN where no runtime call has it."""
        keys = np.frombuffer(self.corr, dtype=np.int64)
        out = np.full(corr.size, np.nan)
        if keys.size == 0 or corr.size == 0:
            return out
        order = np.argsort(keys, kind="stable")
        keys_sorted, ts_sorted = keys[order], np.frombuffer(self.ts, dtype=np.float64)[order]
        pos = np.clip(np.searchsorted(keys_sorted, corr), 0, keys_sorted.size - 1)
        found = (keys_sorted[pos] == corr) & (corr >= 0)
        out[found] = ts_sorted[pos[found]]
        return out
