"""Whether a run's step runs as a replayed CUDA graph (train.cuda_graph: auto | true | false), decided once,
before the process group exists, from the config and what the machine has. No torch import: the NCCL
version comes in as a tuple, so every case is tested on literal values.

What capture needs, and why (hpc/training/graph/cudagraph.py does the capture):
- a CUDA device: a graph is CUDA work; the CPU (and gloo, which only CPU runs use here) runs eager;
- NCCL >= 2.9.6 when DDP's all-reduce is captured (NCCL's CUDA graph support; PyTorch's DDP capture
  recipe); NCCL >= 2.26 also keeps a communicator alive until every graph using it is released, and the
  trainer releases its graph before the process group at the end of a run that finished its steps;
- whole steps (train.grad_accum_steps = 1): a graph is one micro-batch's forward, backward and step;
- static shapes and no graph of its own: no torch.compile (its dynamic shapes and its own cudagraphs);
- batches already on the device (data.loader: device): a DataLoader's pinned host batches and worker
  processes are the host work a graph exists to remove, and its batch shapes are the loader's to vary.
A smaller last batch of an epoch runs eagerly (the trainer checks each batch's shape). Before its first
counted step a graphed run checks the graph against an eager step (hpc/training/graph/graphcheck.py).

Capture is CUDA's (`CUDA_GRAPH`), or where a process names another in HPC_GRAPH_CAPTURE (module:name of a
`Capture`), that one on a machine without CUDA: the one seam through which the tests bring their CPU
stand-in (a step replayed eagerly where a graph would be), so the check and the fallback to eager run for
real on the CPU; the stand-in is the tests' own.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from hpc.core.errors import UsageError
from hpc.settings.schema import RunConfig

if TYPE_CHECKING:  # no torch at run time: the decision is made before torch's set-up
    from hpc.training.graph.cudagraph import GraphedStep

MIN_NCCL = (2, 9, 6)  # NCCL's first release whose collectives can be captured in a CUDA graph
# DDP's eager iterations before capture, from PyTorch's recipe for capturing DDP (CUDA semantics notes,
# "Usage with DistributedDataParallel"): DDP rebuilds its gradient buckets after its first iteration and
# samples runtime statistics in its early ones; neither can happen inside a capture.
DDP_WARMUP_ITERS = 11


CAPTURE_VARIABLE = "HPC_GRAPH_CAPTURE"


@dataclasses.dataclass(frozen=True)
class Capture:
    """How graph mode captures and replays the whole step: `name` (said in the step mode's line), whether it
    needs a CUDA device, and `build` (the step, the model, the optimizer, the warm-up iterations -> a
    GraphedStep; None: CUDA's own, hpc/training/build.py graph_step)."""

    name: str
    needs_cuda: bool = True
    build: Callable[..., GraphedStep] | None = None


CUDA_GRAPH = Capture("a CUDA graph")


def capture_in_use(env: Mapping[str, str]) -> Capture:
    """CUDA's capture, or the one HPC_GRAPH_CAPTURE names (module:name of a Capture); UsageError in one line
    where it names none."""
    spec = env.get(CAPTURE_VARIABLE) or ""
    if not spec:
        return CUDA_GRAPH
    module, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), name) if module and name else None
    except (ImportError, AttributeError) as e:
        raise UsageError(f"{CAPTURE_VARIABLE}={spec!r}: {' '.join(str(e).split())}") from None
    if not isinstance(found, Capture):
        raise UsageError(f"{CAPTURE_VARIABLE}={spec!r}: names no Capture (module:name, as graphmode.Capture)")
    return found


@dataclasses.dataclass(frozen=True)
class GraphMode:
    """The decision: `on`, `line` (one line for the log saying what runs and why), and the capture it uses."""

    on: bool
    line: str
    capture: Capture = CUDA_GRAPH

    @property
    def captures(self) -> bool:
        """Whether a CUDA graph is captured (not another capture's step)."""
        return self.on and self.capture.needs_cuda


def nccl_text(version: tuple[int, ...] | None) -> str:
    return "no NCCL" if version is None else "NCCL " + ".".join(str(v) for v in version)


def graph_obstacle(cfg: RunConfig, use_cuda: bool, nccl: tuple[int, ...] | None, needs_cuda: bool = True) -> str | None:
    """What keeps this run from capturing its step (a phrase), or None when nothing does."""
    tc = cfg.train
    problems = [
        (not use_cuda and needs_cuda, "no CUDA device in use"),
        (
            use_cuda and (nccl is None or tuple(nccl) < MIN_NCCL),
            f"{nccl_text(nccl)} (capturing DDP needs >= {'.'.join(map(str, MIN_NCCL))})",
        ),
        (tc.grad_accum_steps > 1, f"train.grad_accum_steps = {tc.grad_accum_steps}"),
        (cfg.model.compile, "model.compile = true"),
        (cfg.data.loader != "device", f"data.loader = {cfg.data.loader!r} (needs 'device')"),
    ]
    return next((why for bad, why in problems if bad), None)


def decide_graph_mode(
    cfg: RunConfig, use_cuda: bool, nccl: tuple[int, ...] | None, capture: Capture = CUDA_GRAPH
) -> GraphMode:
    """train.cuda_graph resolved: true that cannot run is a UsageError naming why; auto that cannot
    runs eager and says why; false is eager. On a CUDA device the capture is CUDA's, whatever was given."""
    setting = cfg.train.cuda_graph
    if setting is False:
        return GraphMode(False, "step mode: eager (train.cuda_graph = false)")
    capture = CUDA_GRAPH if use_cuda else capture
    obstacle = graph_obstacle(cfg, use_cuda, nccl, capture.needs_cuda)
    if obstacle is not None and setting is True:
        raise UsageError(f"train.cuda_graph = true does not work with {obstacle}")
    if obstacle is not None:
        return GraphMode(False, f"step mode: eager; train.cuda_graph = auto, and a graph does not work with {obstacle}")
    shown = "true" if setting is True else "auto"
    if not capture.needs_cuda:
        return GraphMode(
            True,
            f"step mode: graph by {capture.name} (train.cuda_graph = {shown}; {CAPTURE_VARIABLE}, no CUDA)",
            capture,
        )
    return GraphMode(True, f"step mode: graph (train.cuda_graph = {shown}; DDP captured with {nccl_text(nccl)})")
