"""The training run of one rank as a Trainer of named parts (the shape of torchtitan's Trainer).

`Trainer(cfg, run_dir, dist, stop)` sets up the device, the process group, the data, the model and
the optimizer, and resumes from a checkpoint; `train()` is the loop, `close()` the teardown. The parts
own their policy and state and get only their config section:
- TrainState: where the run is (epoch, micro-batch position in the epoch, optimizer step);
- Checkpointer (hpc/checkpoint.py): when to save, the atomic save, the checked load;
- MetricsLog: metrics.jsonl and TensorBoard scalars, on rank 0;
- StepTimer: optimizer-step times, CUDA events on a GPU (no per-step sync), perf_counter on a CPU;
- DivergenceGuard: the first non-finite loss, checked every step on a CPU, at log steps on a GPU;
- evaluate(): every test image exactly once across ranks;
- rank_record(): this rank's entry of summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path

from hpc.checkpoint import Checkpointer, restore, rng_state, set_rng_state
from hpc.cli import UsageError
from hpc.config import RunConfig, TrainConfig, dump_yaml, write_atomic
from hpc.distenv import DistEnv
from hpc.oom import maybe_inject_fault, start_memory_history

EXIT_PREEMPTED = 3


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss...): one line, exit 1."""


def lr_factor(step: int, total_steps: int, warmup_steps: int, cfg: TrainConfig) -> float:
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if cfg.schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if cfg.schedule == "multistep":
        return 0.1 ** sum(progress >= m for m in cfg.milestones)
    return 1.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def batch_plan(tc: TrainConfig, world: int) -> tuple[int, int]:
    """(images per rank per optimizer step, images per micro-batch), or UsageError naming the values."""
    if tc.batch_scope == "global" and tc.batch_size % world:
        raise UsageError(f"train.batch_size = {tc.batch_size} (global) does not divide by {world} ranks")
    per_gpu = tc.batch_size if tc.batch_scope == "per_gpu" else tc.batch_size // world
    if per_gpu % tc.grad_accum_steps:
        raise UsageError(f"train.batch_size = {tc.batch_size}: {per_gpu} per GPU does not divide into "
                         f"train.grad_accum_steps = {tc.grad_accum_steps} micro-batches")
    return per_gpu, per_gpu // tc.grad_accum_steps


def check_cuda_graph_settings(cfg: RunConfig, use_cuda: bool, world: int) -> None:
    """train.cuda_graph needs one CUDA process, whole steps and static shapes (hpc/cudagraph.py)."""
    tc = cfg.train
    problems = [(not use_cuda, "no CUDA device in use"), (world > 1, f"{world} ranks (it runs one process)"),
                (tc.grad_accum_steps > 1, f"train.grad_accum_steps = {tc.grad_accum_steps}"),
                (cfg.model.compile, "model.compile = true"),
                (cfg.data.loader != "device", f"data.loader = {cfg.data.loader!r} (needs 'device')")]
    for bad, why in problems:
        if bad:
            raise UsageError(f"train.cuda_graph = true does not work with {why}")


