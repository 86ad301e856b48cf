"""One Chrome/Kineto trace (PyTorch profiler) -> the study's numbers, streaming, no torch import.

Three pieces, as in HolisticTraceAnalysis: reading (read/reader.py, read/events.py: the file's events a
window at a time as typed structs, the file's problems as TraceError), per-concern accumulators (`cpu.CpuOps`,
`device.DeviceActivity`, `memory.DeviceMemory`, each fed a window's events it cares about, column-wise),
and the record (`trace_record`, a `records.TraceRecord`).

A trace never sits in memory as Python objects the way `json.load` holds it: a window's events are
turned into columns of numbers (start, end, name id, thread, correlation id ...) and dropped, and the
figures are computed from the columns with numpy. Both trace schemas are read: PyTorch >= 1.10
lower-case categories (`cpu_op`, `user_annotation`, `cuda_runtime`, `kernel`, `gpu_memcpy`,
`gpu_memset`) and the 2021 capitalised ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`).

Definitions (what a record's keys mean):
- cpu_time_us: self CPU time summed over all CPU events, as `prof.key_averages()` totals it. Self times
  of properly nested events add up to the time covered by their roots, so this is the union of the
  CPU-side intervals on every thread that runs operators. Threads with no operator (gloo's
  `pt_gloo_runloop`) are left out: their events are async, and key_averages counts async events as 0.
- cuda_time_us: summed durations of kernels, memcpys and memsets (device time, overlaps counted twice).
- gpu_busy_us: the union of those device intervals (time the GPU had anything running).
- kernel_calls / kernel_calls_by_class: kernel events, classed by name.
- op_calls: CPU operator calls per name (aten::conv2d ...), counted as key_averages() counts them:
  torch's profiler merges an event into its parent when it is the parent's only child and has the
  same name (a redispatch, e.g. aten::div_ inside aten::div_), so such a pair is one call here too.
- peak_gpu_mem_bytes / peak_gpu_reserved_bytes: max `Total Allocated` / `Total Reserved` of the
  `[memory]` events on CUDA devices (max over devices). Traces with `Bytes` only (2021): the running
  sum from the window's start, flagged by gpu_mem_relative_to_window = true.
- comm_time_us: NCCL kernel time; comm_overlap_pct: the share of it that overlaps compute kernels.
Values a trace cannot give are None, never guessed.
"""

from __future__ import annotations

import contextlib
import gc
import re
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from analysis.measure import cpu, device
from analysis.measure.cpu import CpuOps
from analysis.measure.device import TOP_N, DeviceActivity
from analysis.measure.memory import DeviceMemory
from analysis.read.events import INSTANT, NOT_READ, Batch, out_of_range, pick
from analysis.read.reader import Reader, TraceError, read_batches
from analysis.records import CpuTotals, DeviceTotals, MemoryPeaks, TraceRecord, in_steps, per_step

__all__ = ["TraceError", "measure_trace", "trace_record"]

RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# What becomes of an event: skipped, a memory event, or an X event (>= _OTHER) that is not read, or read
# by CpuOps or DeviceActivity: their base plus the event's kind there, so that the category is looked up once.
_SKIP = 0
_MEMORY = 1
_OTHER = 2
_CPU = 10
_DEVICE = 20
_TIMES = attrgetter("ts", "dur")
_ROUTE: dict[object, int] = {
    **{c: _CPU + k for c, k in cpu.CATEGORIES.items()},
    **{c: _DEVICE + k for c, k in device.CATEGORIES.items()},
    INSTANT: _MEMORY,
    NOT_READ: _SKIP,
}


def _count(value: Any) -> int | None:
    """A rank or world size from trace metadata, if it is a sane non-negative integer."""
    return int(value) if type(value) in (int, float) and 0 <= value < 1 << 20 and value == int(value) else None


