"""DDP training of ResNet on CIFAR-100 under torch.profiler: `python -m hpc.train --config FILE ...`.

One process per rank, started by srun, torchrun, submitit or plain python; the rank comes from
hpc.distenv. Reads top to bottom: set-up, data, model, resume, the loop, evaluation, the run's files.

Run directory (what the other parts read):
  config.yaml          the resolved config
  traces/              torch.profiler traces, rank{R}.*.pt.trace.json, one per rank per cycle
  metrics.jsonl        one JSON record per epoch (and per log interval), rank 0
  summary.json         per-rank records: step times, images/s, memory, key_averages() totals
  checkpoints/last.pt  model (plain state_dict), optimizer, schedule, position, RNG states
  tensorboard/         scalars for TensorBoard

Exit codes: 0 done, 1 failed (e.g. non-finite loss), 2 bad input, 3 stopped by SIGTERM/SIGUSR2
after writing a checkpoint (run the same command again to resume; jobs requeue on it), 4 CUDA out of
memory (summary.json records it as the run's outcome: hpc/oom.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import random
import resource
import signal
import socket
import sys
import time
from pathlib import Path

from hpc.cli import Parser, UsageError, expected_errors
from hpc.config import (RunConfig, TrainConfig, dump_yaml, load_run_config, parse_override, set_source,
                        write_atomic)
from hpc.distenv import DistEnv, from_environ
from hpc.oom import EXIT_OOM, describe, maybe_inject_oom, record_oom, start_memory_history

EXIT_PREEMPTED = 3
CHECKPOINT = Path("checkpoints") / "last.pt"
# Values that may change between a run and its resumption (they do not change the result); anything
# else must match config.yaml. The whole profiler section may change too.
RESUMABLE_CHANGES = {"data.root", "data.num_workers", "data.pin_memory", "train.max_steps",
                     "train.log_every_steps", "train.checkpoint_every_steps", "train.eval",
                     "train.cuda_memory_fraction"}


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss...): one line, exit 1."""


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

FLAGS = {  # flag -> (config key, type, help)
    "data_root": ("data.root", str, "data root holding cifar-100-python/ (default: $HPC_DATA, $SCRATCH/cifar100, ./data)"),
    "data_fraction": ("data.fraction", str, "fraction of the training set, e.g. 1, 0.5, 1/10"),
    "loader": ("data.loader", str, "device (whole set on the device) or dataloader (workers)"),
    "arch": ("model.arch", str, "resnet18|resnet34|resnet50|resnet101|resnet152|tiny"),
    "stem": ("model.stem", str, "torchvision (the study's) or cifar (3x3 stem, ~16x FLOPs)"),
    "batch_size": ("train.batch_size", int, "images per optimizer step, per GPU or global (--batch-scope)"),
    "batch_scope": ("train.batch_scope", str, "per_gpu (the study's) or global"),
    "epochs": ("train.epochs", int, "epochs"),
    "max_steps": ("train.max_steps", int, "stop after N optimizer steps in total (checkpoint written)"),
    "lr": ("train.lr", float, "learning rate (default: lr_per_256 x global batch / 256)"),
    "grad_accum_steps": ("train.grad_accum_steps", int, "micro-batches per optimizer step"),
    "device": ("train.device", str, "auto|cpu|cuda"),
    "seed": ("train.seed", int, "seed for init, data order and augmentation"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python -m hpc.train",
        description="DDP training of ResNet on CIFAR-100 under torch.profiler. Precedence: flags > --config > "
        "defaults. Running the same command with the same --run-dir resumes from checkpoints/last.pt.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad input, 3 stopped by SIGTERM/SIGUSR2 with a checkpoint, "
        "4 CUDA out of memory (recorded in summary.json).",
    )
    parser.add_argument("--run-dir", help="run directory (default: runs/train/<job id or time>)")
    add_training_flags(parser)
    return parser.parse_args(argv)


def add_training_flags(parser) -> None:
    """The run-config flags, declared once: `hpc.train` and `hpc.submit` (which forwards them) share them.
    `overrides_from_args` turns them back into config keys."""
    parser.add_argument("--config", help="run config YAML (e.g. profiles/smoke.yaml)")
    for name, (key, typ, text) in FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=f"{text} [{key}]")
    parser.add_argument("--no-profile", action="store_true", help="switch torch.profiler off [profiler.enabled]")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model [model.compile]")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic cuDNN/cuBLAS algorithms, for bit-identical GPU resumes [train.deterministic]")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config value (repeatable)")


