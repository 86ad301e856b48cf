"""A whole training step (forward, backward, optimizer step) captured once as a CUDA graph and replayed.

Why: ResNet152 on 32x32 images runs ~2,700 small kernels a step, and in eager mode the CPU cannot
issue them as fast as an H100 or A100 runs them (measured on an H100 at batch 128: 62-83 ms a step
eager, 10 ms replayed; README "GPU results"). A replay is one launch. This follows PyTorch's "whole
network capture" recipe (torch.cuda.graphs docs) and its recipe for capturing DDP: the process group
made with TORCH_NCCL_ASYNC_ERROR_HANDLING=0, DDP built on the side stream that the warm-up and the
capture run on, at least 11 eager DDP iterations before capture (hpc/training/graph/graphmode.py decides
when a run is graphed). What is ours is that the warm-up does not change the run: the model, its
buffers and the momentum are put back as they were before, so a graphed run takes the same steps as
an eager one.

Limits: static shapes (a smaller last batch must run eagerly), a learning rate held in a device
tensor (the graph reads it at every replay; the schedule writes it with fill_), and autocast with its
cache off while capturing. Every rank captures and replays at the same steps: a captured all-reduce is
a collective of the ranks that captured it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (images, labels) -> the loss


Snapshot = tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor | None]]]


class GraphedStep:
    """step(x, y) -> loss tensor (overwritten by the next replay: clone it to keep it): captured at the
    first call (`capture`), replayed at every call (`replay`).

    `core(x, y)` must run forward, backward and `optimizer.step()` and return the loss; gradients
    must be None before the first call.
    """

    def __init__(
        self,
        core: Step,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        warmup_iters: int = 3,
        stream: torch.cuda.Stream | None = None,
    ):
        self.core = core
        self.model = model
        self.optimizer = optimizer
        self.warmup_iters = warmup_iters
        self.stream = stream  # the side stream to warm up and capture on (DDP's); None: a new one
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captured = False
        self.x: torch.Tensor | None = None  # the graph's static inputs and output
        self.y: torch.Tensor | None = None
        self.loss: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.captured:
            self.capture(x, y)
        return self.replay(x, y)

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.graph is not None and self.x is not None and self.y is not None and self.loss is not None
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()
        return self.loss

    def snapshot(self) -> Snapshot:
        """The model's state and the momentum, copied: what `restore` puts back."""
        model_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        momentum = [
            (p, self.optimizer.state.get(p, {}).get("momentum_buffer"))
            for group in self.optimizer.param_groups
            for p in group["params"]
        ]
        return model_state, [(p, None if buf is None else buf.clone()) for p, buf in momentum]

    def restore(self, saved: Snapshot) -> None:
        """Back to a snapshot, in place (the graph keeps reading the same tensors)."""
        model_state, momentum = saved
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(model_state[k])
            for p, kept in momentum:
                buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    # A zero buffer makes the next step exactly a first step (buf = grad) when dampening is 0.
                    buf.copy_(kept) if kept is not None else buf.zero_()

    def warm_up(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The eager steps capture needs (cuDNN autotuning, momentum buffers, lazy allocations, DDP's bucket
        rebuild), on (x, y), then undone: the model, its buffers and the momentum are as they were. Runs on
        the current stream; no CUDA needed (tests run it on the CPU with DDP over gloo)."""
        saved = self.snapshot()
        for _ in range(self.warmup_iters):
            self.optimizer.zero_grad(set_to_none=True)
            self.core(x, y)
        self.restore(saved)
        self.optimizer.zero_grad(set_to_none=True)  # backward in the graph allocates .grad from its pool

    def hold(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The static inputs, copies of the first batch."""
        self.x = x.clone()
        self.y = y.clone()
        return self.x, self.y

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The warm-up, then the step recorded (it runs nothing): the state is as before."""
        self.loss = self.record(*self.hold(x, y))
        self.captured = True

    def record(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The warm-up and the recording, on the side stream; the graph's loss tensor."""
        side = self.stream if self.stream is not None else torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.warm_up(x, y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            return self.core(x, y)

    def release(self, wait: bool = True) -> None:
        """Wait for the last replay (`wait`) and drop the graph (and with it its hold on NCCL's
        communicator): before the process group goes, at the end of a run that finished its steps, or
        after a failed graph check (nothing to wait for; a failed capture may leave an error to raise)."""
        if self.graph is not None and wait:
            torch.cuda.synchronize()
        self.graph = None
        self.captured = False


def whole_step(
    forward: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    autocast: Callable[[], contextlib.AbstractContextManager[object]],
) -> Step:
    """core(x, y) -> loss: forward under autocast, cross-entropy, backward, optimizer step; the step
    hpc.train and hpc.bench capture (gradients are neither scaled nor cleared: one micro-batch)."""

    def core(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast():
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return core


def nccl_version(use_cuda: bool = True) -> tuple[int, ...] | None:
    """This torch's NCCL as (major, minor, patch), or None where it has none (or where CUDA is not in
    use). Older torch returns one integer (2708 for 2.7.8; from 2.9 on major*10000 + minor*100 + patch)."""

    if not use_cuda:
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return tuple(int(v) for v in version)
    code = int(version)
    return (
        (code // 10000, code // 100 % 100, code % 100)
        if code >= 20900
        else (code // 1000, code // 100 % 10, code % 100)
    )


def lr_on_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Hold each group's learning rate in a device tensor, which a captured step reads at replay."""

    for group in optimizer.param_groups:
        group["lr"] = torch.as_tensor(float(group["lr"]), dtype=torch.float32, device=device)