def _route(batch: Batch, cpu_ops: CpuOps, device_activity: DeviceActivity, memory: DeviceMemory) -> tuple[int, int]:
    """Give a window's events to the accumulators, each its own events in file order with their times as
    arrays; returns (how many events had an out-of-range time or size: skipped, counted as bad; how many
    an accumulator took)."""
    events, get = batch.events, _ROUTE.get
    # The per-event passes are the analysis's main Python cost: one over every event routes it by
    # category; each accumulator's events are then picked once, and their times read once.
    code = np.array([get(e.cat, _OTHER) for e in events], dtype=np.int8)
    memory_events = [e for e in pick(events, np.flatnonzero(code == _MEMORY)) if e.name == "[memory]"]
    bad = memory.add(memory_events)
    taken = len(memory_events) - bad
    for low, high, accumulator in (
        (_CPU, _DEVICE, cpu_ops),
        (_DEVICE, _DEVICE + 10, device_activity),
        (_OTHER, _CPU, None),
    ):
        idx = np.flatnonzero((code >= low) & (code < high))
        if not idx.size:
            continue
        mine = pick(events, idx)
        times = np.fromiter(chain.from_iterable(map(_TIMES, mine)), np.float64, 2 * len(mine))  # one pass
        ts, dur = times[0::2].copy(), times[1::2].copy()  # NaN ts: no time, not read. Copies: a view kept
        # in an accumulator's columns would keep the whole window's times alive
        garbage = out_of_range(ts) | out_of_range(dur)
        bad += int(garbage.sum())
        sane = np.flatnonzero(~np.isnan(ts) & ~garbage)
        if accumulator is not None and sane.size:
            if sane.size < len(mine):
                mine = pick(mine, sane)
                ts = ts[sane]
                dur = dur[sane]
                idx = idx[sane]
            accumulator.add(mine, ts, dur, code[idx] - low)
            taken += len(mine)
    return bad, taken


def measure_trace(path: str | Path, top_n: int | None = TOP_N) -> TraceRecord:
    """The per-trace record (see the module doc), with `top_n` kernels and operators in its top lists
    (None: every one, for a comparison), not yet judged (analysis/pipeline.py attaches its verdict).
    Raises TraceError when the file is unusable."""
    path = Path(path)
    cpu_ops = CpuOps()
    device_activity = DeviceActivity()
    memory = DeviceMemory()
    n_events = bad_events = taken = 0
    reader = Reader()
    with _collector_paused():
        for batch in read_batches(path, reader):
            n_events += batch.n_events
            bad, used = _route(batch, cpu_ops, device_activity, memory)
            bad_events += batch.bad + bad
            taken += used
        if not taken:  # nothing measured: an empty record would read as a run that did nothing
            raise TraceError(
                f"no event to analyse: traceEvents holds {n_events} item(s), none an operator, kernel, "
                "memcpy/memset or memory event with usable fields"
            )
        info = reader.meta.get("distributedInfo")
        info = info if isinstance(info, dict) else {}
        steps, world_size = cpu_ops.step_ranges(), _count(info.get("world_size"))
        device_totals = device_activity.result(cpu_ops.launches, steps, world_size, top_n)
        cpu_totals = cpu_ops.result(device_activity.time_by_correlation(), top_n)
    return trace_record(path, reader.meta, n_events, bad_events, cpu_totals, device_totals, memory.result())


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while a trace is read: each window allocates hundreds of thousands of
    objects (lists, tuples, strings) that hold no cycles and die with the window, and the collector's
    passes over them cost a sixth of the analysis. Back on afterwards, if it was on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def trace_record(
    path: Path, meta: dict, n_events: int, bad_events: int, cpu: CpuTotals, device: DeviceTotals, memory: MemoryPeaks
) -> TraceRecord:
    """The accumulators' results as one record, with the rank and per-step values."""
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = _count(info.get("rank"))
    if rank is None:
        m = RANK_RE.search(path.name)
        rank = int(m.group(1)) if m and len(m.group(1)) < 10 else None
    devices = meta.get("deviceProperties")
    first = devices[0] if isinstance(devices, list) and devices and isinstance(devices[0], dict) else {}
    return TraceRecord(
        file=str(path),
        device_name=first.get("name") if isinstance(first.get("name"), str) else None,
        rank=rank,
        world_size=_count(info.get("world_size")),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        events=n_events,
        bad_events=bad_events,
        **vars(cpu),
        **vars(device),
        **vars(memory),
        cpu_time_us_per_step=per_step(cpu.cpu_time_us, cpu.steps),
        # what the steps launched, not what the window holds: in graph mode the device runs behind the host
        cuda_time_us_per_step=per_step(in_steps(device.cuda_time_in_steps_us, device.cuda_time_us), cpu.steps),
        kernel_calls_per_step=per_step(in_steps(device.kernel_calls_in_steps, device.kernel_calls), cpu.steps),
        comm_time_us_per_step=per_step(device.comm_time_us, cpu.steps),
    )
