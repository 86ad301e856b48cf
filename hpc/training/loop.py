"""An epoch of a Trainer's loop (hpc/training/trainer.py builds what it reads): the epoch's micro-batches
(this rank's shard, from the position a resume left), each micro-batch's forward and backward (or the
graph's replay), the optimizer step's end (the schedule, the profiler, the step's timing, the stop and
divergence flags agreed across ranks, the log line, the checkpoint policy) and the epoch's end
(evaluation, its record, its checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from hpc.core.errors import TrainingError, WriteError
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.placement.distenv import DistEnv
from hpc.settings.schema import RunConfig
from hpc.training.checkpoint import Checkpointer
from hpc.training.graphcheck import GraphRun
from hpc.training.group import RankGroup
from hpc.training.inject import Injector, raise_at_step
from hpc.training.metrics import MetricsLog, Throughput, format_duration
from hpc.training.parts import DivergenceGuard, StepTimer, TrainState, evaluate
from hpc.training.profiling import Profiling
from hpc.training.setup import DataParts, ModelParts, StepPlan

log = logging.getLogger(__name__)


class Loop:
    """The epoch and its steps, for the Trainer that holds these parts."""

    cfg: RunConfig
    dist: DistEnv
    paths: RunPaths
    is_main: bool
    state: TrainState
    stop: StopSignal
    plan: StepPlan
    data: DataParts
    net: ModelParts
    device: torch.device
    faults: Any  # hpc.core.faults' parsed HPC_FAULT_INJECT
    inject: Injector
    group: RankGroup
    graph: GraphRun
    metrics: MetricsLog | None
    progress: Throughput
    timer: StepTimer
    guard: DivergenceGuard
    checkpointer: Checkpointer
    profiling: Profiling | None
    stopped: bool

    if TYPE_CHECKING:  # the Trainer's own (trainer.py)

        def log(self, msg: str) -> None: ...
        def checkpoint(self, reason: str) -> None: ...
        def untuned(self, other_shape: bool) -> contextlib.AbstractContextManager[None]: ...
        def stop_if_write_failed(self, error: WriteError | None, what: str = ...) -> None: ...

    def epoch_batches(self, order: np.ndarray) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of the epoch from the current position on."""
        from hpc.training import data as data_mod

        st, dc, micro = self.state, self.cfg.data, self.plan.micro
        if self.data.train_data is None:
            left = order[st.position * micro :]
            loader = (dc.augment, dc.num_workers, dc.pin_memory, self.device)
            yield from data_mod.loader_batches(self.data.train_split, left, micro, *loader)
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
                raise_at_step(self.faults, st.step + 1, plan.per_gpu, self.dist.world_size, self.dist.rank)
            if self.micro_step(*next(batches)):
                break
        if st.position >= plan.batches_per_epoch:
            self.end_epoch()
        elif not self.stopped and st.step >= plan.stop_at:
            self.checkpoint("max steps")

    def micro_step(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """One micro-batch; after the last of an optimizer step, the step's end. True: leave the epoch."""
        st, net = self.state, self.net
        group_size, last_micro = self.plan.group(st.position)
        full = y.numel() == self.plan.micro
        # forward, backward and optimizer step in one replay; None: eager (a smaller last batch, no graph)
        replayed = self.graph(x, y) if full else None
        graphed = replayed is not None
        if replayed is not None:
            loss = replayed
        else:
            if self.graph.on:  # .grad holds the graph's last gradients: do not add to them
                net.optimizer.zero_grad(set_to_none=True)
            with net.ddp.no_sync() if not last_micro else contextlib.nullcontext(), self.untuned(not full):
                with net.autocast():
                    loss = F.cross_entropy(net.forward(x), y)
                self.inject.fire("step")
                if last_micro:  # this backward pass all-reduces: the step's own work ends here
                    self.timer.synced()
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
        profiled = self.profiling is not None and self.profiling.on_now()
        if self.profiling is not None:
            self.profiling.step(replayed=graphed)
        self.timer.stop(profiled)
        at_log = st.step % self.cfg.train.log_every_steps == 0 or st.step == self.plan.stop_at
        bad_step = self.guard.bad_step(at_log, group_size)
        write_failed = self.metrics is not None and self.metrics.failed is not None
        stop_flag, bad, bad_rank, any_write_failed = self.group.all_max(
            [1 if self.stop.signum else 0, bad_step, self.dist.rank if bad_step else -1, int(write_failed)]
        )
        if any_write_failed:
            self.stop_if_write_failed(self.metrics.failed if self.metrics else None, self.paths.metrics.name)
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
            log.info(line)
            self.metrics.record(
                "train", {"loss": mean_loss, "lr": lr, "images_per_s": pace["images_per_s"]}, st.step, st.epoch
            )
        self.guard.reset()

    def end_epoch(self) -> None:
        st = self.state
        st.epoch, st.position = st.epoch + 1, 0
        metrics: dict[str, Any] = self.progress.epoch()
        if self.cfg.train.eval:
            self.group.sync_buffers(self.net.model)
            self.inject.fire("eval")
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