class StopSignal:
    """SIGTERM/SIGUSR2 (Slurm preemption, time limit) and SIGINT (Ctrl-C) ask for a checkpoint at the
    next step boundary; the same command then resumes. Installed by whoever runs the training and
    handed in, so the handlers are given back afterwards."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def install(self) -> "StopSignal":
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum


# ----------------------------------------------------------------------------------------------
# Set-up: device, process group, optimizer
# ----------------------------------------------------------------------------------------------


def setup_device(tc: TrainConfig, dist: DistEnv):
    """(device, use_cuda), with the backend flags the run asks for."""
    import torch

    use_cuda = tc.device == "cuda" or (tc.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise UsageError("train.device = 'cuda' but no CUDA device is visible")
    if use_cuda:
        device = torch.device("cuda", dist.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        if tc.cuda_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(tc.cuda_memory_fraction, device)
        torch.backends.cudnn.benchmark = not tc.deterministic  # autotuning may pick another algorithm per run
        torch.backends.cudnn.deterministic = tc.deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # several ranks on one CPU must not oversubscribe it
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_world_size))
    if tc.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call
        # warn_only: ops without a deterministic kernel warn rather than stop the run
        torch.use_deterministic_algorithms(True, warn_only=True)
    return device, use_cuda


def init_process_group(dist: DistEnv, use_cuda: bool, timeout_s: int):
    """(backend, control group): NCCL or gloo for the model; stop and divergence flags travel on a CPU
    (gloo) group, so checking them costs no GPU synchronisation."""
    import torch.distributed as tdist

    backend = "nccl" if use_cuda else "gloo"
    timeout = dt.timedelta(seconds=timeout_s)
    if dist.world_size > 1 and dist.elastic_attempt is not None:
        # torchrun's agent hosts the store and keeps it across restarts of the worker group: a restarted
        # group must not read the dead group's addresses (it would connect to closed ports, or hang).
        agent_store = tdist.TCPStore(dist.master_addr, dist.master_port, dist.world_size, is_master=False,
                                     timeout=timeout)
        tdist.init_process_group(backend, store=tdist.PrefixStore(f"hpc/attempt{dist.elastic_attempt}/", agent_store),
                                 rank=dist.rank, world_size=dist.world_size, timeout=timeout)
    elif dist.world_size > 1:
        tdist.init_process_group(backend, init_method=f"tcp://{dist.master_addr}:{dist.master_port}",
                                 rank=dist.rank, world_size=dist.world_size, timeout=timeout)
    else:  # DDP over one process, as the study's 1-GPU runs; a private store needs no port
        tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return backend, (tdist.new_group(backend="gloo", timeout=timeout) if use_cuda else None)


def build_optimizer(model, tc: TrainConfig, base_lr: float, use_cuda: bool):
    import torch

    kwargs = dict(lr=base_lr, momentum=tc.momentum, nesterov=tc.nesterov and tc.momentum > 0,
                  weight_decay=tc.weight_decay)
    try:  # fused SGD on CUDA (one kernel for all parameters) where this torch has it
        return torch.optim.SGD(model.parameters(), **kwargs, **({"fused": True} if use_cuda else {"foreach": False}))
    except (TypeError, RuntimeError):
        return torch.optim.SGD(model.parameters(), **kwargs)


# ----------------------------------------------------------------------------------------------
# Parts
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainState:
    """Where the run is: epoch, micro-batches done in this epoch, optimizer steps done, and the random
    number generators (torch, Python, CUDA) at that point, so a resumed run draws what an uninterrupted
    one would."""

    epoch: int = 0
    position: int = 0
    step: int = 0
    use_cuda: bool = dataclasses.field(default=False, compare=False)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "step": self.step, "rng": rng_state(self.use_cuda)}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state["rng"], self.use_cuda)
        self.epoch, self.position, self.step = state["epoch"], state["position"], state["step"]


class MetricsLog:
    """metrics.jsonl (one JSON record per write) and the same scalars in TensorBoard; rank 0 only."""

    def __init__(self, run_dir: Path, enabled: bool, purge_step: int):
        self.path = run_dir / "metrics.jsonl"
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step or None)

    def record(self, kind: str, values: dict, step: int, epoch: int) -> None:
        if self.writer is None:
            return
        line = json.dumps({"kind": kind, "step": step, "epoch": epoch, "time": time.time(), **values})
        with open(self.path, "a") as f:
            f.write(line + "\n")
        for key, value in values.items():
            if isinstance(value, (int, float)) and value is not None:
                self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class StepTimer:
    """Optimizer-step times. On a GPU an event is recorded after each step and read once at the end
    (after a synchronize); on a CPU the wall time of the step, from its first micro-batch."""

    def __init__(self, use_cuda: bool):
        self.use_cuda = use_cuda
        self.events: list = []
        self.seconds: list[float] = []
        self.started = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()

    def stop(self) -> None:
        if self.use_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self.seconds.append(time.perf_counter() - self.started)

    def times(self) -> list[float]:
        if self.use_cuda:
            import torch

            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.events, self.events[1:])]
        return self.seconds


class DivergenceGuard:
    """Keeps the log interval's micro-batch losses (device tensors) and finds the first non-finite one."""

    def __init__(self, use_cuda: bool):
        self.use_cuda = use_cuda
        self.losses: list = []
        self.steps: list[int] = []

    def add(self, loss, step: int) -> None:
        self.losses.append(loss.detach())
        self.steps.append(step)

    def bad_step(self, at_log: bool, group_size: int) -> int:
        """The optimizer step of the first non-finite loss, or 0. On a GPU only at log steps (a check is
        a sync); on a CPU every step, over that step's micro-batches."""
        import torch

        if self.use_cuda and not at_log:
            return 0
        checked = self.losses if self.use_cuda else self.losses[-group_size:]
        finite = torch.isfinite(torch.stack(checked).float().cpu())
        if bool(finite.all()):
            return 0
        return self.steps[len(self.losses) - len(checked) + int((~finite).nonzero()[0])]

    def mean(self) -> float:
        import torch

        return float(torch.stack(self.losses).float().mean())

    def reset(self) -> None:
        self.losses, self.steps = [], []