def overrides_from_args(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    out = [(*parse_override(s), set_source(s)) for s in args.set]
    for name, (key, _, _) in FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            out.append((key, value, f"--{name.replace('_', '-')}"))
    if args.no_profile:
        out.append(("profiler.enabled", False, "--no-profile"))
    if args.compile:
        out.append(("model.compile", True, "--compile"))
    if args.deterministic:
        out.append(("train.deterministic", True, "--deterministic"))
    return out


def default_run_dir(env, dist: DistEnv) -> Path:
    job = env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or env.get("TORCHELASTIC_RUN_ID")
    if job:
        return Path("runs") / "train" / job
    if dist.world_size > 1:
        raise UsageError("several ranks but no job id to agree on a run directory: pass --run-dir")
    return Path("runs") / "train" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


RUN_DIR_ENTRIES = {"config.yaml", "checkpoints", "summary.json", "metrics.jsonl", "traces", "tensorboard"}


def check_is_run_dir(path: Path) -> None:
    """An existing --run-dir is empty or a run directory: training writes config.yaml, checkpoints/ and
    more into it, and must not scatter them into a directory of other things (`--run-dir ~`)."""
    if path.is_dir():
        names = {p.name for p in path.iterdir()}
        if names and not names & RUN_DIR_ENTRIES:
            shown_names = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise UsageError(f"--run-dir {str(path)!r}: holds other files ({shown_names}), not a run; "
                             "give a new directory, or an existing run's to resume it")


def prepare_run_dir(path: Path) -> Path:
    try:
        (path / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"run directory {str(path)!r} is not writable ({e.strerror or e})") from None
    return path


def check_resumable(run_dir: Path, cfg: RunConfig) -> None:
    """A run directory holds one run: resuming it with another config would silently mix two."""
    saved_path = run_dir / "config.yaml"
    if not (run_dir / CHECKPOINT).exists() or not saved_path.exists():
        return
    from hpc.config import ConfigError, read_yaml

    try:
        saved = read_yaml(saved_path)
    except ConfigError as e:
        raise UsageError(f"{e}; this run directory's saved config is damaged: use another --run-dir") from None
    new = cfg.to_dict()
    for section, body in new.items():
        for key, value in body.items():
            old = (saved.get(section) or {}).get(key, value)
            if section != "profiler" and f"{section}.{key}" not in RESUMABLE_CHANGES and old != value:
                raise UsageError(f"{run_dir}: holds a run with {section}.{key} = {old!r}, not {value!r}; "
                                 "use another --run-dir or the same settings to resume")


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


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


class StopSignal:
    """SIGTERM/SIGUSR2 (Slurm preemption, time limit) and SIGINT (Ctrl-C) ask for a checkpoint at the
    next step boundary; the same command then resumes."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def install(self) -> "StopSignal":
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def restore(self) -> None:
        """Give the process its handlers back (training may run inside a longer-lived process)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum


def _fault_injection_kill_during_write(tmp: Path, data: bytes) -> None:
    """Test hook (HPC_FAULT_INJECT=kill-during-checkpoint): die half-way through writing a checkpoint."""
    with open(tmp, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic: torch.save to a temp file, fsync, rename. A crash leaves the previous checkpoint."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    if os.environ.get("HPC_FAULT_INJECT") == "kill-during-checkpoint" and path.exists():
        _fault_injection_kill_during_write(tmp, data)
    write_atomic(path, data)


CHECKPOINT_KEYS = {"model": dict, "optimizer": dict, "scheduler": dict, "epoch": int, "position": int, "step": int,
                   "rng": dict}


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, checked for what resuming needs; None if there is none. A file that is
    damaged, foreign or incomplete is an input error naming it, and is left as it is."""
    import torch

    if not path.exists():
        return None
    if not path.is_file():
        raise UsageError(f"{path}: not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged or foreign file
        # (not torch's own message: it suggests weights_only=False, i.e. running the file's code)
        raise UsageError(f"{path}: not a checkpoint this toolkit can load ({type(e).__name__}); "
                         "move it away to start afresh") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"{path}: not a checkpoint (holds a {type(ckpt).__name__}, not a mapping)")
    for key, kind in CHECKPOINT_KEYS.items():
        if not isinstance(ckpt.get(key), kind) or isinstance(ckpt.get(key), bool):
            raise UsageError(f"{path}: checkpoint entry {key!r} is "
                             f"{'missing' if key not in ckpt else type(ckpt[key]).__name__}, expected {kind.__name__}")
    if min(ckpt["epoch"], ckpt["position"], ckpt["step"]) < 0:
        raise UsageError(f"{path}: negative epoch/position/step in the checkpoint")
    return ckpt


def restore(path: Path, ckpt: dict, model, optimizer, scheduler, use_cuda: bool) -> None:
    """Load the checkpoint's states (weights, optimizer, schedule, RNG) into the run's objects; a
    mismatch (another architecture, a tensor of another shape) names the file, not a traceback."""
    import torch

    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in rng["python"]))
        if use_cuda and rng.get("cuda") is not None:
            torch.cuda.set_rng_state(rng["cuda"])
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        raise UsageError(f"{path}: does not fit this run's model or optimizer "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None


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


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def train(cfg: RunConfig, run_dir: Path, dist: DistEnv, stop: StopSignal | None = None) -> int:
    """The run, from set-up to summary; `stop` says when a signal asked it to checkpoint and stop."""
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc import data as data_mod
    from hpc.model import build_model
    from hpc.profiling import maybe_profile

    tc = cfg.train
    rank, world = dist.rank, dist.world_size
    is_main = rank == 0
    per_gpu, micro = batch_plan(tc, world)  # checked before any rendezvous
    stop = stop or StopSignal()

    # --- device and process group ---------------------------------------------------------------
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
    if tc.cuda_graph:
        check_cuda_graph_settings(cfg, use_cuda, world)
    backend = "nccl" if use_cuda else "gloo"
    timeout = dt.timedelta(seconds=tc.collective_timeout_s)
    if world > 1:
        tdist.init_process_group(backend, init_method=f"tcp://{dist.master_addr}:{dist.master_port}",
                                 rank=rank, world_size=world, timeout=timeout)
    else:  # DDP over one process, as the study's 1-GPU runs; a private store needs no port
        tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1, timeout=timeout)
    # Stop/divergence flags travel on a CPU group so checking them costs no GPU synchronisation.
    control = tdist.new_group(backend="gloo", timeout=timeout) if use_cuda else None
    start_memory_history(cfg.profiler.memory_snapshot, use_cuda)

    def all_max(values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        if world > 1:
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=control)
        return t.tolist()

    def log(msg: str) -> None:
        if is_main:
            print(msg, flush=True)

    # --- data ------------------------------------------------------------------------------------
    root = cfg.data.resolved_root()
    data_mod.check_root(root)
    if cfg.data.synthesize_if_missing and not data_mod.has_dataset(root) and dist.local_rank == 0:
        data_mod.prepare_synth_dir(root)
        log(f"no CIFAR-100 under {root}: writing a synthetic set in its format")
        data_mod.synthesize(root, cfg.data.synth_train, cfg.data.synth_test, seed=tc.seed)
    tdist.barrier(group=control)
    train_split, test_split, class_names = data_mod.load_cifar100(root)
    if cfg.model.num_classes != len(class_names):  # labels past the last logit fail deep in the loss
        raise UsageError(f"model.num_classes = {cfg.model.num_classes} but the data under {root} has "
                         f"{len(class_names)} classes")
    subset = data_mod.balanced_subset(train_split.labels, cfg.data.fraction, seed=tc.seed)

    global_batch = per_gpu * world
    batches_per_epoch = math.ceil(math.ceil(len(subset) / world) / micro)
    steps_per_epoch = math.ceil(batches_per_epoch / tc.grad_accum_steps)
    total_steps = steps_per_epoch * tc.epochs  # the schedule's length; max_steps only truncates
    stop_at = min(total_steps, tc.max_steps or total_steps)
    channels_last = cfg.model.channels_last == "on" or (cfg.model.channels_last == "auto" and use_cuda)
    on_device = cfg.data.loader == "device"
    train_data = data_mod.DeviceBatches(train_split, device, channels_last) if on_device else None
    test_data = data_mod.DeviceBatches(test_split, device, channels_last) if on_device else None

    # --- model, optimizer, schedule ----------------------------------------------------------------
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if tc.cuda_graph:  # one process: DDP would only copy gradients, and its hooks cannot be captured
        ddp = None
        forward = model
    else:
        ddp = DDP(model, device_ids=[device.index] if use_cuda else None, bucket_cap_mb=tc.ddp_bucket_cap_mb,
                  gradient_as_bucket_view=tc.ddp_gradient_as_bucket_view, static_graph=tc.ddp_static_graph)
        forward = torch.compile(ddp) if cfg.model.compile else ddp
    base_lr = tc.lr if tc.lr is not None else tc.lr_per_256 * global_batch / 256
    opt_kwargs = dict(lr=base_lr, momentum=tc.momentum, nesterov=tc.nesterov and tc.momentum > 0,
                      weight_decay=tc.weight_decay)
    try:  # fused SGD on CUDA (one kernel for all parameters) where this torch has it
        optimizer = torch.optim.SGD(model.parameters(), **opt_kwargs, **({"fused": True} if use_cuda else {"foreach": False}))
    except (TypeError, RuntimeError):
        optimizer = torch.optim.SGD(model.parameters(), **opt_kwargs)
    warmup_steps = int(round(tc.warmup_epochs * steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, warmup_steps, tc))
    amp_dtype = torch.bfloat16 if (tc.amp == "bf16" or (tc.amp == "auto" and use_cuda)) else None

    def autocast():
        if amp_dtype is None:
            return contextlib.nullcontext()
        # autocast's cast cache must be off while a CUDA graph is captured
        return torch.autocast(device_type=device.type, dtype=amp_dtype, cache_enabled=not tc.cuda_graph)

    # --- resume ----------------------------------------------------------------------------------------
    epoch, position, step = 0, 0, 0
    ckpt = load_checkpoint(run_dir / CHECKPOINT)
    if ckpt is not None:
        restore(run_dir / CHECKPOINT, ckpt, model, optimizer, scheduler, use_cuda)
        epoch, position, step = ckpt["epoch"], ckpt["position"], ckpt["step"]
        log(f"resuming from {run_dir / CHECKPOINT}: epoch {epoch}, batch {position}, step {step}")
    elif is_main:
        write_atomic(run_dir / "config.yaml", dump_yaml(cfg.to_dict()))
    graphed = None
    if tc.cuda_graph:
        from hpc.cudagraph import GraphedStep, lr_on_device, whole_step

        lr_on_device(optimizer, device)  # after any checkpoint load, which brings the rate back on the CPU
        graphed = GraphedStep(whole_step(forward, optimizer, autocast), model, optimizer)

    def checkpoint_state() -> dict:
        return {
            "model": model.state_dict(),  # the plain module: no DDP "module." prefix
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": None,  # bf16 autocast needs no loss scaling
            "epoch": epoch, "position": position, "step": step,
            "rng": {"torch": torch.get_rng_state(), "python": list(random.getstate()),
                    "cuda": torch.cuda.get_rng_state() if use_cuda else None},
            "config": cfg.to_dict(),
            "world_size": world,
        }

    def checkpoint(reason: str) -> None:
        if is_main:
            save_checkpoint(run_dir / CHECKPOINT, checkpoint_state())
            log(f"checkpoint ({reason}): epoch {epoch}, batch {position}, step {step} -> {run_dir / CHECKPOINT}")
        tdist.barrier(group=control)

    writer = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=step if step else None)

    def record(kind: str, values: dict) -> None:
        if not is_main:
            return
        line = json.dumps({"kind": kind, "step": step, "epoch": epoch, "time": time.time(), **values})
        with open(run_dir / "metrics.jsonl", "a") as f:  # one write per record
            f.write(line + "\n")
        for key, value in values.items():
            if isinstance(value, (int, float)) and value is not None:
                writer.add_scalar(f"{kind}/{key}", value, step)

    def sync_buffers() -> None:
        # DDP broadcasts buffers (BatchNorm running stats) from rank 0 at the *start* of each forward,
        # so after the last step every rank holds its own. Do that broadcast now, so evaluation and the
        # final weights are rank 0's everywhere.
        if world > 1:
            for buf in model.buffers():
                tdist.broadcast(buf, 0)

    # --- evaluation: every test image exactly once across ranks ------------------------------------
    def evaluate() -> dict:
        sync_buffers()
        model.eval()
        idx = data_mod.eval_indices(len(test_split.labels), rank, world)
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
        with torch.no_grad(), autocast():
            chunks = (idx[i:i + 2 * micro] for i in range(0, len(idx), 2 * micro))
            if on_device:
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
        return {"loss": loss / count, "top1": 100 * top1 / count, "top5": 100 * top5 / count,
                "images": int(count)}

    # --- the loop --------------------------------------------------------------------------------
    if step >= stop_at:
        log(f"{run_dir}: already complete at step {step} of {stop_at}; nothing to do")
        tdist.destroy_process_group()
        return 0
    log(f"training {cfg.model.arch} ({cfg.model.stem} stem) on {len(subset)} images "
        f"(fraction {cfg.data.fraction:g}), {world} rank(s) [{dist.launcher}], {backend} on {device.type}, "
        f"batch {per_gpu}/GPU = {global_batch} global, lr {base_lr:g}, {steps_per_epoch} steps/epoch, "
        f"steps {step} -> {stop_at}")
    step_times: list[float] = []
    cuda_events: list = []
    interval_losses: list = []  # this log interval's micro-batch losses (device tensors) ...
    interval_steps: list[int] = []  # ... and the optimizer step each belongs to
    exit_code = 0
    stopped_by = None
    t_start = time.perf_counter()
    t_log, images_since_log = time.perf_counter(), 0
    model.train()
    tty = sys.stdout.isatty()

    with maybe_profile(cfg.profiler, run_dir / "traces", rank, use_cuda) as profiling:
        while epoch < tc.epochs and step < stop_at and stopped_by is None:
            order = subset[data_mod.shard_indices(len(subset), rank, world, epoch, tc.seed)]
            if not on_device:
                loader = data_mod.loader_batches(train_split, order[position * micro:], micro, cfg.data.augment,
                                                 cfg.data.num_workers, cfg.data.pin_memory, device)
            t_epoch = time.perf_counter()
            epoch_loss_sum = torch.zeros((), device=device)  # summed on the device: no per-step sync
            epoch_batches = epoch_images = 0
            while position < batches_per_epoch:
                group_start = (position // tc.grad_accum_steps) * tc.grad_accum_steps
                group_size = min(tc.grad_accum_steps, batches_per_epoch - group_start)
                last_micro = position == group_start + group_size - 1
                if position == group_start:  # an optimizer step spans all its micro-batches
                    t_step = time.perf_counter()
                    maybe_inject_oom(step + 1)
                if on_device:
                    x, y = train_data.batch(order[position * micro:(position + 1) * micro], cfg.data.augment,
                                            data_mod.batch_seed(tc.seed, epoch, position, rank))
                else:
                    x, y = next(loader)
                stepped = graphed is not None and y.numel() == micro  # a smaller last batch runs eagerly
                if stepped:
                    loss = graphed(x, y).clone()  # forward, backward and optimizer step in one replay
                else:
                    if graphed is not None:  # .grad holds the graph's last gradients: do not add to them
                        optimizer.zero_grad(set_to_none=True)
                    with contextlib.nullcontext() if (last_micro or ddp is None) else ddp.no_sync():
                        with autocast():
                            loss = F.cross_entropy(forward(x), y)
                        (loss / group_size).backward()
                interval_losses.append(loss.detach())
                interval_steps.append(step + 1)
                epoch_loss_sum += loss.detach().float()
                epoch_batches += 1
                epoch_images += y.numel() * world
                images_since_log += y.numel() * world
                position += 1
                if not last_micro:
                    continue

                if not stepped:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                if profiling is not None:
                    profiling.step()
                if use_cuda:
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    cuda_events.append(ev)
                else:
                    step_times.append(time.perf_counter() - t_step)

                # Divergence is checked every step on the CPU; on a GPU at log steps (no per-step sync).
                at_log = step % tc.log_every_steps == 0 or step == stop_at
                bad_step = 0
                if not use_cuda or at_log:
                    checked = interval_losses if use_cuda else interval_losses[-group_size:]
                    finite = torch.isfinite(torch.stack(checked).float().cpu())
                    if not bool(finite.all()):
                        bad_step = interval_steps[len(interval_losses) - len(checked) + int((~finite).nonzero()[0])]
                flags = all_max([1 if stop.signum else 0, bad_step, rank if bad_step else -1])
                if flags[1]:
                    kept = (f"last good checkpoint: {run_dir / CHECKPOINT}" if (run_dir / CHECKPOINT).exists()
                            else "no checkpoint was written before it")
                    raise TrainingError(f"non-finite loss at step {flags[1]} on rank {flags[2]}; {kept}")
                if at_log and is_main:
                    now = time.perf_counter()
                    mean_loss = float(torch.stack(interval_losses).float().mean())
                    ips = images_since_log / max(now - t_log, 1e-9)
                    eta = (stop_at - step) * (now - t_start) / max(1, step - (ckpt or {}).get("step", 0))
                    line = (f"step {step}/{stop_at} epoch {epoch + 1}/{tc.epochs} loss {mean_loss:.4f} "
                            f"lr {float(scheduler.get_last_lr()[0]):.4g} img/s {ips:.0f} eta {format_duration(eta)}")
                    print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
                    record("train", {"loss": mean_loss, "lr": float(scheduler.get_last_lr()[0]), "images_per_s": ips})
                    t_log, images_since_log = now, 0
                if at_log:
                    interval_losses, interval_steps = [], []
                if flags[0]:
                    stopped_by = "signal"
                    break
                if tc.checkpoint_every_steps and step % tc.checkpoint_every_steps == 0:
                    checkpoint("periodic")
                if step >= stop_at:
                    break

            if position >= batches_per_epoch:  # the epoch is complete
                epoch_time = time.perf_counter() - t_epoch
                epoch, position = epoch + 1, 0
                if tty and is_main:
                    print()
                metrics = {"epoch_time_s": epoch_time, "images_per_s": epoch_images / max(epoch_time, 1e-9),
                           "train_loss": float(epoch_loss_sum) / max(epoch_batches, 1)}
                if tc.eval:
                    metrics.update({f"eval_{k}": v for k, v in evaluate().items()})
                record("epoch", metrics)
                log(f"epoch {epoch} done in {format_duration(epoch_time)}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in metrics.items() if k != "epoch_time_s"))
                # (a resumed epoch's loss and images/s cover the batches run since the restart)
                checkpoint("epoch end")
            elif stopped_by is None and step >= stop_at:
                checkpoint("max steps")
        if stopped_by:
            checkpoint(f"signal {signal.Signals(stop.signum).name}")
            exit_code = EXIT_PREEMPTED
        cycles = profiling.cycles if profiling is not None else []
        peaks_before_reset = profiling.run_peak_bytes if profiling is not None else {"allocated": 0, "reserved": 0}

    # --- summary: one record per rank, gathered to rank 0 --------------------------------------------
    wall = time.perf_counter() - t_start
    if use_cuda:
        torch.cuda.synchronize()
        step_times = [a.elapsed_time(b) / 1000 for a, b in zip(cuda_events, cuda_events[1:])]
    timed = step_times[1:] if len(step_times) > 2 else step_times  # the first step warms caches
    mean_step = sum(timed) / len(timed) if timed else None
    record_r = {
        "rank": rank, "world_size": world, "local_rank": dist.local_rank, "node_rank": dist.node_rank,
        "hostname": socket.gethostname(), "launcher": dist.launcher, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if use_cuda else "cpu",
        "backend": backend, "torch": torch.__version__,
        "arch": cfg.model.arch, "stem": cfg.model.stem, "batch_size_per_gpu": per_gpu,
        "global_batch_size": global_batch, "data_fraction": cfg.data.fraction, "train_images": int(len(subset)),
        "steps": step, "epochs_completed": epoch, "complete": exit_code == 0,
        "step_time_s": {"n": len(timed), "mean": mean_step, "median": percentile(timed, 0.5),
                        "p90": percentile(timed, 0.9), "min": min(timed) if timed else None,
                        "max": max(timed) if timed else None},
        "images_per_s": per_gpu / mean_step if mean_step else None,
        "global_images_per_s": global_batch / mean_step if mean_step else None,
        "wall_time_s": wall,
        # The profiler resets the allocator's peaks as each recorded window opens: keep the run's maximum.
        "cuda_max_memory_allocated_bytes":
            max(torch.cuda.max_memory_allocated(device), peaks_before_reset["allocated"]) if use_cuda else None,
        "cuda_max_memory_reserved_bytes":
            max(torch.cuda.max_memory_reserved(device), peaks_before_reset["reserved"]) if use_cuda else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        # The environment that shapes performance, for reproducing the run.
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("OMP_", "NCCL_", "FI_", "GLOO_", "HPC_", "TORCH_")) or k == "CUDA_VISIBLE_DEVICES"},
        "profiler": {"cycles": cycles, "traces": sorted(p.name for p in (run_dir / "traces").glob(f"rank{rank}.*"))},
    }
    sync_buffers()
    digest = hashlib.sha256()  # lets anyone check that every rank ends with the same weights
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    record_r["weights_sha256"] = digest.hexdigest()
    records = [None] * world
    tdist.all_gather_object(records, record_r, group=control)
    if is_main:
        summary_path = run_dir / "summary.json"
        write_atomic(summary_path, json.dumps({"run_dir": str(run_dir), "world_size": world,
                                               "config": cfg.to_dict(), "ranks": records}, indent=2))
        if writer is not None:
            writer.close()
        outcome = "stopped by signal, checkpoint written (rerun to resume)" if exit_code else "done"
        print(f"{outcome}\n  run:        {run_dir}\n  traces:     {run_dir / 'traces'}\n"
              f"  summary:    {summary_path}\n  checkpoint: {run_dir / CHECKPOINT}", flush=True)
    tdist.barrier(group=control)  # tear down together: a peer closing its sockets early upsets gloo's threads
    tdist.destroy_process_group()
    return exit_code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args.config, overrides_from_args(args))
    dist = from_environ(os.environ)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(os.environ, dist)
    created = not run_dir.exists()
    check_is_run_dir(run_dir)
    try:
        prepare_run_dir(run_dir)
        check_resumable(run_dir, cfg)
        return train_or_oom(cfg, run_dir, dist)
    except expected_errors():
        if created:  # bad input found late (data, checkpoint...): leave no run directory behind
            remove_if_unfinished(run_dir)
        raise


def remove_if_unfinished(run_dir: Path) -> None:
    """Remove a run directory this command created, unless it holds a checkpoint or a summary."""
    import shutil

    if not (run_dir / CHECKPOINT).exists() and not (run_dir / "summary.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def train_or_oom(cfg: RunConfig, run_dir: Path, dist: DistEnv) -> int:
    """train(); a CUDA out-of-memory error becomes the run's outcome (summary.json) and exit code 4.
    The process group is torn down whatever happens (a failed run must not leave it to the next)."""
    import torch
    import torch.distributed as tdist

    stop = StopSignal().install()
    try:
        return train(cfg, run_dir, dist, stop)
    except torch.cuda.OutOfMemoryError as e:
        cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
        oom = record_oom(e, cfg, run_dir, dist.rank, dist.world_size, cuda)
        print(f"hpc.train: {describe(oom)}; recorded in {run_dir / 'summary.json'}", file=sys.stderr, flush=True)
        return EXIT_OOM
    finally:
        stop.restore()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()


def cli(argv: list[str] | None = None) -> int:
    from hpc.cli import fail, run

    try:
        return run("hpc.train", main, argv)
    except TrainingError as e:
        return fail("hpc.train", str(e), code=1)


if __name__ == "__main__":
    from hpc import train as _train

    code = _train.cli()
    # Everything is written and closed by now. Leave without running C++ static destructors: a rare
    # abort there ("terminate called without an active exception", seen once in CI after a complete
    # run) would turn a finished run into a failed task.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
