"""The benchmark's configurations and how one is timed (hpc/bench/trainspeed.py runs them): each
`Variant` is the seed scripts' training path or the toolkit's, or one change between them; `run_variant`
builds it, runs warm-up and timed steps on the device (CUDA events after a synchronize) and returns
its figures.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc.core.errors import UsageError
from hpc.settings.schema import ModelConfig, ProfilerConfig, TrainConfig
from hpc.training import inject
from hpc.training.build import ModelParts, graph_step, wrap_ddp
from hpc.training.data import Split
from hpc.training.graph.cudagraph import Step, whole_step
from hpc.training.graph.graphcheck import GraphRun
from hpc.training.graph.graphmode import CUDA_GRAPH, GraphMode, capture_in_use
from hpc.training.profiling import Profiling
from hpc.training.steptimes import percentile

log = logging.getLogger(__name__)

# Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets, by device-name substring.
DEVICE_PEAKS = {
    "H200": {"bf16": 989.0, "tf32": 494.0},
    "H100": {"bf16": 989.0, "tf32": 494.0},  # SXM; PCIe parts are lower
    "A100": {"bf16": 312.0, "tf32": 156.0},
}
CIFAR100_TRAIN_IMAGES = 50_000  # one epoch of the study's full data fraction, for the whole-run figure


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    device_data: bool = False
    bf16: bool = False
    channels_last: bool = False
    fused_sgd: bool = False
    host_sync_every_step: bool = True
    compile: bool = False
    ddp: bool = True
    cuda_graph: bool = False  # the trainer's graphed step: DDP on a side stream, warm-up, capture, check


BASELINE = Variant("baseline")
TOOLKIT = Variant(
    "toolkit", device_data=True, bf16=True, channels_last=True, fused_sgd=True, host_sync_every_step=False
)
SINGLE_CHANGES = [
    dataclasses.replace(BASELINE, name="baseline + device data", device_data=True),
    dataclasses.replace(BASELINE, name="baseline + bf16", bf16=True),
    dataclasses.replace(BASELINE, name="baseline + channels_last", channels_last=True),
    dataclasses.replace(BASELINE, name="baseline + fused SGD", fused_sgd=True),
    dataclasses.replace(BASELINE, name="baseline + no host sync", host_sync_every_step=False),
]
TOOLKIT_NO_DDP = dataclasses.replace(TOOLKIT, name="toolkit without DDP", ddp=False)
TOOLKIT_GRAPH = dataclasses.replace(TOOLKIT, name="toolkit + CUDA graph", cuda_graph=True)
TOOLKIT_COMPILE = dataclasses.replace(TOOLKIT, name="toolkit + compile", compile=True)
PROFILED = "toolkit, profiled"  # the toolkit again, under the profiler's default schedule
REPEAT = "toolkit, again"  # the toolkit again: the run-to-run noise every other difference sits in
MEMORY_VARIANTS = [TOOLKIT, dataclasses.replace(TOOLKIT, name="toolkit, fp32", bf16=False)]


def device_peak_tflops(device_name: str, bf16: bool) -> float | None:
    for key, peaks in DEVICE_PEAKS.items():
        if key in device_name:
            return peaks["bf16" if bf16 else "tf32"]
    return None


def variants_for(cuda: bool, with_compile: bool, only: str | None) -> list[Variant]:
    """The configurations to time, in order; --only picks some by name (unknown names are an error).
    `cuda`: whether graphed configurations can run (a GPU, or the CPU stand-in of HPC_FAULT_INJECT)."""
    known = [BASELINE, TOOLKIT, *SINGLE_CHANGES, TOOLKIT_NO_DDP, TOOLKIT_GRAPH, TOOLKIT_COMPILE]
    chosen = [v for v in known if (v is not TOOLKIT_COMPILE or with_compile) and (cuda or not v.cuda_graph)]
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {v.name for v in known}]
        if unknown or not names:
            raise UsageError(
                f"--only {only!r}: unknown configuration {(unknown or [''])[0]!r}; choose from "
                + ", ".join(repr(v.name) for v in known)
            )
        chosen = [v for v in known if v.name in names and (cuda or not v.cuda_graph)]
    return chosen


@functools.lru_cache(maxsize=2)
def initial_model(arch: str, stem: str) -> tuple[torch.nn.Module, int]:
    """(model on the CPU, forward FLOPs per image), built once: every configuration starts from a copy
    (building ResNet152 takes seconds of CPU time, more than timing it)."""

    from hpc.training.model import build_model, count_flops_per_image

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, stem=stem))
    return model, count_flops_per_image(model)


@dataclasses.dataclass
class Built:
    """A configuration's model, the callable a step runs forward through (DDP, compiled or the bare
    model), its optimizer, forward FLOPs per image, and for a graphed one the trainer's ModelParts."""

    model: torch.nn.Module
    forward: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    flops_per_image: int
    parts: ModelParts | None = None


