"""The toolkit's own graphed trace, from an H200 (results/gpu/resnet152_graph_rank0.pt.trace.json.gz:
ResNet152, batch 128, bf16, DDP over NCCL captured in one CUDA graph, 3 profiled steps), against the
eager trace of the same configuration from an H100 (results/gpu/resnet152_rank0.pt.trace.json.gz).
The oracle reads both files with plain json: launches by correlation id, steps by their CPU spans."""

import gzip
import json
import re
from pathlib import Path

import pytest

from analysis.pipeline import analyze_trace
from conftest import GPU_RESULTS, OWN_GPU_TRACE

GRAPH = GPU_RESULTS / "resnet152_graph_rank0.pt.trace.json.gz"
EAGER = OWN_GPU_TRACE
COPY_NODE = re.compile(r"mem(cpy|set)\d+_?\w*")  # how CUPTI names a graph's memcpy/memset node


def by_launch(path: Path) -> dict:
    """Kernels (and a graph's copy nodes) split by when their runtime call ran: inside a step, before the
    trace's first call, or elsewhere; with the step count."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    out = {"steps": len(steps), "in_steps": 0, "copies_in_steps": 0, "before": 0, "copies": 0, "kernels": 0,
           "memcpy_events_in_steps": 0}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy"):
            continue
        corr = e["args"]["correlation"]
        inside = corr in launched and any(s <= launched[corr] < t for s, t in steps)
        if e["cat"] == "gpu_memcpy":
            out["memcpy_events_in_steps"] += inside
            continue
        copy = COPY_NODE.fullmatch(e["name"]) is not None
        out["kernels"] += not copy
        out["copies"] += copy
        out["in_steps"] += inside and not copy
        out["copies_in_steps"] += inside and copy
        out["before"] += corr not in launched and corr < min(launched)
    return out


def test_a_graphed_trace_counts_what_its_steps_launched_as_an_eager_one_does():
    graph, eager = by_launch(GRAPH), by_launch(EAGER)
    rec = analyze_trace(GRAPH)
    # The window opened on a replay the host launched a step earlier (the device runs behind it): its
    # kernels are in the file but belong to no recorded step.
    assert graph["before"] > 1000
    assert rec.steps == graph["steps"] == 3
    assert rec.kernel_calls == graph["kernels"]  # the copy nodes are copies, not kernels
    assert rec.kernel_calls_per_step == graph["in_steps"] / graph["steps"]
    # A replay runs what an eager step launches (other GPU, same torch, model and batch)
    eager_rec = analyze_trace(EAGER)
    assert eager_rec.kernel_calls_per_step == eager["in_steps"] / eager["steps"]
    assert rec.kernel_calls_per_step == pytest.approx(eager_rec.kernel_calls_per_step, rel=0.01)
    # and its memcpy nodes are the eager step's device-to-device copies
    copies_per_replay = graph["copies_in_steps"] / graph["steps"]
    assert copies_per_replay == pytest.approx(eager["memcpy_events_in_steps"] / eager["steps"], rel=0.02)


def test_a_rank_folded_over_its_cycles_keeps_what_the_steps_launched():
    """A run's figures (tables, figures, verdict) come from each rank's cycles folded together: per step
    and per epoch they use the steps' own launches too, not the window's total."""
    from analysis.runs.fold import rank_totals

    graph = by_launch(GRAPH)
    rec = analyze_trace(GRAPH)
    (rank,) = rank_totals([rec, rec], {0: 10})  # two cycles of the same trace; 10 steps an epoch
    assert rank.steps == 6 and rank.kernel_calls == 2 * (graph["kernels"])
    assert rank.kernel_calls_per_step == graph["in_steps"] / graph["steps"] == rec.kernel_calls_per_step
    assert rank.kernel_calls_per_epoch == pytest.approx(10 * graph["in_steps"] / graph["steps"])
    assert rank.cuda_time_us_per_step == pytest.approx(rec.cuda_time_us_per_step)
    assert rank.cuda_time_us_per_step < rec.cuda_time_us / rec.steps  # the replay from before the window is out
