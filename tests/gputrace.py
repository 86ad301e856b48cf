"""GPU-shaped runs written in Kineto's trace format, with numbers known by construction.

This machine has no GPU, so a sweep's device side (kernels, NCCL all-reduces, CUDA memory) cannot be
recorded here; these files stand in for it where a test needs a 1-GPU and a 2-GPU point of the same
study. The format is the one PyTorch 2.x writes (checked against the real traces in shared/traces
by the oracle tests); the numbers are chosen so a test can say what the analysis must find.
"""

from __future__ import annotations

import json
from pathlib import Path

COMPUTE_US = 800.0  # one convolution kernel per step
EXPOSED_COMM_US = 150.0  # the all-reduce runs past the end of compute by this much (2 GPUs)
ALLREDUCE_US = 400.0
GRAD_ELEMENTS = 1_000_000  # float32: 4 MB all-reduced per step


def rank_trace(rank: int, world: int, steps: int = 3, slow_us: float = 0.0) -> dict:
    """One rank's trace: per step a ProfilerStep, a conv launched at +10 µs, and with world > 1 an
    all-reduce launched at +500 µs (+slow_us on a slow rank) that ends EXPOSED_COMM_US after the conv."""
    events, corr = [], 1000
    step_us = 1000.0 + (EXPOSED_COMM_US + slow_us if world > 1 else 0.0)
    t = 0.0
    for n in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 2}", "pid": 1, "tid": 1,
                       "ts": t, "dur": step_us})
        events += _launch(t + 10.0, corr, "aten::conv2d", "implicit_convolve_sgemm", t + 20.0, COMPUTE_US, 7, {})
        corr += 1
        if world > 1:
            start = t + 20.0 + COMPUTE_US + EXPOSED_COMM_US + slow_us - ALLREDUCE_US
            args = {"Collective name": "allreduce", "In msg nelems": GRAD_ELEMENTS, "Out msg nelems": GRAD_ELEMENTS,
                    "dtype": "Float", "Group size": world}
            events += _launch(t + 500.0 + slow_us, corr, "record_param_comms", "ncclKernel_AllReduce_RING_LL_Sum_float",
                              start, ALLREDUCE_US, 20, args)
            corr += 1
        events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": t + 30.0,
                       "s": "t", "args": {"Device Type": 1, "Device Id": rank, "Total Allocated": 2**30 + rank,
                                          "Total Reserved": 2**31, "Bytes": 1}})
        t += step_us
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": events}


def _launch(cpu_ts: float, corr: int, op: str, kernel: str, gpu_ts: float, gpu_us: float, stream: int,
            args: dict) -> list[dict]:
    return [{"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": cpu_ts, "dur": 5.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": cpu_ts + 1.0,
             "dur": 3.0, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": gpu_ts, "dur": gpu_us,
             "args": {"correlation": corr, "stream": stream, "device": 0, **args}}]


def write_run(run_dir: Path, world: int, batch: int, fraction: float = 1.0, slow_rank: int | None = None,
              slow_us: float = 0.0, steps: int = 3) -> None:
    """A run directory as hpc.train leaves it on a GPU machine: traces/, summary.json, metrics.jsonl."""
    (run_dir / "traces").mkdir(parents=True)
    for rank in range(world):
        trace = rank_trace(rank, world, steps, slow_us=slow_us if rank == slow_rank else 0.0)
        (run_dir / "traces" / f"rank{rank}.1.pt.trace.json").write_text(json.dumps(trace))
    ranks = [{"rank": r, "world_size": world, "batch_size_per_gpu": batch, "global_batch_size": batch * world,
              "train_images": int(50_000 * fraction), "steps": 30, "steps_per_epoch": 25, "epochs_completed": 1,
              "complete": True, "peak_rss_bytes": 3 * 2**30} for r in range(world)]
    summary = {"kind": "train", "outcome": "done", "world_size": world, "ranks": ranks,
               "config": {"model": {"arch": "resnet152"}, "data": {"fraction": fraction}}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 1, "epoch_time_s": 12.5}) + "\n")


def write_sweep(sweep_dir: Path, slow_us: float = 60.0, steps: int = 3) -> None:
    """Two points of one fraction and per-GPU batch: 1 GPU, and 2 GPUs whose rank 1 is slow; `steps`
    profiled steps a trace (10 or more for ranks to be compared step by step)."""
    points = []
    for i, gpus in enumerate((1, 2)):
        write_run(sweep_dir / f"9_{i}", gpus, 128, slow_rank=1 if gpus > 1 else None, slow_us=slow_us, steps=steps)
        points.append({"data_fraction": 1.0, "batch_size": 128, "gpus": gpus, "nodes": 1, "job_id": f"9_{i}",
                       "run_dir": f"9_{i}"})
    (sweep_dir / "index.json").write_text(json.dumps({"sweep": {}, "cluster": "local", "points": points}))
