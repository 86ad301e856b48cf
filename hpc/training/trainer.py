"""The training run of one rank as a Trainer of named parts (the shape of torchtitan's Trainer).

`Trainer(cfg, run_dir, dist, stop)` sets up the device, the process group, the data, the model and
the optimizer (hpc/training/setup.py), and resumes from a checkpoint; `train()` is the loop, `close()`
the teardown. The parts own their policy and state and get only their config section:
- TrainState, StepTimer, DivergenceGuard, evaluate (hpc/training/parts.py);
- Checkpointer (hpc/training/checkpoint.py): when to save, the atomic save, the checked load;
- Throughput and MetricsLog (hpc/training/metrics.py): images/s, ETA, epoch sums; metrics.jsonl;
- RunSummary (hpc/training/summary.py): summary.json's records;
- maybe_profile (hpc/training/profiling.py): torch.profiler with its schedule.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpc.core.errors import EXIT_OK, EXIT_PREEMPTED, TrainingError
from hpc.core.faults import faults_from_env
from hpc.core.rundir import RunPaths, write_yaml
from hpc.launch.distenv import DistEnv
from hpc.launch.schema import RunConfig
from hpc.training.checkpoint import Checkpointer, restore
from hpc.training.graphmode import DDP_WARMUP_ITERS, decide_graph_mode
from hpc.training.metrics import MetricsLog, Throughput, format_duration
from hpc.training.model import count_flops_per_image
from hpc.training.oom import maybe_inject_fault, start_memory_history
from hpc.training.parts import DivergenceGuard, StepTimer, StopSignal, TrainState, evaluate
from hpc.training.profiling import Profiling, maybe_profile
from hpc.training.setup import (
    batch_plan,
    cudnn_heuristics,
    init_process_group,
    setup_data,
    setup_device,
    setup_model,
    step_plan,
)
from hpc.training.summary import RunSummary, weights_digest


class Trainer:
    """One rank's run. Build it, call train(), then close() (in a finally)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, dist: DistEnv, stop: StopSignal):
        self.cfg, self.dist, self.stop, self.paths = cfg, dist, stop, RunPaths(run_dir)
        self.is_main = dist.rank == 0
        self.metrics: MetricsLog | None = None  # close() runs after a failed set-up too
        self.graphed: Any = None
        self.faults = faults_from_env(os.environ)
        batch_plan(cfg.train, dist.world_size)  # the batch shape is checked before any rendezvous
        self.device, self.use_cuda = setup_device(cfg.train, dist)
        self.graph_mode = decide_graph_mode(cfg, self.use_cuda, self._nccl_version())
        if self.graph_mode.on:
            # PyTorch's recipe for capturing DDP: before the process group is made. Replayed collectives
            # are never the watchdog's anyway; a dead peer still ends the run through the control group.
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        self.backend, self.control = init_process_group(dist, self.use_cuda, cfg.train.collective_timeout_s)
        start_memory_history(cfg.profiler.memory_snapshot, self.use_cuda)
        mc = cfg.model
        channels_last = mc.channels_last == "on" or (mc.channels_last == "auto" and self.use_cuda)
        self.data = setup_data(
            cfg.data, mc.num_classes, cfg.train.seed, dist, self.device, channels_last, self.barrier, self.log
        )
        self.plan = step_plan(cfg.train, dist.world_size, len(self.data.subset))
        self.net = setup_model(mc, cfg.train, self.plan, self.device, self.use_cuda, channels_last, self.graph_mode.on)
        self.state = TrainState(use_cuda=self.use_cuda)
        self.checkpointer = Checkpointer(
            run_dir, cfg.train.checkpoint_every_steps, self.is_main, self.barrier, self.log
        )
        resumed_from = self._resume()
        self.graphed = self._graph()
        self.metrics = MetricsLog(run_dir, self.is_main, self.state.step)
        self.progress = Throughput(self.plan.stop_at, resumed_from, self.device)
        self.summary = RunSummary(
            cfg,
            run_dir,
            dist,
            self.device,
            self.backend,
            self.plan,
            len(self.data.subset),
            count_flops_per_image(self.net.model),
            self.graph_mode.on,
        )
        self.timer = StepTimer(self.use_cuda)
        self.guard = DivergenceGuard(self.use_cuda)
        self.profiling: Profiling | None = None
        self.stopped = False  # a stop signal reached every rank: checkpoint and leave the loop

    # --- set-up ----------------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def barrier(self) -> None:
        import torch.distributed as tdist

        tdist.barrier(group=self.control)

    def _resume(self) -> int:
        """Load the checkpoint if there is one (the step it was at), else write the run's config."""
        ckpt = self.checkpointer.load()
        if ckpt is None:
            if self.is_main:
                write_yaml(self.paths.config, self.cfg.to_dict())
            return 0
        net = self.net
        restore(self.checkpointer.path, ckpt, net.model, net.optimizer, net.scheduler, self.state)
        st = self.state
        self.log(f"resuming from {self.checkpointer.path}: epoch {st.epoch}, batch {st.position}, step {st.step}")
        return st.step

    def _nccl_version(self) -> tuple[int, ...] | None:
        from hpc.training.cudagraph import nccl_version

        return nccl_version() if self.use_cuda else None

    def _graph(self) -> Any:
        """The whole step, DDP's all-reduce included, as a CUDA graph captured at its first call (the
        graph mode decided at set-up), else None."""
        self.log(self.graph_mode.line)
        if not self.graph_mode.on:
            return None
        from hpc.training.cudagraph import GraphedStep, lr_on_device, whole_step

        net = self.net
        lr_on_device(net.optimizer, self.device)  # after any checkpoint load, which brings the rate to the CPU
        core = whole_step(net.forward, net.optimizer, net.autocast)
        return GraphedStep(core, net.model, net.optimizer, DDP_WARMUP_ITERS, net.capture_stream)

    def untuned(self, other_shape: bool) -> Any:
        """cuDNN's heuristics for a batch of another shape than the step's (train.cudnn_autotune: step)."""
        return cudnn_heuristics(other_shape and self.use_cuda and self.cfg.train.cudnn_autotune == "step")

    def checkpoint(self, reason: str) -> None:
        net = self.net
        self.checkpointer.save(
            {
                "model": net.model.state_dict(),  # the plain module: no DDP "module." prefix
                "optimizer": net.optimizer.state_dict(),
                "scheduler": net.scheduler.state_dict(),
                "scaler": None,  # bf16 autocast needs no loss scaling
                **self.state.state_dict(),  # epoch, position, step, rng
                "config": self.cfg.to_dict(),
                "world_size": self.dist.world_size,
            },
            reason,
        )

    def sync_buffers(self) -> None:
        # DDP broadcasts buffers (BatchNorm running stats) from rank 0 at the *start* of each forward,
        # so after the last step every rank holds its own. Do that broadcast now, so evaluation and the
        # final weights are rank 0's everywhere.
        import torch.distributed as tdist

        if self.dist.world_size > 1:
            for buf in self.net.model.buffers():
                tdist.broadcast(buf, 0)

    def all_max(self, values: list[int]) -> list[int]:
        import torch
        import torch.distributed as tdist

        t = torch.tensor(values, dtype=torch.int64)
        if self.dist.world_size > 1:
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=self.control)
        return [int(v) for v in t.tolist()]

    # --- the loop ----------------------------------------------------------------------------------
    def train(self) -> int:
        st, plan = self.state, self.plan
        if st.step >= plan.stop_at:
            self.log(f"{self.paths.root}: already complete at step {st.step} of {plan.stop_at}; nothing to do")
            return EXIT_OK
        self.log_start()
        self.progress.start()
        self.net.model.train()
        with maybe_profile(self.cfg.profiler, self.paths.traces, self.dist.rank, self.use_cuda) as profiling:
            self.profiling = profiling
            while st.epoch < self.cfg.train.epochs and st.step < plan.stop_at and not self.stopped:
                self.run_epoch()
            if self.stopped:
                self.checkpoint(f"signal {signal.Signals(self.stop.signum or signal.SIGTERM).name}")
            cycles = profiling.cycles if profiling is not None else []
            peaks = profiling.run_peak_bytes if profiling is not None else {"allocated": 0, "reserved": 0}
        return self.finish(EXIT_PREEMPTED if self.stopped else EXIT_OK, cycles, peaks)

    def log_start(self) -> None:
        cfg, dist, plan = self.cfg, self.dist, self.plan
        self.log(
            f"training {cfg.model.arch} ({cfg.model.stem} stem) on {len(self.data.subset)} images "
            f"(fraction {cfg.data.fraction:g}), {dist.world_size} rank(s) [{dist.launcher}], {self.backend} on "
            f"{self.device.type}, batch {plan.per_gpu}/GPU = {plan.global_batch} global, lr "
            f"{self.net.base_lr:g}, {plan.steps_per_epoch} steps/epoch, steps {self.state.step} -> {plan.stop_at}"
        )

    def epoch_batches(self, order: Any) -> Iterator[tuple[Any, Any]]:
        """This rank's micro-batches of the epoch from the current position on."""
        from hpc.training import data as data_mod

        st, dc, micro = self.state, self.cfg.data, self.plan.micro
        if self.data.train_data is None:
            yield from data_mod.loader_batches(
                self.data.train_split,
                order[st.position * micro :],
                micro,
                dc.augment,
                dc.num_workers,
                dc.pin_memory,
                self.device,
            )
            return
        while True:  # positions advance as the loop consumes
            p = st.position
            seed = data_mod.batch_seed(self.cfg.train.seed, st.epoch, p, self.dist.rank)
            yield self.data.train_data.batch(order[p * micro : (p + 1) * micro], dc.augment, seed)

    def run_epoch(self) -> None:
        from hpc.training import data as data_mod

        st, plan = self.state, self.plan
        order = self.data.subset[
            data_mod.shard_indices(
                len(self.data.subset), self.dist.rank, self.dist.world_size, st.epoch, self.cfg.train.seed
            )
        ]
        self.progress.start_epoch()
        batches = self.epoch_batches(order)
        while st.position < plan.batches_per_epoch:
            if st.position % plan.grad_accum == 0:  # an optimizer step's first micro-batch, data included
                self.timer.start()
                maybe_inject_fault(self.faults, st.step + 1, plan.per_gpu, self.dist.world_size)
            if self.micro_step(*next(batches)):
                break
        if st.position >= plan.batches_per_epoch:
            self.end_epoch()
        elif not self.stopped and st.step >= plan.stop_at:
            self.checkpoint("max steps")

    def micro_step(self, x: Any, y: Any) -> bool:
        """One micro-batch; after the last of an optimizer step, the step's end. True: leave the epoch."""
        import torch.nn.functional as F

        st, net = self.state, self.net
        group_size, last_micro = self.plan.group(st.position)
        full = y.numel() == self.plan.micro
        graphed = self.graphed is not None and full  # a smaller last batch runs eagerly
        if graphed:
            loss = self.graphed(x, y).clone()  # forward, backward and optimizer step in one replay
        else:
            if self.graphed is not None:  # .grad holds the graph's last gradients: do not add to them
                net.optimizer.zero_grad(set_to_none=True)
            with net.ddp.no_sync() if not last_micro else contextlib.nullcontext(), self.untuned(not full):
                with net.autocast():
                    loss = F.cross_entropy(net.forward(x), y)
                (loss / group_size).backward()
        self.guard.add(loss, st.step + 1)
        self.progress.add(loss, y.numel() * self.dist.world_size)
        st.position += 1
        return self.optimizer_step(graphed, group_size) if last_micro else False

    def optimizer_step(self, graphed: bool, group_size: int) -> bool:
        """The step's end: optimizer (unless the graph did it), schedule, profiler, timing, the divergence
        and stop flags agreed across ranks, logging, the checkpoint policy. True: leave the epoch."""
        st, net = self.state, self.net
        if not graphed:
            net.optimizer.step()
            net.optimizer.zero_grad(set_to_none=True)
        net.scheduler.step()
        st.step += 1
        if self.profiling is not None:
            self.profiling.step()
        self.timer.stop()
        at_log = st.step % self.cfg.train.log_every_steps == 0 or st.step == self.plan.stop_at
        bad_step = self.guard.bad_step(at_log, group_size)
        stop_flag, bad, bad_rank = self.all_max(
            [1 if self.stop.signum else 0, bad_step, self.dist.rank if bad_step else -1]
        )
        if bad:
            kept = (
                f"last good checkpoint: {self.checkpointer.path}"
                if self.checkpointer.path.exists()
                else "no checkpoint was written before it"
            )
            raise TrainingError(f"non-finite loss at step {bad} on rank {bad_rank}; {kept}")
        if at_log:
            self.log_interval()
        if stop_flag:
            self.stopped = True
            return True
        if self.checkpointer.due(st.step):
            self.checkpoint("periodic")
        return st.step >= self.plan.stop_at

    def log_interval(self) -> None:
        st = self.state
        if self.is_main and self.metrics is not None:
            mean_loss = self.guard.mean()
            pace = self.progress.interval(st.step)
            lr = float(self.net.scheduler.get_last_lr()[0])
            line = (
                f"step {st.step}/{self.plan.stop_at} epoch {st.epoch + 1}/{self.cfg.train.epochs} loss "
                f"{mean_loss:.4f} lr {lr:.4g} img/s {pace['images_per_s']:.0f} eta {format_duration(pace['eta_s'])}"
            )
            tty = sys.stdout.isatty()
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            self.metrics.record(
                "train", {"loss": mean_loss, "lr": lr, "images_per_s": pace["images_per_s"]}, st.step, st.epoch
            )
        self.guard.reset()

    def end_epoch(self) -> None:
        st = self.state
        st.epoch, st.position = st.epoch + 1, 0
        if sys.stdout.isatty() and self.is_main:
            print()
        metrics: dict[str, Any] = self.progress.epoch()
        if self.cfg.train.eval:
            self.sync_buffers()
            with self.untuned(True):  # evaluation's batches are not the step's shape
                result = evaluate(
                    self.net.model, self.data, self.net.autocast, self.cfg.data, self.plan.micro, self.dist, self.device
                )
            metrics.update({f"eval_{k}": v for k, v in result.items()})
        if self.metrics is not None:
            self.metrics.record("epoch", metrics, st.step, st.epoch)
        self.log(
            f"epoch {st.epoch} done in {format_duration(metrics['epoch_time_s'])}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != "epoch_time_s")
        )
        self.checkpoint("epoch end")

    # --- the end -----------------------------------------------------------------------------------
    def finish(self, exit_code: int, cycles: list[Any], peaks: dict[str, int]) -> int:
        """summary.json (one record per rank, gathered to rank 0), the closing lines, a joint teardown."""
        import torch.distributed as tdist

        if self.graphed is not None:
            # Every replay is done (the last step's flags were agreed by all ranks): drop the graph, which
            # holds NCCL's communicator, before the process group goes. Not in close(): after a failure a
            # replay may still wait on a dead peer, and waiting for it would hang the teardown.
            self.graphed.release()
            self.graphed = None
        record = self.summary.rank_record(
            self.state.step, self.state.epoch, self.timer.times(), exit_code, cycles, peaks, self.progress.wall_s()
        )
        self.sync_buffers()
        record["weights_sha256"] = weights_digest(self.net.model)
        records: list[Any] = [None] * self.dist.world_size
        tdist.all_gather_object(records, record, group=self.control)
        if self.is_main:
            summary_path = self.summary.write(records)
            if self.metrics is not None:
                self.metrics.close()
            outcome = "stopped by signal, checkpoint written (rerun to resume)" if exit_code else "done"
            print(
                f"{outcome}\n  run:        {self.paths.root}\n  traces:     {self.paths.traces}\n"
                f"  summary:    {summary_path}\n  checkpoint: {self.checkpointer.path}",
                flush=True,
            )
        self.barrier()  # tear down together: a peer closing its sockets early upsets gloo's threads
        return exit_code

    def close(self) -> None:
        """Teardown, whatever happened: the TensorBoard writer and the process group."""
        import torch.distributed as tdist

        if self.metrics is not None:
            self.metrics.close()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()
