"""The trainer's small parts, each owning one job and its state:
- TrainState: where the run is (epoch, micro-batch position, optimizer step) and its RNG state;
- DivergenceGuard: the first non-finite loss, checked every step on a CPU, at log steps on a GPU;
- evaluate(): every test image exactly once across ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from hpc.placement.distenv import DistEnv
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