def evaluate(model, test_split, test_data, autocast, cfg: RunConfig, micro: int, dist: DistEnv, device) -> dict:
    """Loss, top-1 and top-5 over every test image exactly once across ranks."""
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F

    from hpc import data as data_mod

    model.eval()
    idx = data_mod.eval_indices(len(test_split.labels), dist.rank, dist.world_size)
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
    with torch.no_grad(), autocast():
        chunks = (idx[i:i + 2 * micro] for i in range(0, len(idx), 2 * micro))
        if test_data is not None:
            batches = (test_data.batch(c, augment=False) for c in chunks)
        else:
            batches = data_mod.loader_batches(test_split, idx, 2 * micro, False, cfg.data.num_workers,
                                              cfg.data.pin_memory, device)
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


def weights_digest(model) -> str:
    """sha256 of every tensor of the state: anyone can check that every rank ends with the same weights."""
    import torch

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def step_time_stats(timed: list[float]) -> dict:
    mean = sum(timed) / len(timed) if timed else None
    return {"n": len(timed), "mean": mean, "median": percentile(timed, 0.5), "p90": percentile(timed, 0.9),
            "min": min(timed) if timed else None, "max": max(timed) if timed else None}


def performance_env() -> dict:
    """The environment that shapes performance, for reproducing the run."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(("OMP_", "NCCL_", "FI_", "GLOO_", "HPC_", "TORCH_")) or k == "CUDA_VISIBLE_DEVICES"}


# ----------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------


class Trainer:
    """One rank's run. Build it, call train(), then close() (in a finally)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, dist: DistEnv, stop: StopSignal):
        self.cfg, self.tc, self.run_dir, self.dist, self.stop = cfg, cfg.train, run_dir, dist, stop
        self.is_main = dist.rank == 0
        self.per_gpu, self.micro = batch_plan(self.tc, dist.world_size)  # checked before any rendezvous
        self.metrics = None
        self.device, self.use_cuda = setup_device(self.tc, dist)
        if self.tc.cuda_graph:
            check_cuda_graph_settings(cfg, self.use_cuda, dist.world_size)
        self.backend, self.control = init_process_group(dist, self.use_cuda, self.tc.collective_timeout_s)
        start_memory_history(cfg.profiler.memory_snapshot, self.use_cuda)
        self._setup_data()
        self._setup_model()
        self.state = TrainState(use_cuda=self.use_cuda)
        self.checkpointer = Checkpointer(run_dir, self.tc.checkpoint_every_steps, self.is_main, self.barrier,
                                         self.log)
        self.resumed_from_step = self._resume()
        self._setup_graph()
        self.metrics = MetricsLog(run_dir, self.is_main, self.state.step)
        self.timer = StepTimer(self.use_cuda)
        self.guard = DivergenceGuard(self.use_cuda)

    # --- set-up ----------------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def barrier(self) -> None:
        import torch.distributed as tdist

        tdist.barrier(group=self.control)

    def _setup_data(self) -> None:
        from hpc import data as data_mod

        tc, world = self.tc, self.dist.world_size
        root = self.cfg.data.resolved_root()
        data_mod.check_root(root)  # on every rank: not only rank 0 may fail before the barrier below
        if self.cfg.data.synthesize_if_missing and not data_mod.has_dataset(root) and self.dist.local_rank == 0:
            data_mod.prepare_synth_dir(root)
            self.log(f"no CIFAR-100 under {root}: writing a synthetic set in its format")
            data_mod.synthesize(root, self.cfg.data.synth_train, self.cfg.data.synth_test, seed=tc.seed)
        self.barrier()
        self.train_split, self.test_split, class_names = data_mod.load_cifar100(root)
        if self.cfg.model.num_classes != len(class_names):  # labels past the last logit fail deep in the loss
            raise UsageError(f"model.num_classes = {self.cfg.model.num_classes} but the data under {root} has "
                             f"{len(class_names)} classes")
        self.subset = data_mod.balanced_subset(self.train_split.labels, self.cfg.data.fraction, seed=tc.seed)
        self.global_batch = self.per_gpu * world
        self.batches_per_epoch = math.ceil(math.ceil(len(self.subset) / world) / self.micro)
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / tc.grad_accum_steps)
        self.total_steps = self.steps_per_epoch * tc.epochs  # the schedule's length; max_steps only truncates
        self.stop_at = min(self.total_steps, tc.max_steps or self.total_steps)
        model_cfg = self.cfg.model
        self.channels_last = model_cfg.channels_last == "on" or (model_cfg.channels_last == "auto" and self.use_cuda)
        self.on_device = self.cfg.data.loader == "device"
        make = data_mod.DeviceBatches if self.on_device else None
        self.train_data = make(self.train_split, self.device, self.channels_last) if make else None
        self.test_data = make(self.test_split, self.device, self.channels_last) if make else None

    def _setup_model(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from hpc.model import build_model

        tc = self.tc
        torch.manual_seed(tc.seed)
        self.model = build_model(self.cfg.model).to(self.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        if tc.cuda_graph:  # one process: DDP would only copy gradients, and its hooks cannot be captured
            self.ddp, self.forward = None, self.model
        else:
            self.ddp = DDP(self.model, device_ids=[self.device.index] if self.use_cuda else None,
                           bucket_cap_mb=tc.ddp_bucket_cap_mb, gradient_as_bucket_view=tc.ddp_gradient_as_bucket_view,
                           static_graph=tc.ddp_static_graph)
            self.forward = torch.compile(self.ddp) if self.cfg.model.compile else self.ddp
        self.base_lr = tc.lr if tc.lr is not None else tc.lr_per_256 * self.global_batch / 256
        self.optimizer = build_optimizer(self.model, tc, self.base_lr, self.use_cuda)
        warmup_steps = int(round(tc.warmup_epochs * self.steps_per_epoch))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.total_steps, warmup_steps, tc))
        self.amp_dtype = torch.bfloat16 if (tc.amp == "bf16" or (tc.amp == "auto" and self.use_cuda)) else None

    def autocast(self):
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        # autocast's cast cache must be off while a CUDA graph is captured
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype, cache_enabled=not self.tc.cuda_graph)

    def _resume(self) -> int:
        """Load the checkpoint if there is one (the step it was at), else write the run's config."""
        ckpt = self.checkpointer.load()
        if ckpt is None:
            if self.is_main:
                write_atomic(self.run_dir / "config.yaml", dump_yaml(self.cfg.to_dict()))
            return 0
        restore(self.checkpointer.path, ckpt, self.model, self.optimizer, self.scheduler, self.state)
        self.log(f"resuming from {self.checkpointer.path}: epoch {self.state.epoch}, batch {self.state.position}, "
                 f"step {self.state.step}")
        return self.state.step

    def _setup_graph(self) -> None:
        self.graphed = None
        if self.tc.cuda_graph:
            from hpc.cudagraph import GraphedStep, lr_on_device, whole_step

            lr_on_device(self.optimizer, self.device)  # after any checkpoint load, which brings the rate to the CPU
            self.graphed = GraphedStep(whole_step(self.forward, self.optimizer, self.autocast), self.model,
                                       self.optimizer)

    def checkpoint_state(self) -> dict:
        return {
            "model": self.model.state_dict(),  # the plain module: no DDP "module." prefix
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": None,  # bf16 autocast needs no loss scaling
            **self.state.state_dict(),  # epoch, position, step, rng
            "config": self.cfg.to_dict(),
            "world_size": self.dist.world_size,
        }

    def checkpoint(self, reason: str) -> None:
        self.checkpointer.save(self.checkpoint_state(), reason)

    def sync_buffers(self) -> None:
        # DDP broadcasts buffers (BatchNorm running stats) from rank 0 at the *start* of each forward,
        # so after the last step every rank holds its own. Do that broadcast now, so evaluation and the
        # final weights are rank 0's everywhere.
        import torch.distributed as tdist

        if self.dist.world_size > 1:
            for buf in self.model.buffers():
                tdist.broadcast(buf, 0)

    def all_max(self, values: list[int]) -> list[int]:
        import torch
        import torch.distributed as tdist

        t = torch.tensor(values, dtype=torch.int64)
        if self.dist.world_size > 1:
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=self.control)
        return t.tolist()

    # --- the loop ----------------------------------------------------------------------------------
    def train(self) -> int:
        from hpc.profiling import maybe_profile

        st, tc = self.state, self.tc
        if st.step >= self.stop_at:
            self.log(f"{self.run_dir}: already complete at step {st.step} of {self.stop_at}; nothing to do")
            return 0
        self.log_start()
        self.stopped_by = None
        self.t_start = self.t_log = time.perf_counter()
        self.images_since_log = 0
        self.model.train()
        with maybe_profile(self.cfg.profiler, self.run_dir / "traces", self.dist.rank, self.use_cuda) as profiling:
            self.profiling = profiling
            while st.epoch < tc.epochs and st.step < self.stop_at and self.stopped_by is None:
                self.run_epoch()
            exit_code = 0
            if self.stopped_by:
                self.checkpoint(f"signal {signal.Signals(self.stop.signum).name}")
                exit_code = EXIT_PREEMPTED
            cycles = profiling.cycles if profiling is not None else []
            peaks = profiling.run_peak_bytes if profiling is not None else {"allocated": 0, "reserved": 0}
        return self.finish(exit_code, cycles, peaks)

    def log_start(self) -> None:
        cfg, dist = self.cfg, self.dist
        self.log(f"training {cfg.model.arch} ({cfg.model.stem} stem) on {len(self.subset)} images "
                 f"(fraction {cfg.data.fraction:g}), {dist.world_size} rank(s) [{dist.launcher}], {self.backend} on "
                 f"{self.device.type}, batch {self.per_gpu}/GPU = {self.global_batch} global, lr {self.base_lr:g}, "
                 f"{self.steps_per_epoch} steps/epoch, steps {self.state.step} -> {self.stop_at}")

    def epoch_batches(self, order):
        """This rank's micro-batches of the epoch from the current position on."""
        from hpc import data as data_mod

        st, data_cfg = self.state, self.cfg.data
        if not self.on_device:
            yield from data_mod.loader_batches(self.train_split, order[st.position * self.micro:], self.micro,
                                               data_cfg.augment, data_cfg.num_workers, data_cfg.pin_memory, self.device)
            return
        while True:  # positions advance as the loop consumes
            p = st.position
            seed = data_mod.batch_seed(self.tc.seed, st.epoch, p, self.dist.rank)
            yield self.train_data.batch(order[p * self.micro:(p + 1) * self.micro], data_cfg.augment, seed)

    def run_epoch(self) -> None:
        import torch

        from hpc import data as data_mod

        st, tc = self.state, self.tc
        order = self.subset[data_mod.shard_indices(len(self.subset), self.dist.rank, self.dist.world_size,
                                                   st.epoch, tc.seed)]
        t_epoch = time.perf_counter()
        self.epoch_loss_sum = torch.zeros((), device=self.device)  # summed on the device: no per-step sync
        self.epoch_batches_done = self.epoch_images = 0
        batches = self.epoch_batches(order)
        while st.position < self.batches_per_epoch:
            if st.position % tc.grad_accum_steps == 0:  # an optimizer step's first micro-batch, data included
                self.timer.start()
                maybe_inject_fault(st.step + 1, self.per_gpu, self.dist.world_size)
            if self.micro_step(*next(batches)) == "stop":
                break
        if st.position >= self.batches_per_epoch:
            self.end_epoch(time.perf_counter() - t_epoch)
        elif self.stopped_by is None and st.step >= self.stop_at:
            self.checkpoint("max steps")

    def micro_step(self, x, y) -> str | None:
        """One micro-batch; after the last of an optimizer step, the step's bookkeeping."""
        import torch.nn.functional as F

        st, tc = self.state, self.tc
        group_start = (st.position // tc.grad_accum_steps) * tc.grad_accum_steps
        group_size = min(tc.grad_accum_steps, self.batches_per_epoch - group_start)
        last_micro = st.position == group_start + group_size - 1
        stepped = self.graphed is not None and y.numel() == self.micro  # a smaller last batch runs eagerly
        if stepped:
            loss = self.graphed(x, y).clone()  # forward, backward and optimizer step in one replay
        else:
            if self.graphed is not None:  # .grad holds the graph's last gradients: do not add to them
                self.optimizer.zero_grad(set_to_none=True)
            with contextlib.nullcontext() if (last_micro or self.ddp is None) else self.ddp.no_sync():
                with self.autocast():
                    loss = F.cross_entropy(self.forward(x), y)
                (loss / group_size).backward()
        self.guard.add(loss, st.step + 1)
        self.epoch_loss_sum += loss.detach().float()
        self.epoch_batches_done += 1
        images = y.numel() * self.dist.world_size
        self.epoch_images += images
        self.images_since_log += images
        st.position += 1
        if not last_micro:
            return None
        return self.optimizer_step(stepped, group_size)

    def optimizer_step(self, stepped: bool, group_size: int) -> str | None:
        """The step's end: optimizer (unless the graph did it), schedule, profiler, timing, the divergence
        and stop flags agreed across ranks, logging, the checkpoint policy. "stop" ends the epoch loop."""
        st, tc = self.state, self.tc
        if not stepped:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        st.step += 1
        if self.profiling is not None:
            self.profiling.step()
        self.timer.stop()
        at_log = st.step % tc.log_every_steps == 0 or st.step == self.stop_at
        bad_step = self.guard.bad_step(at_log, group_size)
        stop_flag, bad, bad_rank = self.all_max([1 if self.stop.signum else 0, bad_step,
                                                  self.dist.rank if bad_step else -1])
        if bad:
            kept = (f"last good checkpoint: {self.checkpointer.path}" if self.checkpointer.path.exists()
                    else "no checkpoint was written before it")
            raise TrainingError(f"non-finite loss at step {bad} on rank {bad_rank}; {kept}")
        if at_log:
            self.log_interval()
        if stop_flag:
            self.stopped_by = "signal"
            return "stop"
        if self.checkpointer.due(st.step):
            self.checkpoint("periodic")
        return "stop" if st.step >= self.stop_at else None

    def log_interval(self) -> None:
        st = self.state
        if self.is_main:
            now = time.perf_counter()
            mean_loss = self.guard.mean()
            ips = self.images_since_log / max(now - self.t_log, 1e-9)
            eta = (self.stop_at - st.step) * (now - self.t_start) / max(1, st.step - self.resumed_from_step)
            lr = float(self.scheduler.get_last_lr()[0])
            line = (f"step {st.step}/{self.stop_at} epoch {st.epoch + 1}/{self.tc.epochs} loss {mean_loss:.4f} "
                    f"lr {lr:.4g} img/s {ips:.0f} eta {format_duration(eta)}")
            tty = sys.stdout.isatty()
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            self.metrics.record("train", {"loss": mean_loss, "lr": lr, "images_per_s": ips}, st.step, st.epoch)
            self.t_log, self.images_since_log = now, 0
        self.guard.reset()

    def end_epoch(self, epoch_time: float) -> None:
        st = self.state
        st.epoch, st.position = st.epoch + 1, 0
        if sys.stdout.isatty() and self.is_main:
            print()
        metrics = {"epoch_time_s": epoch_time, "images_per_s": self.epoch_images / max(epoch_time, 1e-9),
                   "train_loss": float(self.epoch_loss_sum) / max(self.epoch_batches_done, 1)}
        if self.tc.eval:
            self.sync_buffers()
            result = evaluate(self.model, self.test_split, self.test_data, self.autocast, self.cfg, self.micro,
                              self.dist, self.device)
            metrics.update({f"eval_{k}": v for k, v in result.items()})
        self.metrics.record("epoch", metrics, st.step, st.epoch)
        self.log(f"epoch {st.epoch} done in {format_duration(epoch_time)}: " + ", ".join(
            f"{k} {v:.4g}" for k, v in metrics.items() if k != "epoch_time_s"))
        # (a resumed epoch's loss and images/s cover the batches run since the restart)
        self.checkpoint("epoch end")

    # --- the end -----------------------------------------------------------------------------------
    def finish(self, exit_code: int, cycles: list, peaks: dict) -> int:
        """summary.json (one record per rank, gathered to rank 0), the closing lines, a joint teardown."""
        import torch.distributed as tdist

        wall = time.perf_counter() - self.t_start
        record = self.rank_record(exit_code, cycles, peaks, wall)
        self.sync_buffers()
        record["weights_sha256"] = weights_digest(self.model)
        records = [None] * self.dist.world_size
        tdist.all_gather_object(records, record, group=self.control)
        if self.is_main:
            summary_path = self.run_dir / "summary.json"
            write_atomic(summary_path, json.dumps({"run_dir": str(self.run_dir), "world_size": self.dist.world_size,
                                                   "config": self.cfg.to_dict(), "ranks": records}, indent=2))
            self.metrics.close()
            outcome = "stopped by signal, checkpoint written (rerun to resume)" if exit_code else "done"
            print(f"{outcome}\n  run:        {self.run_dir}\n  traces:     {self.run_dir / 'traces'}\n"
                  f"  summary:    {summary_path}\n  checkpoint: {self.checkpointer.path}", flush=True)
        self.barrier()  # tear down together: a peer closing its sockets early upsets gloo's threads
        return exit_code

    def rank_record(self, exit_code: int, cycles: list, peaks: dict, wall: float) -> dict:
        import torch

        dist, cfg, use_cuda, device = self.dist, self.cfg, self.use_cuda, self.device
        step_times = self.timer.times()
        timed = step_times[1:] if len(step_times) > 2 else step_times  # the first step warms caches
        stats = step_time_stats(timed)
        mean_step = stats["mean"]
        return {
            "rank": dist.rank, "world_size": dist.world_size, "local_rank": dist.local_rank,
            "node_rank": dist.node_rank, "hostname": socket.gethostname(), "launcher": dist.launcher,
            "device": str(device), "device_name": torch.cuda.get_device_name(device) if use_cuda else "cpu",
            "backend": self.backend, "torch": torch.__version__, "arch": cfg.model.arch, "stem": cfg.model.stem,
            "batch_size_per_gpu": self.per_gpu, "global_batch_size": self.global_batch,
            "data_fraction": cfg.data.fraction, "train_images": int(len(self.subset)),
            "steps": self.state.step, "steps_per_epoch": self.steps_per_epoch, "epochs_completed": self.state.epoch,
            "complete": exit_code == 0,
            "step_time_s": stats,
            "images_per_s": self.per_gpu / mean_step if mean_step else None,
            "global_images_per_s": self.global_batch / mean_step if mean_step else None,
            "wall_time_s": wall,
            # The profiler resets the allocator's peaks as each recorded window opens: keep the run's maximum.
            "cuda_max_memory_allocated_bytes":
                max(torch.cuda.max_memory_allocated(device), peaks["allocated"]) if use_cuda else None,
            "cuda_max_memory_reserved_bytes":
                max(torch.cuda.max_memory_reserved(device), peaks["reserved"]) if use_cuda else None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            "env": performance_env(),
            "profiler": {"cycles": cycles,
                         "traces": sorted(p.name for p in (self.run_dir / "traces").glob(f"rank{dist.rank}.*"))},
        }

    def close(self) -> None:
        """Teardown, whatever happened: the TensorBoard writer and the process group."""
        import torch.distributed as tdist

        if self.metrics is not None:
            self.metrics.close()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()
