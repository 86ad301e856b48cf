"""Setting up one rank's run: the step plan (batches and steps), the device, the process group, the data,
the model with DDP, the optimizer and the learning-rate schedule. Each function takes the config
section it needs and returns what it built; the Trainer holds the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc.core.errors import UsageError
from hpc.placement.affinity import THREADS, cores_text, gpu_index, threads_per_rank, usable_cpus
from hpc.placement.distenv import DistEnv
from hpc.settings.rankcommand import NCCL_FABRIC_VARIABLE
from hpc.settings.schema import DataConfig, ModelConfig, RunConfig, TrainConfig
from hpc.training.data import DeviceBatches, Split
from hpc.training.distributed.netcheck import debug_env, read_network, verdict, wants_check
from hpc.training.graph.cudagraph import GraphedStep, lr_on_device, whole_step
from hpc.training.graph.graphmode import DDP_WARMUP_ITERS, GraphMode


def lr_factor(step: int, total_steps: int, warmup_steps: int, cfg: TrainConfig) -> float:
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if cfg.schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if cfg.schedule == "multistep":
        return float(0.1 ** sum(progress >= m for m in cfg.milestones))
    return 1.0


def batch_plan(tc: TrainConfig, world: int) -> tuple[int, int]:
    """(images per rank per optimizer step, images per micro-batch), or UsageError naming the values."""
    if tc.batch_scope == "global" and tc.batch_size % world:
        raise UsageError(f"train.batch_size = {tc.batch_size} (global) does not divide by {world} ranks")
    per_gpu = tc.batch_size if tc.batch_scope == "per_gpu" else tc.batch_size // world
    if per_gpu % tc.grad_accum_steps:
        raise UsageError(
            f"train.batch_size = {tc.batch_size}: {per_gpu} per GPU does not divide into "
            f"train.grad_accum_steps = {tc.grad_accum_steps} micro-batches"
        )
    return per_gpu, per_gpu // tc.grad_accum_steps


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How a run's images become micro-batches and optimizer steps, on every rank alike."""

    per_gpu: int  # images per rank per optimizer step
    micro: int  # images per micro-batch
    grad_accum: int  # micro-batches per optimizer step
    global_batch: int
    batches_per_epoch: int  # micro-batches per rank per epoch
    steps_per_epoch: int
    total_steps: int  # the schedule's length; max_steps only truncates
    stop_at: int

    def group(self, position: int) -> tuple[int, bool]:
        """(micro-batches in the optimizer step of micro-batch `position`, whether it is the step's last):
        an epoch's last step may have fewer."""
        start = (position // self.grad_accum) * self.grad_accum
        size = min(self.grad_accum, self.batches_per_epoch - start)
        return size, position == start + size - 1


def step_plan(tc: TrainConfig, world: int, images: int) -> StepPlan:
    """The StepPlan for `images` training images over `world` ranks (DistributedSampler pads each rank
    to ceil(images / world))."""
    per_gpu, micro = batch_plan(tc, world)
    batches = math.ceil(math.ceil(images / world) / micro)
    steps = math.ceil(batches / tc.grad_accum_steps)
    total = steps * tc.epochs
    return StepPlan(
        per_gpu, micro, tc.grad_accum_steps, per_gpu * world, batches, steps, total, min(total, tc.max_steps or total)
    )


def setup_device(tc: TrainConfig, dist: DistEnv) -> tuple[torch.device, bool]:
    """(device, use_cuda), with the backend flags the run asks for."""

    use_cuda = tc.device == "cuda" or (tc.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise UsageError("train.device = 'cuda' but no CUDA device is visible")
    if use_cuda:  # the GPU next to this rank's cores, where the profile says which (hpc/placement/affinity.py)
        device = torch.device("cuda", gpu_index(os.environ, dist.local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        if tc.cuda_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(tc.cuda_memory_fraction, device)
        # autotuning may pick another algorithm per run: not with deterministic
        torch.backends.cudnn.benchmark = not tc.deterministic and tc.cudnn_autotune != "off"
        torch.backends.cudnn.deterministic = tc.deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
        if THREADS not in os.environ:  # several ranks on one CPU must not oversubscribe it
            torch.set_num_threads(threads_per_rank(len(usable_cpus()), dist.local_world_size))
    if tc.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call
        # warn_only: ops without a deterministic kernel warn rather than stop the run
        torch.use_deterministic_algorithms(True, warn_only=True)
    return device, use_cuda


def nodes_of(dist: DistEnv) -> int:
    return max(1, dist.world_size // max(dist.local_world_size, 1))


def before_process_group(graphed: bool, dist: DistEnv, log_dir: Path) -> bool:
    """The environment NCCL must see before the process group is made: for a graphed run PyTorch's
    recipe for capturing DDP (replayed collectives are never the watchdog's anyway; a dead peer still
    ends the run through the control group), and NCCL's choice of network written to log_dir where
    the run checks it (a run across nodes where the profile says the fabric is there). Returns
    whether it does (check_fabric, after DDP's first broadcast)."""
    if graphed:
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    if not wants_check(os.environ, nodes_of(dist)):
        return False
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(debug_env(os.environ, log_dir, dist.rank))
    return True


def check_fabric(dist: DistEnv, log_dir: Path, agree: Callable[[bool], bool], log: Callable[[str], None]) -> str | None:
    """After the first communicator is up: the network NCCL chose (hpc/training/distributed/netcheck.py); a run across
    nodes whose NCCL uses sockets where the profile says the fabric is there stops here, every rank
    together, or warns. Returns the network, for summary.json."""
    network = read_network(log_dir, dist.rank)
    said = verdict(network, os.environ.get(NCCL_FABRIC_VARIABLE, "off"), nodes_of(dist))
    if agree(said is not None and said[0] == "stop"):
        raise UsageError(said[1] if said else f"rank {dist.rank}: stopping: rank 0's NCCL uses TCP sockets")
    if said:
        log(f"warning: {said[1]}")
    return network


def start_line(
    cfg: RunConfig, where: tuple[DistEnv, str, torch.device], plan: StepPlan, images: int, lr: float, step: int
) -> str:
    """Rank 0's line at the start of training: model, data, ranks, backend, batch, lr and steps."""
    dist, backend, device = where
    data = "images" if cfg.data.source == "cifar100" else "SYNTHETIC images (data.source: synthetic,"
    data += f" fraction {cfg.data.fraction:g})" if "(" in data else f" (fraction {cfg.data.fraction:g})"
    return (
        f"training {cfg.model.arch} ({cfg.model.stem} stem) on {images} {data}, "
        f"{dist.world_size} rank(s) [{dist.launcher}], {backend} on {device.type}, batch "
        f"{plan.per_gpu}/{'GPU' if device.type == 'cuda' else 'rank'} = {plan.global_batch} global, lr "
        f"{lr:g}, {plan.steps_per_epoch} steps/epoch, steps {step} -> {plan.stop_at}"
    )


def placement_line(rank: int, where: Mapping[str, object]) -> str:
    """What each rank says of where it runs, at the start of training."""
    gpu = (
        f"GPU {where['gpu']} of CUDA_VISIBLE_DEVICES={where['cuda_visible_devices']}"
        if where["gpu"] is not None
        else "no GPU"
    )
    return f"rank {rank} on {where['host']}: cores {where['cores']} ({where['ncores']}), {gpu}"


def placement(device: torch.device) -> dict[str, object]:
    """Where this rank runs (summary.json's `affinity`): its host, the cores the OS lets it use, its GPU."""
    cpus = usable_cpus()
    return {
        "host": socket.gethostname(),
        "cores": cores_text(cpus),
        "ncores": len(cpus),
        "gpu": device.index if device.type == "cuda" else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "all"),
    }


@contextlib.contextmanager
def cudnn_heuristics(active: bool) -> Iterator[None]:
    """Inside, cuDNN picks algorithms by its heuristics instead of timing them (train.cudnn_autotune:
    step, for shapes other than the step's); the benchmark flag is put back after."""
    if not active:
        yield
        return

    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


@dataclasses.dataclass
class DataParts:
    """The data a rank trains and evaluates on: both splits, the fraction's indices, and with
    `data.loader: device` the whole uint8 sets on the device."""

    train_split: Split
    test_split: Split
    subset: np.ndarray  # sorted indices of the training images of this data fraction
    train_data: DeviceBatches | None = None  # None: the DataLoader path
    test_data: DeviceBatches | None = None
    source: str = "cifar100"  # what the root holds: cifar100 or synthetic (data.source, checked)


def setup_data(
    dc: DataConfig,
    num_classes: int,
    seed: int,
    dist: DistEnv,
    device: torch.device,
    channels_last: bool,
    barrier: Callable[[], None],
    log: Callable[[str], None],
) -> DataParts:
    """Load CIFAR-100, or with data.source: synthetic a synthetic set in its format (written first when
    missing: one rank per node, the others waiting at `barrier`), and put it where the loader wants it.
    A root that does not hold what data.source says is an error naming it: no silent stand-in."""
    from hpc.training import data as data_mod

    root = dc.resolved_root()
    data_mod.check_root(root)  # on every rank: not only rank 0 may fail before the barrier below
    if dc.source == "synthetic" and not data_mod.has_dataset(root) and dist.local_rank == 0:
        data_mod.prepare_synth_dir(root)
        log(f"data.source: synthetic: writing {dc.synth_train} + {dc.synth_test} synthetic images under {root}")
        data_mod.synthesize(root, dc.synth_train, dc.synth_test, seed=seed)
    barrier()
    train_split, test_split, class_names = data_mod.load_cifar100(root)
    check_source(dc.source, data_mod.is_synthetic(class_names), root)
    if num_classes != len(class_names):  # labels past the last logit fail deep in the loss
        raise UsageError(f"model.num_classes = {num_classes} but the data under {root} has {len(class_names)} classes")
    subset = data_mod.balanced_subset(train_split.labels, dc.fraction, seed=seed)
    if dc.loader != "device":
        return DataParts(train_split, test_split, subset, source=dc.source)
    return DataParts(
        train_split,
        test_split,
        subset,
        data_mod.DeviceBatches(train_split, device, channels_last),
        data_mod.DeviceBatches(test_split, device, channels_last),
        dc.source,
    )


def check_source(source: str, synthetic: bool, root: Path) -> None:
    """The set under the root is what data.source says (a mistyped root must not train on a stand-in)."""
    if synthetic and source != "synthetic":
        raise UsageError(
            f"data root {str(root)!r} holds a synthetic set (written by `python -m hpc.data synth`), not CIFAR-100; "
            "to train on it, set data.source: synthetic"
        )
    if not synthetic and source == "synthetic":
        raise UsageError(
            f"data.source = 'synthetic' but data root {str(root)!r} holds the real CIFAR-100: give another "
            "--data-root, or --set data.source=cifar100 to train on it"
        )


@dataclasses.dataclass
class ModelParts:
    """The model and what trains it: DDP around it, the callable a step runs forward through, the
    optimizer, the schedule, the autocast dtype (None: fp32), and for a graphed run the side stream DDP
    was built on, which the capture runs on too (None: eager)."""

    model: torch.nn.Module
    ddp: DDP
    forward: Callable[..., torch.Tensor]  # DDP, or torch.compile's wrapper of it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    base_lr: float
    amp_dtype: torch.dtype | None
    device_type: str
    capture_stream: torch.cuda.Stream | None = None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast where asked, its cast cache off when a CUDA graph is captured."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        graphed = self.capture_stream is not None
        return torch.autocast(device_type=self.device_type, dtype=self.amp_dtype, cache_enabled=not graphed)


def setup_model(
    mc: ModelConfig,
    tc: TrainConfig,
    plan: StepPlan,
    device: torch.device,
    use_cuda: bool,
    channels_last: bool,
    graphed: bool,
) -> ModelParts:
    """The model (seeded) in DDP, fused SGD where there is one, the schedule. A graphed run builds DDP on
    a side stream, as PyTorch's recipe for capturing DDP asks, and hands that stream to the capture."""

    from hpc.training.model import build_model

    torch.manual_seed(tc.seed)
    model = build_model(mc).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp, side = wrap_ddp(model, tc, device, use_cuda, graphed)
    if not (graphed or mc.compile or tc.ddp_static_graph):  # the graph's warm-up settles them; compile its own
        settle_buckets(ddp, device, channels_last)
    forward = torch.compile(ddp) if mc.compile else ddp
    base_lr = tc.lr if tc.lr is not None else tc.lr_per_256 * plan.global_batch / 256
    optimizer = build_optimizer(model, tc, base_lr, use_cuda)
    warmup_steps = int(round(tc.warmup_epochs * plan.steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, plan.total_steps, warmup_steps, tc))
    amp = torch.bfloat16 if (tc.amp == "bf16" or (tc.amp == "auto" and use_cuda)) else None
    return ModelParts(model, ddp, forward, optimizer, scheduler, base_lr, amp, device.type, side)


# BatchNorm's running stats are made rank 0's where they are read (evaluation, the checkpoint:
# RankGroup.sync_buffers; rank 0's never change by it), not at every forward: one collective a step fewer,
# and the gradient all-reduce is the step's one sync point (where StepClock's own work ends). Newer torch names it
# forward_sync_buffers (and warns at broadcast_buffers); both still sync the buffers once, at DDP's start.
NO_FORWARD_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


def wrap_ddp(
    model: torch.nn.Module, tc: TrainConfig, device: torch.device, use_cuda: bool, graphed: bool
) -> tuple[DDP, torch.cuda.Stream | None]:
    """DDP around the model; for a graphed run built on a side stream, as PyTorch's recipe for capturing
    DDP asks, and that stream (the capture runs on it too; None: eager). hpc.bench builds its graphed
    configuration here as well, so it times the step the trainer runs."""
    side = torch.cuda.Stream(device) if graphed else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        ddp = DDP(
            model,
            device_ids=[device.index] if use_cuda else None,
            bucket_cap_mb=tc.ddp_bucket_cap_mb,
            gradient_as_bucket_view=tc.ddp_gradient_as_bucket_view,
            static_graph=tc.ddp_static_graph,
            **NO_FORWARD_BUFFER_SYNC,
        )
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)  # DDP's broadcast of the weights, done
    return ddp, side


def settle_buckets(ddp: DDP, device: torch.device, channels_last: bool) -> None:
    """One forward and backward pass through DDP before the first step, in eval mode (BatchNorm's running
    stats untouched, no random number drawn), its gradients dropped. DDP lays its gradient buckets out anew
    after its first backward pass; without this pass a process's first step would all-reduce in the initial
    layout and every later one in the rebuilt layout, so a run resumed at step N would sum step N's gradients
    in another order than the uninterrupted run did. Ring all-reduces sum each element in an order set by its
    place in the bucket: beyond two ranks the weights would differ in their last bits (seen at 32 ranks)."""
    x = torch.zeros(1, 3, 32, 32, device=device)  # CIFAR's image shape; the values do not matter
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    ddp.eval()
    ddp(x).float().sum().backward()
    ddp.train()
    ddp.module.zero_grad(set_to_none=True)


def graph_step(net: ModelParts, mode: GraphMode, device: torch.device) -> GraphedStep | None:
    """The whole step, DDP's all-reduce included, to capture at its first call (None: eager); by another
    capture than CUDA's where the mode has one (HPC_GRAPH_CAPTURE: the tests' CPU stand-in)."""
    if not mode.on:
        return None
    core = whole_step(net.forward, net.optimizer, net.autocast)
    if mode.capture.build is not None:  # no CUDA graph: nothing reads the rate at a replay
        return mode.capture.build(core, net.model, net.optimizer, DDP_WARMUP_ITERS)
    lr_on_device(net.optimizer, device)  # after any checkpoint load, which brings the rate to the CPU
    return GraphedStep(core, net.model, net.optimizer, DDP_WARMUP_ITERS, net.capture_stream)


def build_optimizer(model: torch.nn.Module, tc: TrainConfig, base_lr: float, use_cuda: bool) -> torch.optim.Optimizer:

    nesterov = tc.nesterov and tc.momentum > 0
    kwargs: dict[str, Any] = {
        "lr": base_lr,
        "momentum": tc.momentum,
        "nesterov": nesterov,
        "weight_decay": tc.weight_decay,
    }
    try:  # fused SGD on CUDA (one kernel for all parameters) where this torch has it
        return torch.optim.SGD(model.parameters(), **kwargs, **({"fused": True} if use_cuda else {"foreach": False}))
    except (TypeError, RuntimeError):
        return torch.optim.SGD(model.parameters(), **kwargs)
