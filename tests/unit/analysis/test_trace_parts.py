"""The trace analysis's parts, in-process: the event decoding (typed windows, the lenient path for a
window with a mistyped event), the operator tree, and the accumulators (CPU operators, device
activity, device memory). The whole-trace checks against real traces and other tools: tests/e2e."""

import dataclasses
import json
import random

import numpy as np
import pytest

from analysis.measure import cpu, device
from analysis.measure.cpu import (
    CpuOps,
    _grouped,
    _merged_only_children,
    _nested_parents,
    _stack_parents,
)
from analysis.measure.device import DeviceActivity, Launches
from analysis.measure.memory import DeviceMemory
from analysis.pipeline import analyze_trace
from analysis.read.events import (
    Args,
    Event,
    Instant,
    MemoryArgs,
    _LooseEvent,
    admit,
    int_args,
)
from analysis.records import DeviceTotals, MemoryPeaks
from tests.gputrace import rank_trace


def _x(cat: str, name: str, ts: float, dur: float, **args) -> Event:
    return Event(cat=cat, name=name, pid=1, tid=1, ts=ts, dur=dur, args=Args(**args) if args else None)


def _add(accumulator, categories: dict, *events: Event) -> None:
    """What trace._route gives an accumulator: a window's events with their times and kinds as arrays."""
    accumulator.add(list(events), np.array([e.ts for e in events]), np.array([e.dur for e in events]),
                    np.array([categories[e.cat] for e in events]))


# --- the operator tree ---------------------------------------------------------------------------------

def _nested(rng: random.Random, start: float, end: float, depth: int, out: list) -> None:
    """Random properly nested intervals inside [start, end]: children side by side (touching or not),
    some of zero length, some (an only child) the same interval as their parent."""
    if depth < 5 and rng.random() < 0.1:
        out.append((start, end))
        _nested(rng, start, end, depth + 1, out)
        return
    t = start
    while depth < 5 and t < end and rng.random() < 0.8:
        s, e = t, t + rng.choice([0.0, rng.uniform(0, end - t)])
        out.append((s, e))
        _nested(rng, s, e, depth + 1, out)
        t = e + rng.choice([0.0, rng.uniform(0, 2)])


def _sorted(intervals: list) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.array([i[0] for i in intervals]), np.array([i[1] for i in intervals])
    order = np.lexsort((-e, s))
    return s[order], e[order]


@pytest.mark.parametrize("seed", range(40))
def test_column_wise_tree_is_torchs_tree_on_nested_events(seed):
    rng = random.Random(seed)
    intervals: list = []
    for root in range(rng.randint(1, 4)):
        _nested(rng, root * 100.0, root * 100.0 + rng.choice([0.0, 90.0]), 0, intervals)
        intervals.append((root * 100.0, root * 100.0 + 90.0))
    s, e = _sorted(intervals)
    parents = _nested_parents(s, e)
    assert parents is not None and parents.tolist() == _stack_parents(s, e).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_column_wise_tree_declines_overlapping_events(seed):
    rng = random.Random(seed)
    s, e = _sorted([(a, a + rng.choice([0.0, rng.uniform(0, 30)])) for a in
                    (rng.choice([0.0, 5.0, rng.uniform(0, 100)]) for _ in range(rng.randint(2, 30)))])
    parents = _nested_parents(s, e)
    assert parents is None or parents.tolist() == _stack_parents(s, e).tolist()
    s, e = _sorted([(0.0, 10.0), (5.0, 15.0)])  # overlap without nesting: the stack walk decides
    assert _nested_parents(s, e) is None and _stack_parents(s, e).tolist() == [-1, -1]


@pytest.mark.parametrize("compress_up_to", [0, cpu.MAX_COMPRESSED_THREADS])  # the sort, then the compresses
@pytest.mark.parametrize("seed", range(10))
def test_columns_grouped_by_thread_keep_file_order_within_a_thread(seed, compress_up_to, monkeypatch):
    monkeypatch.setattr(cpu, "MAX_COMPRESSED_THREADS", compress_up_to)
    rng = np.random.default_rng(seed)
    threads = rng.integers(1, rng.integers(2, 6), size=int(rng.integers(0, 500))).astype(np.int32)
    columns = [rng.random(threads.size), np.arange(threads.size), rng.integers(-9, 9, threads.size), threads]
    order = np.argsort(threads, kind="stable")
    expected = [c[order] for c in columns]
    assert all(np.array_equal(a, b) for a, b in zip(_grouped([c.copy() for c in columns]), expected, strict=True))


