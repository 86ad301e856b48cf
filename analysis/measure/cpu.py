"""The CPU side of one trace: operators, their self times, the profiled steps, the runtime calls.

`CpuOps` takes a window's CPU events at a time and keeps a few numbers per event (start, end, name
id, thread id, correlation id), never the event. Once the file is read it computes, per thread, the
event tree as torch.autograd.profiler builds it, and from it each operator's self CPU time and self
device time, the operator calls as `key_averages()` counts them, and the CPU time (see trace.py's
module doc for the definitions).

The tree is built column-wise (`_nested_parents`) when a thread's events nest properly, which is what
the profiler writes; a thread whose events overlap without nesting takes torch's own stack walk
(`_stack_parents`), so both give torch's tree.
"""

from __future__ import annotations

import itertools
import re
from operator import attrgetter

import numpy as np

from analysis.measure.device import TOP_N, Launches
from analysis.measure.intervals import overlap_us, union_us
from analysis.read.events import all_args, field, int_args, interned, pick
from analysis.records import CpuTotals

OP_CATS = {"cpu_op", "Operator"}
ANNOTATION_CATS = {"user_annotation"}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
STEP_RE = re.compile(r"^ProfilerStep#\d+$")
DATALOADER_PREFIX = "enumerate(DataLoader)"  # the profiler's range around each DataLoader __next__
_NAME, _THREAD = attrgetter("name"), attrgetter("pid", "tid")
MAX_COMPRESSED_THREADS = 16  # more threads than this are grouped by a sort (see _grouped)

_OP = 0
_ANNOTATION = 1
_RUNTIME = 2
_OTHER = 3
CATEGORIES = {
    **dict.fromkeys(OP_CATS, _OP),
    **dict.fromkeys(ANNOTATION_CATS, _ANNOTATION),
    **dict.fromkeys(RUNTIME_CATS, _RUNTIME),
    "python_function": _OTHER,
}  # the CPU events' kinds


