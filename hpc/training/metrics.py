"""What a run reports as it goes, kept out of the loop (the part torchtitan's MetricsProcessor plays):
- `Throughput`: images/s per log interval and per epoch, the ETA, the epoch's loss summed on the
  device (no per-step sync);
- `MetricsLog`: metrics.jsonl and the same scalars in TensorBoard, on rank 0;
- `format_duration`: a wall time as 1h02m or 3m05s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch.utils.tensorboard import SummaryWriter

from hpc.core.errors import WriteError
from hpc.core.rundir import MetricsRecord, RunPaths, append_metrics


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Throughput:
    """Throughput, ETA and the epoch's sums. `start()` when the loop starts, `start_epoch()` at each
    epoch, `add()` after each micro-batch; `interval()` and `epoch()` give what to log."""

    def __init__(self, stop_at: int, resumed_from_step: int, device: torch.device):
        self.stop_at = stop_at
        self.resumed_from_step = resumed_from_step
        self.device = device
        self.t_start = self.t_log = self.t_epoch = time.perf_counter()
        self.images_since_log = 0
        self.loss_sum = torch.zeros(())
        self.batches = self.images = 0

    def start(self) -> None:
        self.t_start = self.t_log = time.perf_counter()
        self.images_since_log = 0

    def start_epoch(self) -> None:
        self.t_epoch = time.perf_counter()
        self.loss_sum = torch.zeros((), device=self.device)  # summed on the device: no per-step sync
        self.batches = self.images = 0

    def add(self, loss: torch.Tensor, images: int) -> None:
        """A micro-batch done: its loss (a device tensor) and the images it took across all ranks."""
        self.loss_sum += loss.detach().float()
        self.batches += 1
        self.images += images
        self.images_since_log += images

    def interval(self, step: int) -> dict[str, float]:
        """images/s since the last call and the time left at this pace ("eta_s"); starts a new interval."""
        now = time.perf_counter()
        ips = self.images_since_log / max(now - self.t_log, 1e-9)
        eta = (self.stop_at - step) * (now - self.t_start) / max(1, step - self.resumed_from_step)
        self.t_log = now
        self.images_since_log = 0
        return {"images_per_s": ips, "eta_s": eta}

    def epoch(self) -> dict[str, float]:
        """The epoch's wall time, images/s and mean training loss (a resumed epoch's cover the batches
        run since the restart)."""
        epoch_time = time.perf_counter() - self.t_epoch
        return {
            "epoch_time_s": epoch_time,
            "images_per_s": self.images / max(epoch_time, 1e-9),
            "train_loss": float(self.loss_sum) / max(self.batches, 1),
        }

    def wall_s(self) -> float:
        return time.perf_counter() - self.t_start


class MetricsLog:
    """metrics.jsonl (one JSON record per write) and the same scalars in TensorBoard; rank 0 only. A record
    that cannot be written (disk full, read-only) is kept as `failed`, for the ranks to stop together at
    the step's agreement, not on rank 0 alone."""

    def __init__(self, run_dir: Path, enabled: bool, purge_step: int):
        self.paths = RunPaths(run_dir)
        self.writer: SummaryWriter | None = None
        self.failed: WriteError | None = None
        if enabled:
            self.writer = SummaryWriter(str(self.paths.tensorboard), purge_step=purge_step or None)

    def record(self, kind: str, values: dict[str, Any], step: int, epoch: int) -> None:
        if self.writer is None or self.failed is not None:
            return
        try:
            record = msgspec.convert(
                {"kind": kind, "step": step, "epoch": epoch, "time": time.time(), **values}, MetricsRecord
            )
            append_metrics(self.paths.metrics, record)
        except WriteError as e:
            self.failed = e
            return
        for key, value in values.items():
            if isinstance(value, (int, float)) and value is not None:
                self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
