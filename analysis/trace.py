"""One Chrome/Kineto trace (PyTorch profiler) -> the study's numbers, streaming, no torch import.

Three pieces, as in HolisticTraceAnalysis: reading (`_Reader`, `read_events`: the file's events one at
a time, the file's problems as TraceError), per-concern accumulators (`CpuOps`, `DeviceActivity`,
`DeviceMemory`, each fed the events it cares about), and the record (`trace_record`, a
`records.TraceRecord`).

Events are read one at a time (see _Reader), so a trace never sits in memory as Python objects the
way `json.load` holds it; what is kept per event is a pair of floats (for interval unions), a name
id and counters. Both trace schemas are read: PyTorch >= 1.10 lower-case
categories (`cpu_op`, `user_annotation`, `cuda_runtime`, `kernel`, `gpu_memcpy`, `gpu_memset`) and
the 2021 capitalised ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`).

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

import gzip
import json
import re
import zlib
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analysis.device import TOP_N, DeviceActivity, Launches
from analysis.intervals import union_us
from analysis.records import CpuTotals, DeviceTotals, MemoryPeaks, TraceRecord, per_step

CPU_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function",
            "Operator", "Runtime"}
OP_CATS = {"cpu_op", "Operator"}
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
STEP_CATS = {"user_annotation", "Operator", "cpu_op"}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
STEP_RE = re.compile(r"^ProfilerStep#\d+$")
RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
CUDA_DEVICE_TYPES = {1, "1", "cuda", "CUDA"}

_NUMBER = (int, float)  # exact types: bool is not a number here
_ID = (int, str, type(None))  # pid, tid, device ids: hashable scalars
_BIG = 1e300  # beyond it (or NaN) a number is garbage; JSON's 1e999 decodes to inf


def _count(value: Any) -> int | None:
    """A rank or world size from trace metadata, if it is a sane non-negative integer."""
    return int(value) if type(value) in _NUMBER and 0 <= value < 1 << 20 and value == int(value) else None


class TraceError(ValueError):
    """The file cannot be analysed; str() says why (truncated, not a trace, ...)."""


class Event(msgspec.Struct):
    """The fields of a trace event the analysis reads. Decoded by msgspec straight from the text, so
    the many fields and args of an event cost nothing until asked for: `args` stays raw JSON until an
    accumulator needs it (`event_args`). Types are checked by the analysis, not the decoder (Any),
    so a mistyped event is counted and skipped rather than losing its window."""
    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw(b"null")


_EVENTS = msgspec.json.Decoder(list[Event])


def event_args(e: Event) -> dict:
    """The event's args as a mapping ({} when absent); None when they are not a mapping."""
    try:
        args = msgspec.json.decode(e.args)
    except msgspec.DecodeError:
        return None
    return {} if args is None else (args if isinstance(args, dict) else None)


def as_event(value: Any) -> Event | Any:
    """A decoded event (the one-at-a-time path) as an Event; a value that is not an object stays as it is."""
    if not isinstance(value, dict):
        return value
    args = value.get("args")
    try:
        raw = msgspec.Raw(msgspec.json.encode(args))
    except (TypeError, OverflowError, msgspec.EncodeError):
        raw = msgspec.Raw(b"[]")  # unencodable (NaN, huge ints): not a mapping, so the event is counted bad
    return Event(**{k: value.get(k, default) for k, default in _EVENT_DEFAULTS}, args=raw)