def test_merge_of_same_name_only_children_collapses_chains():
    # 0 A -> 1 A -> 2 A (chain of only children: 1 and 2 merge into 0); 3 B -> 4 B, 5 B (two children: kept)
    parent = np.array([-1, 0, 1, -1, 3, 3])
    name = np.array([1, 1, 1, 2, 2, 2])
    assert _merged_only_children(parent, name).tolist() == [False, True, True, False, False, False]


# --- decoding ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("event, expected", [
    ({"ph": "X", "cat": "cpu_op", "name": "a", "ts": "10"}, False),  # a string time
    ({"ph": "X", "cat": "cpu_op", "name": ["a"], "ts": 1}, False),
    ({"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1e305}, False),  # out of range
    ({"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "pid": [1]}, False),
    ({"ph": "X", "cat": "cpu_op", "name": "a"}, None),  # no time: not read
    ({"ph": "f", "cat": "ac2g", "name": ["anything"], "ts": "x"}, None),  # a flow event: not read, so not bad
    ({"ph": "i", "name": "[memory]", "args": [1, 2]}, False),
    ({"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Total Allocated": "lots"}}, False),
    ({"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Device Id": [0]}}, False),
    ({"ph": "i", "name": "[memory]", "ts": 3}, Instant(name="[memory]", ts=3.0)),  # no args: not CUDA
])
def test_admit_reads_what_it_can_and_counts_the_rest(event, expected):
    assert admit(_LooseEvent(**event)) == expected


def test_admit_keeps_an_x_event_whose_unread_args_are_odd():
    e = admit(_LooseEvent(ph="X", cat=7, name="k", ts=1, dur=2, args={"correlation": 5, "Device Id": [0]}))
    assert e == Event(cat=None, name="k", ts=1.0, dur=2.0, args=Args(correlation=5))


def test_int_args_keep_sane_integers_only():
    assert int_args([3, None, "4", True, 1 << 70, -(1 << 63), 7]).tolist() == [3, -1, -1, -1, -1, -1, 7]
    assert int_args([1 << 62, 5]).tolist() == [-1, 5]


def test_a_mistyped_event_costs_only_itself_not_its_window(tmp_path):
    """A trace of several windows; one window also has mistyped events, so it is read leniently and its
    events admitted one by one. Every number but the bad-event count must be as without them."""
    trace = rank_trace(0, 2, steps=2500)
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(trace))
    assert clean.stat().st_size > 3 << 20  # more than three windows
    mid = len(trace["traceEvents"]) // 2
    bad = [{"ph": "X", "cat": "cpu_op", "name": "aten::bad", "pid": 1, "tid": 1, "ts": "10", "dur": 1},
           {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1e305},  # typed, but garbage
           {"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Total Allocated": "lots"}}]
    trace["traceEvents"][mid:mid] = bad
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(trace))
    a, b = analyze_trace(clean), analyze_trace(mixed)
    assert (b.bad_events, b.events - a.events) == (3, 3) and a.bad_events == 0
    fields = {f.name for f in dataclasses.fields(a)} - {"file", "events", "bad_events"}
    assert {f: getattr(b, f) for f in fields} == {f: getattr(a, f) for f in fields}
    assert a.steps == 2500 and a.kernel_calls == 5000


