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
- per profiled step, the same breakdown over the events launched in that step, and the kernel calls
  and device time launched inside the steps (`kernel_calls_in_steps`, `cuda_time_in_steps_us`): the
  per-step figures. An event whose runtime call precedes every call in the trace (a lower correlation
  id) was launched before the window: in graph mode the device runs steps behind the host, so the
  window opens on a replay launched earlier (on an H200: 2,230 of a replay's kernels), which no
  recorded step owns;
- a CUDA graph's memcpy and memset nodes, which the driver runs as kernels (CUPTI names them
  `memcpy32_post`, `memset32`), count as the copies and sets they are, as an eager step's do;
- `collectives` (collective.py) and `top_kernels`.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any

import numpy as np

from analysis.measure.collective import Collectives
from analysis.measure.intervals import overlap_us, union_us
from analysis.measure.kernels import KERNEL_CLASSES, classify_kernel
from analysis.read.events import all_args, field, int_args, interned, pick
from analysis.records import DeviceTotals

COMPUTE = 0
COMMUNICATION = 1
MEMORY = 2
_NAME = attrgetter("name")
KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay default (30, in the trace's µs)
TOP_N = 10
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
_KERNEL = 0
_MEMCPY = 1
_MEMSET = 2
COPY_KERNEL = re.compile(r"mem(cpy|set)\d+(_\w+)?")  # a graph's memcpy/memset node, run as a kernel
CATEGORIES = {
    **dict.fromkeys(KERNEL_CATS, _KERNEL),
    **dict.fromkeys(MEMCPY_CATS, _MEMCPY),
    **dict.fromkeys(MEMSET_CATS, _MEMSET),
}  # the device events' sources


def temporal_breakdown(start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> dict[str, float] | None:
    """Computation, exposed communication, memory and idle over the span of the given events (µs)."""
    if start.size == 0:
        return None
    span = float(end.max() - start.min())
    busy = union_us(start, end)
    compute = union_us(start[kind == COMPUTE], end[kind == COMPUTE])
    compute_or_comm = union_us(start[kind <= COMMUNICATION], end[kind <= COMMUNICATION])
    return {
        "computation_us": compute,
        "communication_us": compute_or_comm - compute,
        "memory_us": busy - compute_or_comm,
        "idle_us": span - busy,
        "span_us": span,
    }


def idle_breakdown(start: np.ndarray, end: np.ndarray, stream: np.ndarray, launch: np.ndarray) -> dict[str, float]:
    """HTA's idle categories (host wait, kernel wait, other) on the stream with the most device time
    (the compute stream of a training step: other streams idle while it works, by design), in µs."""
    streams, inverse = np.unique(stream, return_inverse=True)
    busiest = streams[np.argmax(np.bincount(inverse, weights=end - start))]
    sel = stream == busiest
    order = np.argsort(start[sel], kind="stable")
    s = start[sel][order]
    e = end[sel][order]
    la = launch[sel][order]
    gap = s[1:] - e[:-1]
    host = la[1:] > e[:-1]  # launched after the stream went idle; a NaN launch (not found) is not
    kernel = ~host & (gap < KERNEL_WAIT_US)
    return {
        "stream": int(busiest),
        "host_wait_us": float(gap[host].sum()),
        "kernel_wait_us": float(gap[kernel].sum()),
        "other_us": float(gap[~host & ~kernel].sum()),
    }


class DeviceActivity:
    """Kernels, memcpys and memsets, one row of numbers each, a window at a time; see the module doc
    for what it computes."""

    def __init__(self) -> None:
        self._columns: list[tuple[np.ndarray, ...]] = []
        self.name_ids: dict[str, int] = {}  # kernel names, ids from 1 (0: a memcpy or memset)
        self._class_of: list[int] = [KERNEL_CLASSES.index("other")]  # by name id
        self._copy_of: list[int] = [_KERNEL]  # by name id: _MEMCPY or _MEMSET for a graph's copy node
        self.collectives = Collectives()

    def _name_id(self, name: str) -> int:
        self.name_ids[name] = len(self.name_ids) + 1
        self._class_of.append(KERNEL_CLASSES.index(classify_kernel(name)))
        copy = COPY_KERNEL.fullmatch(name)
        self._copy_of.append(_KERNEL if copy is None else _MEMCPY if copy.group(1) == "cpy" else _MEMSET)
        return len(self.name_ids)

    def add(self, events: list, ts: np.ndarray, dur: np.ndarray, source: np.ndarray) -> None:
        """A window's device events, with their start and duration (checked) and source (CATEGORIES[cat])."""
        kernels = np.flatnonzero(source == _KERNEL)
        names = np.zeros(len(events), dtype=np.int32)
        kernel_events, get = pick(events, kernels), self.name_ids.get
        names[kernels] = interned(
            [get(e.name) for e in kernel_events], kernel_events, _NAME, self.name_ids, self._name_id
        )
        source = np.where(source == _KERNEL, np.array(self._copy_of, dtype=source.dtype)[names], source)
        names[source != _KERNEL] = 0
        cls = np.array(self._class_of, dtype=np.int8)[names]
        communication = (source == _KERNEL) & (cls == KERNEL_CLASSES.index("communication"))
        kind = np.where(source != _KERNEL, MEMORY, np.where(communication, COMMUNICATION, COMPUTE)).astype(np.int8)
        args = all_args(events)
        stream, corr = int_args([a.stream for a in args]), int_args([a.correlation for a in args])
        graph = int_args([a.graph_id for a in args])
        comm = np.flatnonzero(communication)
        if comm.size:
            self.collectives.add(pick(args, comm), field(pick(events, comm), "name"), ts[comm], dur[comm])
        self._columns.append((ts, ts + dur, dur, source, kind, cls, stream, corr, names, graph))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        """(start, end, dur, source, kind, class, stream, correlation, name id, graph id), all rows in file order
        (the windows' columns joined once, when first asked for)."""
        if len(self._columns) > 1:
            self._columns = [tuple(np.concatenate(c) for c in zip(*self._columns, strict=False))]
        return self._columns[0]

    def time_by_correlation(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Device time per correlation id (what one runtime call launched), for operators' device time:
        (sorted ids, µs); None when no device event has one."""
        if not self._columns:
            return None
        start, end, *_, corr, _, _ = self._arrays()
        keep = corr >= 0
        if not keep.any():
            return None
        keys, inverse = np.unique(corr[keep], return_inverse=True)
        return keys, np.bincount(inverse, weights=(end - start)[keep], minlength=keys.size)

    def result(
        self,
        launches: Launches,
        step_ranges: list[tuple[float, float]],
        world_size: int | None,
        top_n: int | None = TOP_N,
    ) -> DeviceTotals:
        """The device figures (all None for a trace with no device activity: a CPU run); `top_n` kernels
        in top_kernels (None: all)."""
        if not self._columns:
            return DeviceTotals()
        start, end, dur, source, kind, cls, stream, corr, names, graph = self._arrays()
        launch = launches.lookup(corr)
        comm = (start[kind == COMMUNICATION], end[kind == COMMUNICATION])
        compute = (start[kind == COMPUTE], end[kind == COMPUTE])
        comm_us = union_us(*comm)
        kernel_us, memcpy_us, memset_us = (_sum_in_order(dur[source == s]) for s in (_KERNEL, _MEMCPY, _MEMSET))
        is_kernel = source == _KERNEL
        when = np.where(np.isnan(launch), start, launch)  # an event with no runtime call found: its own start
        in_steps = launched_in(when, step_ranges)
        by_class = np.bincount(cls[is_kernel], minlength=len(KERNEL_CLASSES))
        time_by_class = np.bincount(cls[is_kernel], weights=dur[is_kernel], minlength=len(KERNEL_CLASSES))
        return DeviceTotals(
            cuda_time_us=kernel_us + memcpy_us + memset_us,
            kernel_time_us=kernel_us,
            memcpy_time_us=memcpy_us,
            memset_time_us=memset_us,
            gpu_busy_us=union_us(start, end),
            kernel_calls=int((source == _KERNEL).sum()),
            kernel_calls_in_steps=None if in_steps is None else int((is_kernel & in_steps).sum()),
            cuda_time_in_steps_us=None if in_steps is None else _sum_in_order(dur[in_steps]),
            graph_kernel_calls=int(((source == _KERNEL) & (graph > 0)).sum()),
            kernel_calls_by_class=dict(zip(KERNEL_CLASSES, by_class.tolist(), strict=False)),
            kernel_time_by_class_us=dict(zip(KERNEL_CLASSES, time_by_class.tolist(), strict=False)),
            comm_time_us=comm_us,
            comm_overlap_pct=100.0 * overlap_us(comm, compute) / comm_us if comm_us else None,
            temporal_breakdown_us=temporal_breakdown(start, end, kind),
            idle_breakdown_us=idle_breakdown(start, end, stream, launch),
            steps_breakdown_us=self.per_step(start, end, kind, when, step_ranges),
            collectives=self.collectives.result(compute, world_size),
            collective_launch_us=self.collectives.launch_offsets(launches, step_ranges),
            top_kernels=self.top_kernels(start, end, names, top_n),
        )

    def per_step(
        self,
        start: np.ndarray,
        end: np.ndarray,
        kind: np.ndarray,
        when: np.ndarray,
        step_ranges: list[tuple[float, float]],
    ) -> list[dict[str, Any]] | None:
        """The temporal breakdown of the events launched in each profiled step (`when`: their runtime
        call's time; an event with no runtime call found, its own start)."""
        if not step_ranges:
            return None
        rows = []
        for i, (s0, s1) in enumerate(step_ranges):
            sel = (when >= s0) & (when < s1)
            rows.append({"step": i, **(temporal_breakdown(start[sel], end[sel], kind[sel]) or {})})
        return rows

    def top_kernels(
        self, start: np.ndarray, end: np.ndarray, names: np.ndarray, n: int | None = TOP_N
    ) -> list[dict[str, Any]]:
        """The n kernels (by name) with the most device time: calls, total time, share, class."""
        is_kernel = names > 0
        dur = end - start
        total = np.bincount(names[is_kernel], weights=dur[is_kernel], minlength=len(self.name_ids) + 1)[1:]
        calls = np.bincount(names[is_kernel], minlength=len(self.name_ids) + 1)[1:]
        by_id = {v - 1: k for k, v in self.name_ids.items()}
        all_device_us = float(dur.sum())
        return [
            {
                "name": by_id[i],
                "calls": int(calls[i]),
                "total_us": float(total[i]),
                "share_pct": 100.0 * float(total[i]) / all_device_us if all_device_us else None,
                "class": classify_kernel(by_id[i]),
            }
            for i in np.argsort(-total, kind="stable")[:n].tolist()
        ]


def _sum_in_order(values: np.ndarray) -> float:
    """The sum one addition at a time, in file order (np.sum's pairwise sum rounds differently)."""
    return float(np.cumsum(values)[-1]) if values.size else 0.0


def launched_in(when: np.ndarray, step_ranges: list[tuple[float, float]]) -> np.ndarray | None:
    """Which events were launched inside one of the steps (None: no steps in the trace)."""
    if not step_ranges:
        return None
    inside = np.zeros(when.size, dtype=bool)
    for s0, s1 in step_ranges:
        inside |= (when >= s0) & (when < s1)
    return inside


class Launches:
    """Runtime calls (cudaLaunchKernel, cudaMemcpyAsync ...) by correlation id: when each device event
    was asked for, on the CPU."""

    def __init__(self) -> None:
        self._corr: list[np.ndarray] = []
        self._ts: list[np.ndarray] = []
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # (ids, times) by id, built on first lookup

    def add(self, corr: np.ndarray, ts: np.ndarray) -> None:
        """Runtime calls' correlation ids (-1: none, dropped) and start times."""
        keep = corr >= 0
        self._corr.append(corr[keep])
        self._ts.append(ts[keep])
        self._sorted = None

    def lookup(self, corr: np.ndarray) -> np.ndarray:
        """The launch time of each correlation id; NaN where no runtime call has it, -inf where the id is
        below every runtime call's (ids grow with each call: it was launched before the trace began)."""
        if self._sorted is None:
            keys = np.concatenate(self._corr) if self._corr else np.empty(0, np.int64)
            order = np.argsort(keys, kind="stable")
            self._sorted = keys[order], (np.concatenate(self._ts) if self._ts else np.empty(0))[order]
        keys_sorted, ts_sorted = self._sorted
        out = np.full(corr.size, np.nan)
        if keys_sorted.size == 0 or corr.size == 0:
            return out
        pos = np.clip(np.searchsorted(keys_sorted, corr), 0, keys_sorted.size - 1)
        found = (keys_sorted[pos] == corr) & (corr >= 0)
        out[found] = ts_sorted[pos[found]]
        out[(corr >= 0) & (corr < keys_sorted[0])] = -np.inf
        return out