_EVENT_DEFAULTS = [(f, getattr(Event(), f)) for f in Event.__struct_fields__ if f != "args"]


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _thread_tree(starts: np.ndarray, ends: np.ndarray, ids: np.ndarray):
    """One thread's event tree as torch.autograd.profiler builds it (events sorted by start, then
    longest first; a parent is the innermost open event that contains the child), after torch's merge
    of same-name only children (EventList._remove_dup_nodes, repeated until nothing changes).
    Returns (order, parent, children, deleted), indexed by position in `order`."""
    order = np.lexsort((-ends, starts))
    n = len(order)
    parent = [-1] * n
    children: list[list[int]] = [[] for _ in range(n)]
    stack: list[int] = []
    s_sorted, e_sorted = starts[order].tolist(), ends[order].tolist()
    for i in range(n):
        while stack:
            top = stack[-1]
            if s_sorted[i] >= e_sorted[top] or e_sorted[i] > e_sorted[top]:
                stack.pop()
            else:
                parent[i] = top
                children[top].append(i)
                break
        stack.append(i)
    name = np.abs(ids[order]).tolist()
    deleted = [False] * n
    changed = True
    while changed:
        changed = False
        for i in range(n):
            p = parent[i]
            if deleted[i] or p < 0 or name[p] != name[i] or len(children[p]) != 1:
                continue
            children[p] = children[i]
            for c in children[i]:
                parent[c] = p
            deleted[i] = True
            changed = True
    return order, parent, children, deleted


def _thread_operators(pairs: array, names: array, corrs: array,
                      device_us_by_corr: dict[int, float]) -> list[tuple[int, float, float]]:
    """(name id, self CPU µs, self device µs) of each operator call on one thread, calls counted as
    key_averages() counts them (see _thread_tree). Self CPU time: the call's duration less its
    children's; self device time: the device time of the runtime calls (by correlation id) whose
    innermost enclosing operator it is."""
    flat = np.frombuffer(pairs, dtype=np.float64)
    starts, ends = flat[0::2], flat[1::2]
    ids = np.frombuffer(names, dtype=np.int32)
    if not (ids < 0).any():
        return []
    order, parent, children, deleted = _thread_tree(starts, ends, ids)
    dur = (ends - starts)[order].tolist()
    is_op = (ids[order] < 0).tolist()
    device = [0.0] * len(order)
    corr_sorted = np.frombuffer(corrs, dtype=np.int64)[order]
    if device_us_by_corr:
        for i in np.flatnonzero(corr_sorted >= 0).tolist():
            us = device_us_by_corr.get(int(corr_sorted[i]))
            p = parent[i]
            while us and p >= 0 and not (is_op[p] and not deleted[p]):
                p = parent[p]
            if us and p >= 0:
                device[p] += us
    name = np.abs(ids[order]).tolist()
    return [(name[i], dur[i] - sum(dur[c] for c in children[i]), device[i])
            for i in range(len(order)) if is_op[i] and not deleted[i]]


class _Truncated(Exception):
    pass