class CpuOps:
    """CPU-side events: per event its start, end, name id (< 0: an operator), thread and correlation id
    (runtime calls, for operators' device time); ProfilerStep#N ranges give the steps; runtime calls are
    also kept as `launches` (when each device event was asked for)."""

    def __init__(self) -> None:
        self.name_ids: dict[str, int] = {}  # ids from 1, so that -id marks an operator
        self.thread_ids: dict[tuple, int] = {}  # (pid, tid) -> id from 1, in order of appearance
        self._step_number: list[int] = [-1]  # by name id: N of ProfilerStep#N, -1 for other names
        self._columns: list[tuple[np.ndarray, ...]] = []
        self._thread_sorted = False  # the columns joined into one, sorted by thread (`_joined`)
        self.op_threads: set[int] = set()
        self.steps: list[tuple[float, float, int]] = []  # start, end, N of ProfilerStep#N, in file order
        self.launches = Launches()
        self._is_dataloader: list[bool] = [False]  # by name id: an `enumerate(DataLoader)...` range
        self._dataloader: list[tuple[np.ndarray, np.ndarray]] = []  # those ranges' starts and ends
        self._span = [np.inf, -np.inf]  # the CPU events' first start and last end
        self.runtime_us: float | None = None  # the runtime calls' time on the CPU (None: the trace has none)

    def _name_id(self, name: str) -> int:
        self.name_ids[name] = len(self.name_ids) + 1
        step = name.startswith("ProfilerStep#") and STEP_RE.match(name)
        self._step_number.append(int(name[13:]) if step else -1)
        self._is_dataloader.append(name.startswith(DATALOADER_PREFIX))
        return len(self.name_ids)

    def _thread_id(self, key: tuple) -> int:
        self.thread_ids[key] = len(self.thread_ids) + 1
        return len(self.thread_ids)

    def add(self, events: list, ts: np.ndarray, dur: np.ndarray, kind: np.ndarray) -> None:
        """A window's CPU events, with their start and duration (checked) and kind (CATEGORIES[cat])."""
        name_get, thread_get = self.name_ids.get, self.thread_ids.get  # one lookup per event; new keys after
        names = interned([name_get(e.name) for e in events], events, _NAME, self.name_ids, self._name_id)
        threads = interned(
            [thread_get((e.pid, e.tid)) for e in events], events, _THREAD, self.thread_ids, self._thread_id
        )
        end = ts + dur
        self._span = [min(self._span[0], float(ts.min())), max(self._span[1], float(end.max()))]
        loading = np.array(self._is_dataloader)[names] & (kind <= _ANNOTATION)
        if loading.any():
            self._dataloader.append((ts[loading], end[loading]))
        step_number = np.array(self._step_number)[names]
        is_step = (step_number >= 0) & (kind <= _ANNOTATION)  # 2021 traces: steps are operators
        is_op = (kind == _OP) & ~is_step
        for i in np.flatnonzero(is_step).tolist():
            self.steps.append((ts[i].item(), end[i].item(), int(step_number[i])))
        self.op_threads.update(threads[is_op].tolist())
        corr = np.full(len(events), -1, dtype=np.int64)
        runtime = np.flatnonzero(kind == _RUNTIME)
        if runtime.size:
            self.runtime_us = (self.runtime_us or 0.0) + float(dur[runtime].sum())
            corr[runtime] = int_args(field(all_args(pick(events, runtime)), "correlation"))
            self.launches.add(corr[runtime], ts[runtime])
        self._columns.append((ts, end, np.where(is_op, -names, names), threads, corr))
        self._thread_sorted = False

    def step_ranges(self) -> list[tuple[float, float]]:
        return [(s, e) for s, e, _ in sorted(self.steps)]

    def result(self, device_us: tuple[np.ndarray, np.ndarray] | None, top_n: int | None = TOP_N) -> CpuTotals:
        """`device_us`: device time per correlation id (sorted ids, their µs), None for a trace with no device;
        `top_n`: how many operators top_ops lists (None: all)."""
        threads = self._by_thread()
        cpu_time = sum(union_us(s, e) for t, (s, e, _, _) in threads.items() if t in self.op_threads)
        per_op = [_thread_operators(*columns, device_us) for columns in threads.values()]
        ops = _operator_totals(per_op, {v: k for k, v in self.name_ids.items()})
        steps = sorted(self.steps)
        durations = [e - s for s, e, _ in steps]
        in_file_order = sum(e - s for s, e, _ in self.steps)  # the mean's sum as it always was: stays bit-identical
        return CpuTotals(
            steps=len(steps),
            step_time_us_mean=in_file_order / len(steps) if steps else None,
            cpu_time_us=cpu_time,
            op_calls={k: v[0] for k, v in ops.items()},
            top_ops=top_operators(ops, by_device=device_us is not None, n=top_n),
            runtime_us=self.runtime_us,
            step_time_us=durations,
            step_numbers=[n for _, _, n in steps],
            dataloader_us=self._dataloader_in_steps(steps),
            dataloader_step_us=self._dataloader_each_step(steps),
            cpu_span_us=self._span[1] - self._span[0] if self._columns else None,
        )

    def _dataloader_in_steps(self, steps: list[tuple[float, float, int]]) -> float | None:
        """The DataLoader ranges' time, inside the profiled steps where there are steps (a step's data
        is fetched within it), else all of it; None when the trace has no DataLoader."""
        if not self._dataloader:
            return None
        loading = tuple(np.concatenate(c) for c in zip(*self._dataloader, strict=True))
        if not steps:
            return union_us(*loading)
        in_steps = (np.array([s for s, _, _ in steps]), np.array([e for _, e, _ in steps]))
        return overlap_us((loading[0], loading[1]), in_steps)

    def _dataloader_each_step(self, steps: list[tuple[float, float, int]]) -> list[float] | None:
        """The DataLoader ranges' time inside each profiled step, in step order (None: no DataLoader, or no
        steps): the verdict asks whether data loading holds up most steps or one (analysis/explain/verdict.py)."""
        if not self._dataloader or not steps:
            return None
        loading = tuple(np.concatenate(c) for c in zip(*self._dataloader, strict=True))
        return [overlap_us((loading[0], loading[1]), (np.array([s]), np.array([e]))) for s, e, _ in steps]

    def _by_thread(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(starts, ends, signed name ids, correlation ids) per thread id, each in file order: views of the
        columns joined and sorted by thread once (`_joined`)."""
        if not self._columns:
            return {}
        ts, end, names, threads, corr = self._joined()
        bounds = [0, *(np.flatnonzero(np.diff(threads)) + 1).tolist(), threads.size]
        return {int(threads[a]): (ts[a:b], end[a:b], names[a:b], corr[a:b]) for a, b in itertools.pairwise(bounds)}

    def _joined(self) -> tuple[np.ndarray, ...]:
        """The windows' columns (start, end, signed name id, thread, correlation id) joined, sorted by thread
        (stably: file order within a thread), kept so. Memory: a column's window pieces are let go as soon
        as it is joined, and each column is reordered alone, so the columns are never held twice."""
        if not self._thread_sorted:
            pieces = [list(c) for c in zip(*self._columns, strict=True)]
            self._columns.clear()
            joined = []
            for k in range(len(pieces)):
                joined.append(np.concatenate(pieces[k]))
                pieces[k] = []
            self._columns.append(tuple(_grouped(joined)))
            self._thread_sorted = True
        return self._columns[0]


def _grouped(columns: list[np.ndarray]) -> list[np.ndarray]:
    """The columns reordered by thread (the 4th column), stably, each column alone. A trace has a few
    threads: one sequential compress per thread beats a sort's random gather; many threads take the sort."""
    threads = columns[3]
    ids = np.unique(threads)
    if ids.size > MAX_COMPRESSED_THREADS:
        order = np.argsort(threads, kind="stable")
        return [c[order] for c in columns]
    masks = [threads == t for t in ids.tolist()]
    bounds = np.cumsum([0, *(int(m.sum()) for m in masks)])
    for k, column in enumerate(columns):
        out = np.empty_like(column)
        for mask, a, b in zip(masks, bounds[:-1], bounds[1:], strict=True):
            np.compress(mask, column, out=out[a:b])
        columns[k] = out
    return columns


def _operator_totals(per_thread: list[tuple[np.ndarray, ...]], names_by_id: dict[int, str]) -> dict[str, list]:
    """name -> [calls, self CPU µs, self device µs], summed over threads in thread order (names in
    order of first call)."""
    if not per_thread:
        return {}
    ids, cpu_us, dev_us = (np.concatenate(c) for c in zip(*per_thread, strict=False))
    if ids.size == 0:
        return {}
    calls = np.bincount(ids)
    cpu_sum, dev_sum = np.bincount(ids, weights=cpu_us), np.bincount(ids, weights=dev_us)
    unique, first = np.unique(ids, return_index=True)
    return {
        names_by_id[i]: [int(calls[i]), float(cpu_sum[i]), float(dev_sum[i])]
        for i in unique[np.argsort(first)].tolist()
    }


def top_operators(ops: dict[str, list], by_device: bool, n: int | None = TOP_N) -> list[dict]:
    """The n operators with the most self device time (self CPU time on a trace with no device)."""
    key = 2 if by_device else 1
    top = sorted(ops.items(), key=lambda kv: (-kv[1][key], kv[0]))[:n]
    return [
        {"name": name, "calls": calls, "self_cpu_us": cpu_us, "self_device_us": dev_us if by_device else None}
        for name, (calls, cpu_us, dev_us) in top
    ]


def _thread_operators(
    starts: np.ndarray,
    ends: np.ndarray,
    ids: np.ndarray,
    corrs: np.ndarray,
    device_us: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, ...]:
    """(name id, self CPU µs, self device µs) of each operator call on one thread, calls counted as
    key_averages() counts them. Self CPU time: the call's duration less its children's; self device
    time: the device time of the runtime calls (by correlation id) whose innermost enclosing operator
    it is."""
    if not (ids < 0).any():
        return np.empty(0, np.int32), np.empty(0), np.empty(0)
    order = np.lexsort((-ends, starts))  # torch's order: by start, the longest first
    s, e = starts[order], ends[order]
    parent = _nested_parents(s, e)
    if parent is None:
        parent = _stack_parents(s, e)
    dur = e - s
    del s, e  # each temporary let go when used (a thread may hold a million events)
    signed, corr = ids[order], corrs[order]
    del order
    name = np.abs(signed)
    deleted = _merged_only_children(parent, name)
    kept_op = (signed < 0) & ~deleted
    del signed
    final_parent = _nearest(parent, ~deleted)  # a merged event's children are its parent's
    child = (final_parent >= 0) & ~deleted
    del deleted
    self_us = dur - np.bincount(final_parent[child], weights=dur[child], minlength=dur.size)
    del final_parent, child, dur
    if device_us is None:
        return name[kept_op], self_us[kept_op], np.zeros(int(kept_op.sum()))
    return name[kept_op], self_us[kept_op], _device_by_operator(corr, parent, kept_op, device_us)[kept_op]


def _device_by_operator(
    corr: np.ndarray, parent: np.ndarray, kept_op: np.ndarray, device_us: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per event, the device time of the runtime calls whose innermost enclosing kept operator it is."""
    keys, sums = device_us
    launched = np.flatnonzero(corr >= 0)
    out = np.zeros(corr.size)
    if launched.size == 0 or keys.size == 0:
        return out
    pos = np.clip(np.searchsorted(keys, corr[launched]), 0, keys.size - 1)
    us = np.where(keys[pos] == corr[launched], sums[pos], 0.0)
    owner = _nearest(parent, kept_op)[launched]
    take = (us != 0) & (owner >= 0)
    return np.bincount(owner[take], weights=us[take], minlength=corr.size)


def _nearest(parent: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Per event, its nearest strict ancestor that is `wanted` (-1: none), by walking up all events at once."""
    up = parent.copy()
    climbing = (up >= 0) & ~wanted[np.maximum(up, 0)]
    while climbing.any():
        up[climbing] = parent[up[climbing]]
        climbing = (up >= 0) & ~wanted[np.maximum(up, 0)]
    return up


def _merged_only_children(parent: np.ndarray, name: np.ndarray) -> np.ndarray:
    """torch's merge of an event into its parent when it is the parent's only child and has the same name
    (EventList._remove_dup_nodes, repeated until nothing changes): the merged (deleted) events. Repeating
    merges chains of such events into their top one, which is the same as deleting every event that is its
    original parent's only child and shares its name."""
    has_parent = parent >= 0
    n_children = np.bincount(parent[has_parent], minlength=parent.size)
    p = np.maximum(parent, 0)
    return has_parent & (name == name[p]) & (n_children[p] == 1)


def _nested_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """The parent of each event (sorted by start, longest first) when the thread's events nest properly:
    the latest earlier event still open at its start. Computed column-wise: an event's depth is the
    number of earlier events still open, and its parent is the latest earlier event one level up. The
    result is checked (each parent found and enclosing its child); None when it fails, which happens
    exactly when two events overlap without nesting, and for an event that ends before it starts (then
    `_stack_parents` decides, as torch does)."""
    n = s.size
    if n == 0 or (e < s).any():
        return None if n else np.empty(0, np.int64)
    # Written for memory, a trace's main thread being a million events: each temporary let go when used.
    # zero_from[i]: the zero-length events from i on; those at an event's own start, sorted after it, are
    # not earlier than it, so they do not close before it.
    zero_from = np.zeros(n + 1, np.int64)
    zero_from[:n] = np.cumsum((e == s)[::-1])[::-1]
    run_end = np.append(np.flatnonzero(np.diff(s)) + 1, n)  # s is sorted: where each run of equal starts ends
    depth = np.searchsorted(np.sort(e), s, side="right")  # the events that end at or before this start ...
    depth -= zero_from[:n]
    depth += np.repeat(zero_from[run_end], np.diff(run_end, prepend=0))  # ... less those not earlier
    del zero_from, run_end
    np.subtract(np.arange(n), depth, out=depth)  # the earlier events still open: the depth
    key = depth * (n + 1)  # (depth, index) as one number
    key += np.arange(n)
    # The events by key: a stable sort by depth, a radix sort when depths fit 16 bits (they always do).
    by_key = np.argsort(
        depth.astype(np.int16) if -(1 << 15) <= depth.min() <= depth.max() < 1 << 15 else depth, kind="stable"
    )
    key_sorted = key[by_key]
    del key
    # The latest event one level up, before this one. Asked in key order, the needles are sorted, and the
    # search walks the array once: asked in event order it jumped between depths (8x the time).
    pos = np.empty(n, np.int64)
    pos[by_key] = np.searchsorted(key_sorted, key_sorted - (n + 1))
    del by_key
    pos -= 1
    found = key_sorted[np.maximum(pos, 0)]
    del key_sorted
    ok = pos >= 0
    del pos
    ok &= found // (n + 1) == depth - 1
    parent = found % (n + 1)
    del found
    inner = depth > 0
    parent[~inner] = -1
    p = np.maximum(parent, 0)
    if not np.all(~inner | (ok & (e[p] > s) & (e <= e[p]))):
        return None
    return parent


def _stack_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """torch.autograd.profiler's tree walk over events sorted by start, longest first: a parent is the
    innermost open event that contains the child; an open event is closed (popped) when the next event
    starts at or after its end, or ends after it."""
    parent = [-1] * s.size
    stack: list[int] = []
    s_list, e_list = s.tolist(), e.tolist()
    for i in range(s.size):
        while stack:
            top = stack[-1]
            if s_list[i] >= e_list[top] or e_list[i] > e_list[top]:
                stack.pop()
            else:
                parent[i] = top
                break
        stack.append(i)
    return np.array(parent, dtype=np.int64)