@pytest.mark.parametrize("odd", [
    {"ph": "Q", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},  # no such phase
    {"cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},  # no phase at all
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": None, "dur": 1.0},  # a null time
])
def test_an_event_the_typed_decoder_refuses_sends_only_its_window_to_the_lenient_path(odd, tmp_path):
    """Events decode by phase (a complete event, an instant, or an empty struct for every other phase of
    the Chrome format): an event outside those, or with a null time, is read leniently with its window,
    not counted as bad, and every number stays as without it."""
    trace = rank_trace(0, 2, steps=1200)
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(trace))
    trace["traceEvents"].insert(len(trace["traceEvents"]) // 2, odd)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(trace))
    a, b = analyze_trace(clean), analyze_trace(mixed)
    assert (b.bad_events, b.events - a.events) == (0, 1)
    fields = {f.name for f in dataclasses.fields(a)} - {"file", "events"}
    assert {f: getattr(b, f) for f in fields} == {f: getattr(a, f) for f in fields}


# --- accumulators --------------------------------------------------------------------------------------

def test_cpu_ops_self_time_steps_and_merged_calls():
    ops = CpuOps()
    _add(ops, cpu.CATEGORIES,
         _x("user_annotation", "ProfilerStep#7", 0.0, 100.0),
         _x("cpu_op", "aten::div_", 10.0, 20.0),
         _x("cpu_op", "aten::div_", 12.0, 5.0),  # a redispatch: merged into its parent, as torch does
         _x("cuda_runtime", "cudaLaunchKernel", 13.0, 2.0, correlation=9))
    _add(ops, cpu.CATEGORIES, _x("cpu_op", "aten::add", 40.0, 10.0))  # a second window
    r = ops.result((np.array([9]), np.array([4.5])))  # correlation 9 launched 4.5 µs of device work
    assert r.steps == 1 and r.step_time_us_mean == 100.0 and r.step_numbers == [7] and r.step_time_us == [100.0]
    assert r.cpu_time_us == 100.0 and r.op_calls == {"aten::div_": 1, "aten::add": 1}
    top = {row["name"]: row for row in r.top_ops}
    # div_'s self time: its 20 µs less the launch (its merged child's only child); the launch's device time is div_'s
    assert top["aten::div_"]["self_cpu_us"] == 18.0 and top["aten::div_"]["self_device_us"] == 4.5
    assert r.top_ops[0]["name"] == "aten::div_" and top["aten::add"]["self_device_us"] == 0.0
    assert ops.launches.lookup(np.array([9, 10])).tolist()[0] == 13.0


def test_device_activity_breakdowns_collectives_and_top_kernels():
    dev, launches = DeviceActivity(), Launches()
    launches.add(np.array([1, 2, 3, -1]), np.array([-5.0, 1.0, 30.0, 99.0]))
    allreduce = {"collective": "allreduce", "in_nelems": 1000, "out_nelems": 1000, "dtype": "Float", "group_size": 4}
    _add(dev, device.CATEGORIES,
         _x("kernel", "implicit_convolve_sgemm", 0.0, 10.0, correlation=1, stream=7),
         _x("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 5.0, 10.0, correlation=2, stream=9, **allreduce),
         # launched at 30, after the stream's last event ended (10): host wait
         _x("gpu_memcpy", "Memcpy HtoD", 40.0, 2.0, correlation=3, stream=7))
    r = dev.result(launches, [(-10.0, 20.0), (20.0, 60.0)], world_size=4)
    assert r.cuda_time_us == 22.0 and r.gpu_busy_us == 17.0 and r.kernel_calls == 2
    assert r.kernel_calls_by_class["communication"] == 1 and r.kernel_calls_by_class["convolution"] == 1
    assert r.comm_time_us == 10.0 and r.comm_overlap_pct == pytest.approx(50.0)
    assert r.temporal_breakdown_us == {"computation_us": 10.0, "communication_us": 5.0, "memory_us": 2.0,
                                       "idle_us": 25.0, "span_us": 42.0}
    assert r.idle_breakdown_us == {"stream": 7, "host_wait_us": 30.0, "kernel_wait_us": 0.0, "other_us": 0.0}
    assert [s["span_us"] for s in r.steps_breakdown_us] == [15.0, 2.0]  # by launch time: 2 events, then 1
    (ar,) = r.collectives
    assert (ar["kind"], ar["calls"], ar["bytes_per_call"], ar["group_size"]) == ("all_reduce", 1, 4000.0, 4)
    assert ar["algbw_GBps"] == pytest.approx(4000 / 10 / 1e3) and ar["busbw_GBps"] == pytest.approx(0.4 * 1.5)
    assert ar["overlap_pct"] == pytest.approx(50.0) and r.collective_launch_us == [[11.0], []]
    assert [k["name"] for k in r.top_kernels] == ["implicit_convolve_sgemm", "ncclKernel_AllReduce_RING_LL_Sum_float"]
    assert DeviceActivity().result(Launches(), [], None) == DeviceTotals()  # a CPU run: absent, not zero


def test_kernels_replayed_from_a_cuda_graph_count_as_kernels_and_as_graphed():
    """A graph replay as CUPTI records it (kineto writes "graph id" into each kernel's args): one
    cudaGraphLaunch, its kernels sharing its correlation id. They are kernels like any other (the issue's
    5% rule compares their count per step with the eager trace's), and graph_kernel_calls counts them;
    the gap before the first is host wait, those between replayed kernels are not."""
    dev, launches = DeviceActivity(), Launches()
    launches.add(np.array([50, 51]), np.array([0.0, 100.0]))  # two cudaGraphLaunch calls
    replay = [_x("kernel", name, t0 + 10.0 + 5.0 * i, 4.0, correlation=corr, stream=7, graph_id=3)
              for t0, corr in ((0.0, 50), (100.0, 51)) for i, name in enumerate(("sgemm", "bn_fw", "relu"))]
    _add(dev, device.CATEGORIES, *replay, _x("kernel", "copy_eager", 200.0, 1.0, correlation=60, stream=7))
    r = dev.result(launches, [(0.0, 100.0), (100.0, 200.0)], world_size=1)
    assert (r.kernel_calls, r.graph_kernel_calls) == (7, 6)
    assert r.idle_breakdown_us["kernel_wait_us"] == 4 * 1.0  # inside each replay: 1 µs gaps, launched before
    assert DeviceActivity().result(Launches(), [], None).graph_kernel_calls is None


def _memory(ts: float, **args) -> Event:
    return Instant(name="[memory]", ts=ts, args=MemoryArgs(**args))


def test_device_memory_peaks_per_device_and_garbage_numbers():
    mem = DeviceMemory()
    bad = mem.add([_memory(1.0, device_type=1, device_id=0, total_allocated=100.0, total_reserved=200.0),
                   _memory(2.0, device_type=1, device_id=0, total_allocated=300.0, total_reserved=200.0),
                   _memory(3.0, device_type=0, device_id=-1, total_allocated=1e12),  # CPU: not a GPU peak
                   _memory(4.0, device_type="cuda", device_id=1, total_allocated=1e305),  # garbage: bad
                   Instant(name="[memory]", ts=5.0)])  # no args: nothing to read
    assert bad == 1
    assert mem.result() == MemoryPeaks(peak_gpu_mem_bytes=300, peak_gpu_reserved_bytes=200,
                                       gpu_mem_relative_to_window=False)
    relative = DeviceMemory()  # 2021 traces: Bytes only, the running sum from the window's start
    relative.add([_memory(t, device_type=1, device_id=0, nbytes=b)
                  for t, b in ((2.0, -50.0), (1.0, 80.0), (3.0, 40.0))])  # by time: +80, -50, +40
    assert relative.result() == MemoryPeaks(peak_gpu_mem_bytes=80, gpu_mem_relative_to_window=True)


def test_a_literal_msgspec_refuses_costs_one_window_not_one_per_event(tmp_path):
    """A NaN early in a big window (Python's json writes NaN; msgspec refuses it): every event is still
    read, the NaN one counted as bad. Before, each event after it retried the whole window (found by the
    property tests: a mutated real trace took over a minute; now this file takes a fraction of a second)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": float(i), "dur": 0.5}
              for i in range(20_000)]
    events[3]["dur"] = float("nan")
    path = tmp_path / "nan.json"
    path.write_text(json.dumps({"traceEvents": events}))
    rec = analyze_trace(path)
    assert rec.events == 20_000 and rec.bad_events == 1 and rec.op_calls == {"aten::add": 19_999}
