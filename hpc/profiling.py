"""torch.profiler around the training loop: one trace per rank per cycle, plus key_averages() totals.

`maybe_profile(cfg, trace_dir, rank, cuda)` yields a `Profiling` (call `.step()` after every
optimizer step) or None when profiling is off, in which case nothing is imported or recorded.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Optional

from hpc.config import ProfilerConfig


def key_average_totals(prof) -> dict:
    """The profiler's own totals for one cycle, kept to cross-check the trace analysis."""
    events = prof.key_averages()
    self_cpu_us = sum(e.self_cpu_time_total for e in events)
    self_device_us = 0.0
    for e in events:
        # Renamed over torch versions: self_cuda_time_total (<=2.3) -> self_device_time_total.
        self_device_us += getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0
    op_calls = {e.key: e.count for e in events if e.key.startswith("aten::")}
    return {
        "self_cpu_time_total_us": float(self_cpu_us),
        "self_device_time_total_us": float(self_device_us),
        "conv2d_calls": int(op_calls.get("aten::conv2d", 0)),
        "op_calls": op_calls,
    }


class Profiling:
    def __init__(self, prof, cycles: list):
        self._prof = prof
        self.cycles = cycles  # key_average_totals() of every finished cycle, in order

    def step(self) -> None:
        self._prof.step()


@contextlib.contextmanager
def maybe_profile(cfg: ProfilerConfig, trace_dir: Path, rank: int, cuda: bool) -> Iterator[Optional[Profiling]]:
    if not cfg.enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    write_trace = tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}")
    cycles: list = []

    def on_trace_ready(prof) -> None:
        cycles.append(key_average_totals(prof))
        write_trace(prof)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(
        activities=activities,
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat),
        on_trace_ready=on_trace_ready,
        record_shapes=cfg.record_shapes,
        profile_memory=cfg.profile_memory,
        with_stack=cfg.with_stack,
    ) as prof:
        yield Profiling(prof, cycles)