class _Reader:
    """Stream a Chrome trace's top-level object: every top-level value but `traceEvents` is decoded
    whole (they are small: metadata), the events one at a time.

    Written here rather than taken from a streaming-JSON library because measured on the real traces
    it is faster: each event is decoded by the standard library's C scanner (JSONDecoder.raw_decode)
    on a sliding text window, where ijson's yajl backend spent most of the analysis time tokenising.
    Memory is the window (1 MiB chunks) plus one event.
    """

    _WS = " \t\n\r"

    def __init__(self, stream, chunk: int = 1 << 20):
        import codecs

        self.stream = stream
        self.chunk = chunk
        self.text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoder = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.meta: dict = {}
        self.saw_events = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        data = self.stream.read(self.chunk)
        if self.pos > (1 << 16):  # drop what has been consumed
            self.buf = self.buf[self.pos:]
            self.pos = 0
        if not data:
            self.eof = True
            self.buf += self.text_decoder.decode(b"", final=True)
            return False
        self.buf += self.text_decoder.decode(data)
        return True

    def _peek(self) -> str:
        """The next non-blank character (not consumed)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise _Truncated("unexpected end of file")

    def _expect(self, char: str) -> None:
        got = self._peek()
        if got != char:
            raise ValueError(f"expected {char!r}, found {got!r}")
        self.pos += 1

    def _value(self):
        self._peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self._fill():
                    continue
                # The whole file is read: an error at its end (or an unclosed string) means it was cut off.
                at_end = err.pos >= len(self.buf) - 1 or err.msg.startswith("Unterminated")
                raise (_Truncated if at_end else ValueError)(err.msg) from None
            # A number (or literal) that ends the window may continue in the next chunk.
            if end == len(self.buf) and not self.eof and self._fill():
                continue
            self.pos = end
            return value

    def events(self):
        if self._peek() != "{":
            raise ValueError("top level is not an object")
        self.pos += 1
        first = True
        while True:
            if self._peek() == "}":
                self.pos += 1
                return
            if not first:
                self._expect(",")
            first = False
            key = self._value()
            if not isinstance(key, str):
                raise ValueError("object key is not a string")
            self._expect(":")
            if key != "traceEvents":
                self.meta[key] = self._value()
                continue
            self.saw_events = True
            self._expect("[")
            if self._peek() == "]":
                self.pos += 1
                continue
            while True:
                yield self._batch() or [as_event(self._value())]
                sep = self._peek()
                self.pos += 1
                if sep == "]":
                    break
                if sep != ",":
                    raise ValueError(f"expected ',' or ']' between events, found {sep!r}")

    def _batch(self, tries: int = 3) -> list | None:
        """The window's complete events at once: the text from here to a `},` near the window's end,
        decoded as one JSON array by the C decoder. Sound for any cut: a JSON parser reads that prefix
        exactly as it reads the file, so the prefix decodes as a list only when the cut falls between
        two top-level events; when it falls inside one (a nested object, a string), decoding fails and
        an earlier cut is tried, then one event at a time."""
        end = len(self.buf)
        for _ in range(tries):
            end = self.buf.rfind("},", self.pos, end)
            if end < self.pos + 4096:  # too little left to be worth it: one at a time
                return None
            try:
                events = _EVENTS.decode("[" + self.buf[self.pos:end + 1] + "]")
            except (msgspec.DecodeError, RecursionError):
                continue
            self.pos = end + 1
            return events
        return None


class CpuOps:
    """CPU-side events: per thread, their intervals (for self time), name ids (for operator calls) and
    correlation ids (runtime calls, for operators' device time); ProfilerStep#N ranges give the steps;
    runtime calls are also kept as `launches` (when each device event was asked for)."""

    def __init__(self) -> None:
        # per thread: start/end pairs, name id per event (< 0: an operator), correlation id per event (or -1)
        self.threads: dict[tuple, tuple[array, array, array]] = {}
        self.name_ids: dict[str, int] = {}
        self.op_threads: set[tuple] = set()
        self.steps: list[tuple[float, float, int]] = []  # start, end, N of ProfilerStep#N
        self.launches = Launches()

    def add(self, key: tuple, ts: float, dur: float, name: str, cat: str, args: dict | None = None) -> None:
        """One CPU event of thread `key` (pid, tid); `args` are needed for runtime calls only."""
        thread = self.threads.get(key)
        if thread is None:
            thread = self.threads[key] = (array("d"), array("i"), array("q"))
        iv, names, corrs = thread
        iv.append(ts)
        iv.append(ts + dur)
        name_id = self.name_ids.get(name)
        if name_id is None:
            name_id = self.name_ids[name] = len(self.name_ids) + 1
        corr = -1
        if cat in OP_CATS:
            if name.startswith("ProfilerStep#") and STEP_RE.match(name):  # 2021 traces: steps are operators
                self.steps.append((ts, ts + dur, int(name[13:])))
                names.append(name_id)
            else:
                names.append(-name_id)
                self.op_threads.add(key)
        else:
            if cat in STEP_CATS and name.startswith("ProfilerStep#") and STEP_RE.match(name):
                self.steps.append((ts, ts + dur, int(name[13:])))
            elif cat in RUNTIME_CATS and args:
                corr = self.launches.add(args, ts)
            names.append(name_id)
        corrs.append(corr)

    def step_ranges(self) -> list[tuple[float, float]]:
        return [(s, e) for s, e, _ in sorted(self.steps)]

    def result(self, device_us_by_corr: dict[int, float]) -> CpuTotals:
        cpu_time = sum(union_us(*_pairs(iv)) for key, (iv, _, _) in self.threads.items() if key in self.op_threads)
        names_by_id = {v: k for k, v in self.name_ids.items()}
        ops: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
        for iv, names, corrs in self.threads.values():
            for name_id, self_cpu, self_device in _thread_operators(iv, names, corrs,
                                                                     device_us_by_corr):
                row = ops[names_by_id[name_id]]
                row[0] += 1
                row[1] += self_cpu
                row[2] += self_device
        steps = sorted(self.steps)
        durations = [e - s for s, e, _ in steps]
        in_file_order = sum(e - s for s, e, _ in self.steps)  # the mean's sum as it always was: stays bit-identical
        return CpuTotals(steps=len(steps), step_time_us_mean=in_file_order / len(steps) if steps else None,
                         cpu_time_us=cpu_time, op_calls={k: v[0] for k, v in ops.items()},
                         top_ops=top_operators(ops, by_device=bool(device_us_by_corr)),
                         step_time_us=durations, step_numbers=[n for _, _, n in steps])


def _pairs(iv: array) -> tuple[np.ndarray, np.ndarray]:
    flat = np.frombuffer(iv, dtype=np.float64)
    return flat[0::2], flat[1::2]


def top_operators(ops: dict[str, list], by_device: bool, n: int = TOP_N) -> list[dict]:
    """The n operators with the most self device time (self CPU time on a trace with no device)."""
    key = 2 if by_device else 1
    top = sorted(ops.items(), key=lambda kv: (-kv[1][key], kv[0]))[:n]
    return [{"name": name, "calls": calls, "self_cpu_us": cpu_us, "self_device_us": dev_us if by_device else None}
            for name, (calls, cpu_us, dev_us) in top]


class DeviceMemory:
    """`[memory]` instant events on CUDA devices: peak Total Allocated / Total Reserved per device, or
    (2021 traces with Bytes only) the running sum from the window's start."""

    def __init__(self) -> None:
        self.alloc: dict[Any, float] = {}
        self.reserved: dict[Any, float] = {}
        self.bytes_only: dict[Any, array] = defaultdict(lambda: array("d"))  # ts, bytes pairs

    def add(self, ts: Any, args: dict | None) -> bool:
        """One `[memory]` event; False when its fields have the wrong types (it is then skipped)."""
        if not isinstance(args, dict):
            return False
        device_type = args.get("Device Type")
        if type(device_type) not in _ID or device_type not in CUDA_DEVICE_TYPES:
            return True
        dev = args.get("Device Id")
        total, reserved = args.get("Total Allocated"), args.get("Total Reserved")
        nbytes = args.get("Bytes")
        if type(dev) not in _ID or not all(v is None or (type(v) in _NUMBER and -_BIG < v < _BIG)
                                           for v in (total, reserved, ts, nbytes)):
            return False
        if total is not None:
            self.alloc[dev] = max(self.alloc.get(dev, 0.0), float(total))
            if reserved is not None:
                self.reserved[dev] = max(self.reserved.get(dev, 0.0), float(reserved))
        elif nbytes is not None and ts is not None:
            self.bytes_only[dev].append(float(ts))
            self.bytes_only[dev].append(float(nbytes))
        return True

    def result(self) -> MemoryPeaks:
        peak_alloc = peak_reserved = None
        relative = False
        if self.alloc:
            peak_alloc = int(max(self.alloc.values()))
            peak_reserved = int(max(self.reserved.values())) if self.reserved else None
        elif self.bytes_only:
            relative = True
            peaks = []
            for pairs in self.bytes_only.values():
                flat = np.frombuffer(pairs, dtype=np.float64)
                order = np.argsort(flat[0::2], kind="stable")
                peaks.append(float(max(0.0, np.cumsum(flat[1::2][order]).max())))
            peak_alloc = int(max(peaks))
        return MemoryPeaks(peak_gpu_mem_bytes=peak_alloc, peak_gpu_reserved_bytes=peak_reserved,
                           gpu_mem_relative_to_window=relative if peak_alloc is not None else None)


def _complete_event_fields(e: Event):
    """(ts, dur, name) of a complete ("X") event, None without a ts, False when a field is mistyped (a
    string ts, a number beyond float range, a list for a name): one bad event must not lose the trace."""
    ts = e.ts
    if ts is None:
        return None
    dur = e.dur or 0.0
    name = e.name
    if not (type(ts) in _NUMBER and type(dur) in _NUMBER and -_BIG < ts < _BIG and -_BIG < dur < _BIG
            and type(name) is str and type(e.pid) in _ID and type(e.tid) in _ID):
        return False
    return ts, dur, name


def read_batches(path: Path, reader: "_Reader"):
    """The trace's events, a window's worth at a time (lists); the file's own problems become TraceError."""
    try:
        stream = _open(path)
    except OSError as err:
        raise TraceError(f"cannot read ({err.strerror or err})") from None
    reader.stream = stream
    n_events = 0
    try:
        for batch in reader.events():
            n_events += len(batch)
            yield batch
    except _Truncated as err:
        raise TraceError(f"truncated or malformed JSON after {n_events} events ({_first_line(err)})") from None
    except ValueError as err:
        if not reader.saw_events:
            raise TraceError(f"not a Chrome trace (no top-level traceEvents; {_first_line(err)})") from None
        raise TraceError(f"truncated or malformed JSON after {n_events} events ({_first_line(err)})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise TraceError(f"truncated or corrupt gzip ({err})") from None
    except OSError as err:
        raise TraceError(f"cannot read ({err.strerror or err})") from None
    finally:
        stream.close()
    if not reader.saw_events:
        raise TraceError("not a Chrome trace (no top-level traceEvents)")


def analyze_trace(path: str | Path) -> TraceRecord:
    """The per-trace record (see the module doc). Raises TraceError when the file is unusable."""
    path = Path(path)
    cpu, device, memory = CpuOps(), DeviceActivity(), DeviceMemory()
    n_events = bad_events = 0
    reader = _Reader(None)
    cpu_add = cpu.add  # the loop runs once per event: names bound once
    for batch in read_batches(path, reader):
        n_events += len(batch)
        for e in batch:
            if not isinstance(e, Event):
                continue
            ph = e.ph
            if ph == "X":
                fields = _complete_event_fields(e)
                if not fields:
                    bad_events += fields is False
                    continue
                ts, dur, name = fields
                cat = e.cat
                if cat in CPU_CATS:
                    cpu_add((e.pid, e.tid), ts, dur, name, cat, event_args(e) if cat in RUNTIME_CATS else None)
                elif cat in KERNEL_CATS:
                    device.kernel(event_args(e) or {}, ts, dur, name)
                elif cat in MEMCPY_CATS or cat in MEMSET_CATS:
                    device.copy(event_args(e) or {}, ts, dur, memset=cat in MEMSET_CATS)
            elif ph == "i" and e.name == "[memory]" and not memory.add(e.ts, event_args(e)):
                bad_events += 1
    info = reader.meta.get("distributedInfo") if isinstance(reader.meta.get("distributedInfo"), dict) else {}
    device_totals = device.result(cpu.launches, cpu.step_ranges(), _count(info.get("world_size")))
    cpu_totals = cpu.result(device.time_by_correlation() if device_totals.kernel_calls is not None else {})
    return trace_record(path, reader.meta, n_events, bad_events, cpu_totals, device_totals, memory.result())


def trace_record(path: Path, meta: dict, n_events: int, bad_events: int, cpu: CpuTotals, device: DeviceTotals,
                 memory: MemoryPeaks) -> TraceRecord:
    """The accumulators' results as one record, with the rank and per-step values."""
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = _count(info.get("rank"))
    if rank is None:
        m = RANK_RE.search(path.name)
        rank = int(m.group(1)) if m and len(m.group(1)) < 10 else None
    return TraceRecord(
        file=str(path), rank=rank, world_size=_count(info.get("world_size")),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        events=n_events, bad_events=bad_events, **vars(cpu), **vars(device), **vars(memory),
        cpu_time_us_per_step=per_step(cpu.cpu_time_us, cpu.steps),
        cuda_time_us_per_step=per_step(device.cuda_time_us, cpu.steps),
        kernel_calls_per_step=per_step(device.kernel_calls, cpu.steps),
        comm_time_us_per_step=per_step(device.comm_time_us, cpu.steps))