def build_training(variant: Variant, arch: str, stem: str, device: torch.device) -> Built:

    cuda = device.type == "cuda"
    cpu_model, flops_per_image = initial_model(arch, stem)
    model = copy.deepcopy(cpu_model).to(device)
    if variant.channels_last:
        model = model.to(memory_format=torch.channels_last)
    kwargs = {"fused": True} if (variant.fused_sgd and cuda) else ({"foreach": True} if variant.fused_sgd else {})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kwargs)
    if variant.cuda_graph:  # the trainer's own pieces: DDP on the capture's side stream
        ddp, side = wrap_ddp(model, TrainConfig(), device, cuda, graphed=cuda)
        amp = torch.bfloat16 if variant.bf16 else None
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        parts = ModelParts(model, ddp, ddp, optimizer, schedule, 0.01, amp, device.type, side)
        return Built(model, ddp, optimizer, flops_per_image, parts)
    forward: Callable[..., torch.Tensor] = (
        DDP(model, device_ids=[device.index] if cuda else None) if variant.ddp else model
    )
    if variant.compile:
        forward = torch.compile(forward)
    return Built(model, forward, optimizer, flops_per_image)


def batch_source(
    variant: Variant, split: Split, batch: int, n_steps: int, device: torch.device
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """next_batch(i) -> (x, y) on the device: the device path, or the seed scripts' DataLoader."""

    from hpc.training import data as data_mod

    n = len(split.labels)
    if variant.device_data:
        batches = data_mod.DeviceBatches(split, device, channels_last=variant.channels_last)
        return lambda i: batches.batch((i * batch + np.arange(batch)) % n, augment=True, seed=i)
    order = np.arange((n_steps + 2) * batch) % n
    loader = data_mod.loader_batches(split, order, batch, True, num_workers=2, pin_memory=True, device=device)

    def next_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = next(loader)
        return (x.contiguous(memory_format=torch.channels_last) if variant.channels_last else x), y

    return next_batch


def make_step(variant: Variant, built: Built, device: torch.device) -> Step:
    """step(x, y) -> loss: forward, backward, optimizer step, gradients cleared; for a graphed
    configuration the trainer's step: captured at the first call after its warm-up, checked against an
    eager step (a failed check ends this configuration, as train.cuda_graph = true would), replayed."""

    if built.parts is not None:
        mode = GraphMode(True, "hpc.bench", CUDA_GRAPH if device.type == "cuda" else capture_in_use(os.environ))
        inject.arm_from_env(os.environ, 0, lambda: 0)  # HPC_FAULT_INJECT's graph-* entries, as in the trainer
        graph = GraphRun(graph_step(built.parts, mode, device), TrainConfig(cuda_graph=True))  # a failed check ends it

        def replay(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = graph(x, y)
            assert loss is not None  # a failed check raised
            return loss

        return replay
    autocast = (
        (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16))
        if variant.bf16
        else contextlib.nullcontext
    )
    core = whole_step(built.forward, built.optimizer, autocast)
    optimizer = built.optimizer

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = core(x, y)
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def _stamp(clock: list[Any], k: int, cuda: bool) -> None:  # CUDA events, or host times filled in
    """Mark time k of a step: a CUDA event on the device's clock, else the host's."""
    if cuda:
        clock[k].record()
    else:
        clock[k] = time.perf_counter()


def time_steps(
    step: Step,
    next_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    n_steps: int,
    warmup: int,
    device: torch.device,
    host_sync: bool,
    profiling: Profiling | None,
) -> dict[str, Any]:
    """Run n_steps; per timed step its length and the data's part, on the GPU's clock where there is one."""

    cuda = device.type == "cuda"
    marks = []
    t_start = time.perf_counter()
    for i in range(n_steps):
        if i == warmup and cuda:  # peaks after warm-up: without cuDNN's autotuning workspaces
            torch.cuda.synchronize(device)
            first_peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        clock = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else [None] * 3
        _stamp(clock, 0, cuda)
        x, y = next_batch(i)
        _stamp(clock, 1, cuda)
        loss = step(x, y)
        if host_sync:
            loss.item()  # what `running_loss += loss.item()` costs in the seed scripts
        if profiling is not None:
            profiling.step()
        _stamp(clock, 2, cuda)
        marks.append(clock)
    if cuda:
        torch.cuda.synchronize(device)
    wall_s = time.perf_counter() - t_start
    span = (lambda a, b: a.elapsed_time(b) / 1000) if cuda else (lambda a, b: b - a)
    timed = marks[warmup:]
    out = {
        "step_s": [span(m[0], m[2]) for m in timed],
        "data_s": [span(m[0], m[1]) for m in timed],
        "wall_s": wall_s,
        "peak_bytes": None,
        "steady_peak_bytes": None,
    }
    if cuda:
        steady = torch.cuda.max_memory_allocated(device)
        out.update(peak_bytes=max(first_peak if warmup else 0, steady), steady_peak_bytes=steady)
    return out


def run_variant(
    variant: Variant,
    arch: str,
    stem: str,
    batch: int,
    steps: int,
    warmup: int,
    split: Split,
    device: torch.device,
    profile: bool = False,
    trace_dir: Path | None = None,
) -> dict[str, Any]:

    from hpc.training.profiling import RankChoice, maybe_profile

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    built = build_training(variant, arch, stem, device)
    flops_per_image = built.flops_per_image * 3  # forward + backward (~2x forward)
    next_batch = batch_source(variant, split, batch, warmup + steps, device)
    step = make_step(variant, built, device)
    # the trace directory is created only when profiling (mkdtemp here left an empty one per configuration)
    trace_dir = trace_dir or Path(tempfile.gettempdir()) / "hpc-bench-traces"
    with maybe_profile(ProfilerConfig(enabled=profile), trace_dir, RankChoice(0), cuda) as profiling:
        timing = time_steps(step, next_batch, warmup + steps, warmup, device, variant.host_sync_every_step, profiling)
    del step, built, next_batch
    timed = timing["step_s"]
    mean = sum(timed) / len(timed)
    tflops = flops_per_image * batch / mean / 1e12
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    peak = device_peak_tflops(device_name, variant.bf16) if cuda else None
    return {
        "config": variant.name,
        **dataclasses.asdict(variant),
        "batch": batch,
        "steps": len(timed),
        "images_per_s": batch / mean,
        "step_time_mean_s": mean,
        "step_time_median_s": statistics.median(timed),
        "step_time_p90_s": percentile(timed, 0.9),
        "data_share_pct": 100 * sum(timing["data_s"]) / sum(timed),
        "wall_time_s": timing["wall_s"],
        "peak_memory_bytes": timing["peak_bytes"],
        "steady_peak_memory_bytes": timing["steady_peak_bytes"],
        "model_flops_per_image": flops_per_image,
        "achieved_tflops": tflops,
        "device_peak_tflops": peak,
        "fraction_of_peak": tflops / peak if peak else None,
        "profiled": profile,
    }


def guarded(label: str, batch: int, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One configuration's result, or its error (an OOM at batch 2048, a failed capture): the rest goes on."""
    try:
        return fn()
    except Exception as e:  # CUDA OOM, capture and compile errors all end one configuration only
        message = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        log.info(f"{label:28} batch {batch:5}: failed: {type(e).__name__}: {message[:300]}")
        return {"config": label, "batch": batch, "error": f"{type(e).__name__}: {message[:300]}"}
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
