"""The trainer's small parts, each owning one job and its state:
- TrainState: where the run is (epoch, micro-batch position, optimizer step) and its RNG state;
- StepTimer: optimizer-step times, CUDA events on a GPU (no per-step sync), perf_counter on a CPU;
- DivergenceGuard: the first non-finite loss, checked every step on a CPU, at log steps on a GPU;
- evaluate(): every test image exactly once across ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from hpc.core.proc import queued_s
from hpc.placement.distenv import DistEnv
from hpc.settings.profranks import typical
from hpc.settings.schema import DataConfig
from hpc.training.build import DataParts
from hpc.training.checkpoint import rng_state, set_rng_state


@dataclasses.dataclass
class TrainState:
    """Where the run is: epoch, micro-batches done in this epoch, optimizer steps done, and the random
    number generators (torch, Python, CUDA) at that point, so a resumed run draws what an uninterrupted
    one would."""

    epoch: int = 0
    position: int = 0
    step: int = 0
    use_cuda: bool = dataclasses.field(default=False, compare=False)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "step": self.step, "rng": rng_state(self.use_cuda)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"], self.use_cuda)
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.step = state["step"]


class StepTimer:
    """Optimizer-step times, and each step's own work: from its start to its gradient sync (`synced()`,
    called before the backward pass that all-reduces), the part no other rank can hold up. Under DDP every
    rank's whole step ends at the same all-reduce, so whole steps come out alike on every rank and only the
    own work tells the straggler from the ranks that wait for it. On a GPU events are recorded (start, sync,
    end) and read once at the end (after a synchronize); on a CPU perf_counter. A graph replay has no sync
    point the host sees: its own work is not measured (None)."""

    def __init__(self, use_cuda: bool):
        self.use_cuda = use_cuda
        self.events: list[torch.cuda.Event] = []
        self.marks: list[tuple[torch.cuda.Event, torch.cuda.Event | None]] = []  # per step: start, sync
        self.seconds: list[float] = []
        self.own_seconds: list[float | None] = []
        self.own_queued_seconds: list[float | None] = []  # a CPU rank's wait for a core in its own work
        self.started = 0.0
        self.started_queued: float | None = None
        self.sync_at: float | None = None
        self.sync_queued: float | None = None
        self.sync_event: torch.cuda.Event | None = None
        self.start_event: torch.cuda.Event | None = None
        self.first_step_unix: float | None = None  # when this process's first step ended (time.time())
        self.in_step = False
        self.profiled: list[bool] = []  # per step: the profiler was on (its window slows a CPU rank)

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self.started = time.perf_counter()
        self.started_queued = None if self.use_cuda else queued_s()
        self.sync_at = None
        self.sync_queued = None
        self.sync_event = None
        self.in_step = True
        self.start_event = self._event() if self.use_cuda else None

    def synced(self) -> None:
        """The step's gradient sync begins now (its last backward pass)."""
        if self.use_cuda:
            self.sync_event = self._event()
        else:
            self.sync_at = time.perf_counter()
            self.sync_queued = queued_s()

    def stop(self, profiled: bool = False) -> None:
        """The step's end (`profiled`: the profiler was on during it)."""
        self.in_step = False
        self.profiled.append(profiled)
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
        if self.use_cuda:
            self.events.append(self._event())
            if self.start_event is not None:
                self.marks.append((self.start_event, self.sync_event))
        else:
            self.seconds.append(time.perf_counter() - self.started)
            self.own_seconds.append(None if self.sync_at is None else self.sync_at - self.started)
            waited = None
            if self.sync_queued is not None and self.started_queued is not None:
                waited = self.sync_queued - self.started_queued
            self.own_queued_seconds.append(waited)

    def times(self) -> list[float]:
        if self.use_cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.events, self.events[1:], strict=False)]
        return self.seconds

    def own_so_far_s(self) -> float | None:
        """The median own work of the steps so far after the first (which warms caches; it alone where there
        is no other), the step in progress included once its sync is marked (profiler.ranks chooses inside a
        step's end, before the step is stopped)."""
        own = self.own_times()
        if self.in_step and self.use_cuda and self.start_event is not None and self.sync_event is not None:
            own = [*own, self.start_event.elapsed_time(self.sync_event) / 1000]
        elif self.in_step and self.sync_at is not None:
            own = [*own, self.sync_at - self.started]
        return typical(own[1:] if len(own) > 1 else own)

    def own_times(self) -> list[float | None]:
        """Each step's own work in seconds (None where it was not measured), in step order."""
        if self.use_cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 if b is not None else None for a, b in self.marks]
        return self.own_seconds


class DivergenceGuard:
    """Keeps the log interval's micro-batch losses (device tensors) and finds the first non-finite one."""

    def __init__(self, use_cuda: bool):
        self.use_cuda = use_cuda
        self.losses: list[torch.Tensor] = []
        self.steps: list[int] = []

    def add(self, loss: torch.Tensor, step: int) -> None:
        self.losses.append(loss.detach())
        self.steps.append(step)

    def bad_step(self, at_log: bool, group_size: int) -> int:
        """The optimizer step of the first non-finite loss, or 0. On a GPU only at log steps (a check is
        a sync); on a CPU every step, over that step's micro-batches."""
        if self.use_cuda and not at_log:
            return 0
        checked = self.losses if self.use_cuda else self.losses[-group_size:]
        finite = torch.isfinite(torch.stack(checked).float().cpu())
        if bool(finite.all()):
            return 0
        return self.steps[len(self.losses) - len(checked) + int((~finite).nonzero()[0])]

    def mean(self) -> float:
        return float(torch.stack(self.losses).float().mean())

    def reset(self) -> None:
        self.losses = []
        self.steps = []


def evaluate(
    model: torch.nn.Module,
    data: DataParts,
    autocast: Callable[[], contextlib.AbstractContextManager[object]],
    dc: DataConfig,
    micro: int,
    dist: DistEnv,
    device: torch.device,
) -> dict[str, float]:
    """Loss, top-1 and top-5 over every test image exactly once across ranks (`data`: setup.DataParts)."""

    from hpc.training import data as data_mod

    model.eval()
    idx = data_mod.eval_indices(len(data.test_split.labels), dist.rank, dist.world_size)
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
    with torch.no_grad(), autocast():
        chunks = (idx[i : i + 2 * micro] for i in range(0, len(idx), 2 * micro))
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
        if data.test_data is not None:
            batches = (data.test_data.batch(c, augment=False) for c in chunks)
        else:
            batches = data_mod.loader_batches(
                data.test_split, idx, 2 * micro, False, dc.num_workers, dc.pin_memory, device
            )
        for x, y in batches:
            logits = model(x).float()  # the plain module: ranks may hold different batch counts
            top5 = logits.topk(5, dim=1).indices
            sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
            sums[1] += (top5[:, 0] == y).sum()
            sums[2] += (top5 == y[:, None]).any(dim=1).sum()
            sums[3] += y.numel()
    tdist.all_reduce(sums)
    model.train()
    loss, top1, top5, count = sums.tolist()
    return {"loss": loss / count, "top1": 100 * top1 / count, "top5": 100 * top5 / count, "images": int(count)}
