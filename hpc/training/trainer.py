"""The training run of one rank as a Trainer of named parts (the shape of torchtitan's Trainer).

`Trainer(cfg, run_dir, dist, stop, lock)` sets up the device, the process group, the data, the model and
the optimizer (hpc/training/build.py), takes the run directory and resumes from its checkpoint;
`train()` is the loop (an epoch's micro-batches from where a resume left, each forward and backward or
the graph's replay, the optimizer step's end, the epoch's end), `close()` the teardown. A write that
fails on rank 0 (a full disk) is agreed at once, so every rank stops with one line and none waits in a
collective for it. The parts own their policy and state and get only their config section: TrainState,
DivergenceGuard, evaluate (steps.py); StepClock (steptimes.py: each step's end and own work, the
instrument a script's start-up hook uses); Checkpointer (checkpoint.py: when to save, the atomic
save, the checked load); RankGroup (distributed/group.py: what the ranks agree on, who a lost peer was);
claim_run_dir (claim.py: the directory's lock, debris, where it left off); Throughput and MetricsLog
(metrics.py); RunSummary (summary.py: each rank's facts); GraphRun (graph/graphcheck.py: the graphed step,
checked before its first replay); maybe_profile (profiling.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, PeerLostError, TrainingError, WriteError
from hpc.core.gpusample import GpuSampler, start_sampler
from hpc.core.lock import RunLock
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.core.summary import RankFacts, keep_earlier, run_state
from hpc.placement.distenv import DistEnv
from hpc.settings.rankcommand import RUN_DIR_VARIABLE
from hpc.settings.schema import RunConfig
from hpc.training import inject
from hpc.training.build import (
    batch_plan,
    before_process_group,
    check_fabric,
    cudnn_heuristics,
    graph_step,
    placement_line,
    setup_data,
    setup_device,
    setup_model,
    start_line,
    step_plan,
)
from hpc.training.checkpoint import Checkpointer, restore
from hpc.training.claim import claim_run_dir, note_start
from hpc.training.distributed.group import RankGroup
from hpc.training.distributed.rendezvous import Heartbeat, join
from hpc.training.graph.cudagraph import nccl_version
from hpc.training.graph.graphcheck import GraphRun
from hpc.training.graph.graphmode import capture_in_use, decide_graph_mode
from hpc.training.hook.scriptwatch import beat_watch
from hpc.training.metrics import MetricsLog, Throughput, format_duration
from hpc.training.model import count_flops_per_image
from hpc.training.oom import start_memory_history
from hpc.training.profiling import Profiling, RankChoice, maybe_profile, start_notes
from hpc.training.steps import DivergenceGuard, TrainState, evaluate
from hpc.training.steptimes import StepClock, Timeline, startup_record
from hpc.training.summary import RunSummary, closing_lines, recovered_record, weights_digest

log = logging.getLogger(__name__)


class Trainer:
    """One rank's run. Build it, call train(), then close() (in a finally)."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, dist: DistEnv, stop: StopSignal, lock: RunLock, resume_from: str = "last"
    ):
        """`stop` and `lock` are the caller's (installed, and released, whatever happens to the Trainer)."""
        self.timeline = Timeline("imports")  # summary.json's startup.phases; imported: torch's, ours, the config
        self.cfg = cfg
        self.dist = dist
        self.stop = stop
        self.paths = RunPaths(run_dir)
        self.is_main = dist.rank == 0
        self.metrics: MetricsLog | None = None  # close() runs after a failed set-up too
        self.lock = lock
        self.state = TrainState()
        inject.arm_from_env(os.environ, dist.rank, lambda: self.state.step)  # the fault point: unset, nothing
        batch_plan(cfg.train, dist.world_size)  # the batch shape is checked before any rendezvous
        self.device, self.use_cuda = setup_device(cfg.train, dist)
        self.graph_mode = decide_graph_mode(cfg, self.use_cuda, nccl_version(self.use_cuda), capture_in_use(os.environ))
        fabric = before_process_group(self.graph_mode.on, dist, self.paths.rank_log(0).parent)
        timeout_s = cfg.train.collective_timeout_s
        joined_at = time.time()  # the group's formation, timed for summary.json's start-up
        self.backend, control, store = join(dist, self.use_cuda, timeout_s, self.paths.rank_log(dist.rank))
        self.joining = (joined_at, time.time())  # the timeline's group_joined too
        # several ranks: each one's heartbeat, read when a collective fails (None: close() after a failed set-up)
        self.heartbeat = Heartbeat(dist, timeout_s) if store is not None else None
        self.group = RankGroup(dist, control, store)
        self.checkpointer = self.claim(resume_from)
        start_memory_history(cfg.profiler.memory_snapshot, self.use_cuda)
        mc = cfg.model
        channels_last = mc.channels_last == "on" or (mc.channels_last == "auto" and self.use_cuda)
        self.data = setup_data(
            cfg.data, mc.num_classes, cfg.train.seed, dist, self.device, channels_last, self.group.barrier, self.log
        )
        self.timeline.mark("data_ready")
        self.plan = step_plan(cfg.train, dist.world_size, len(self.data.subset))
        graph = self.graph_mode
        self.net = setup_model(mc, cfg.train, self.plan, self.device, self.use_cuda, channels_last, graph.captures)
        self.timeline.mark("model_ready")  # on its device and wrapped
        network = check_fabric(dist, self.paths.rank_log(0).parent, self.group.agree, self.log) if fabric else None
        self.state.use_cuda = self.use_cuda
        resumed_from = self._resume()
        self.log(graph.line)
        step = graph_step(self.net, graph, self.device)  # captured at its first call, then checked
        self.graph = GraphRun(step, cfg.train, dist.rank, self.group.gather, self.log)
        self.metrics = MetricsLog(run_dir, self.is_main, self.state.step)
        self.progress = Throughput(self.plan.stop_at, resumed_from, self.device)
        flops = count_flops_per_image(self.net.model)
        self.summary = RunSummary(
            cfg, run_dir, dist, self.device, self.backend, self.plan, len(self.data.subset), flops, self.graph_mode.on
        )
        self.summary.facts["nccl_network"] = network  # the fabric NCCL chose across nodes (None: not asked)
        self.timer = StepClock(self.use_cuda, self.net.model.parameters())  # a script's clock (hook/autoprofile.py)
        self.beat = beat_watch(os.environ)  # the runner's liveness watch, as a script's (hpc/launch/rank/hang.py)
        self.guard = DivergenceGuard(self.use_cuda)
        self.profiling: Profiling | None = None
        self.stopped = False  # a stop signal reached every rank: checkpoint and leave the loop
        self.sampler: GpuSampler | None = None

    # --- set-up ----------------------------------------------------------------------------------
    def claim(self, resume_from: str) -> Checkpointer:
        """The run directory taken by every rank together (hpc/training/claim.py claim_run_dir), with the
        checkpointer that writes into it; the ranks' roster gathered."""
        checkpointer = Checkpointer(
            self.paths.root, self.cfg.train.checkpoint_every_steps, self.is_main, self.group.agree, self.log
        )
        claim_run_dir(self.paths, self.lock, self.group, checkpointer, resume_from, self.log)
        if RUN_DIR_VARIABLE not in os.environ:  # a start outside our runner (plain torchrun, python): its own
            keep_earlier(self.paths, self.dist.rank)  # record, not a runner's earlier one, makes summary.json
        self.group.gather_roster()
        return checkpointer

    def log(self, msg: str) -> None:  # rank 0's lines; the others' at DEBUG, named (HPC_LOG_LEVEL=debug)
        level, name = (logging.INFO, "") if self.is_main else (logging.DEBUG, f"[rank {self.dist.rank}] ")
        log.log(level, "%s%s", name, msg)

    def _resume(self) -> int:
        """Load the checkpoint if there is one (the step it was at); rank 0 then sets the directory's books
        by it: the config of a fresh run, metrics.jsonl cut back to the step (hpc/training/claim.py)."""
        ckpt = self.checkpointer.load()
        st, net = self.state, self.net
        if ckpt is not None:
            restore(self.checkpointer.path, ckpt, net.model, net.optimizer, net.scheduler, st)
            self.log(f"resuming from {self.checkpointer.path}: epoch {st.epoch}, batch {st.position}, step {st.step}")
        resumed = None
        if ckpt is not None:
            resumed = {"step": st.step, "epoch": st.epoch, "position": st.position, "complete": self.finished()}
        error = (
            note_start(self.paths, self.cfg.to_dict(), resumed, self.plan.stop_at, self.log) if self.is_main else None
        )
        self.stop_if_write_failed(error)
        return st.step

    def stop_if_write_failed(
        self, error: WriteError | None, what: str = "a file of the run", who: str = "rank 0"
    ) -> None:
        """Every rank learns whether `who`'s write failed; then all stop, the one that failed with its own line."""
        if self.group.agree(error is not None):
            raise error or WriteError(f"{self.paths.root}: {who} could not write {what}; stopping with it")

    def untuned(self, other_shape: bool) -> contextlib.AbstractContextManager[None]:
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
            self.plan.stop_at,
            self.finished(),
            # an epoch's end or a periodic save the run goes on from: written while it trains on
            background=reason in ("epoch end", "periodic") and not self.finished(),
        )

    def checkpoint_the_stop(self) -> None:
        """A stop's checkpoint; a stop that lands on a step already saved (an epoch's end, a periodic save)
        says so, so that its log still shows the signal was heard."""
        name, step = signal.Signals(self.stop.signum or signal.SIGTERM).name, self.state.step
        if self.checkpointer.latest_step != step:
            self.checkpoint(f"signal {name}")
        else:
            self.log(f"checkpoint (signal {name}): step {step} is already saved")

    def finished(self) -> bool:
        """The last step taken and, where it ends an epoch, that epoch's end (evaluation, record) done: a
        run resumed from its last step's periodic checkpoint still owes it."""
        return self.state.step >= self.plan.stop_at and self.state.position < self.plan.batches_per_epoch

    # --- the loop ----------------------------------------------------------------------------------
    def train(self) -> int:
        st = self.state
        if self.finished():
            return self.complete_summary()
        self.log_start()
        # the node's GPUs by NVML, from its first rank, unless a runner (hpc.submit, sbatch) samples them
        if self.dist.local_rank == 0 and RUN_DIR_VARIABLE not in os.environ:
            host = socket.gethostname()
            self.sampler = start_sampler(self.paths.gpu_samples(host), host)
        inject.at("start")
        self.progress.start()
        self.net.model.train()
        d = self.dist  # profiler.ranks: who records, by every rank's own work so far where it must choose
        who = RankChoice(d.rank, d.local_rank, d.world_size, self.group.gather, self.timer.own_so_far_s)
        with maybe_profile(
            self.cfg.profiler, self.paths.traces, who, self.use_cuda, lambda: self.state.step
        ) as profiling:
            self.profiling = profiling
            if profiling is not None:  # not started: profiler.enabled false, or a rank not chosen to record
                self.timeline.mark("profiler_started")
            while st.epoch < self.cfg.train.epochs and not self.finished() and not self.stopped:
                self.run_epoch()
                # a signal during evaluation stops at the epoch's own checkpoint, not a step later
                self.stopped = self.stopped or self.group.agree(bool(self.stop.signum))
            if self.stopped:
                self.checkpoint_the_stop()
        # a stop signal during the last step still ends a complete run: the epoch's end runs regardless
        return self.finish(EXIT_OK if self.finished() else EXIT_PREEMPTED, profiling)

    def complete_summary(self) -> int:
        """A run already at its last step has nothing to train; its summary.json is written if missing or
        stale (the run was killed between its last checkpoint and its summary). Rank 0 decides."""
        st, root = self.state, self.paths.root
        if self.group.agree(self.is_main and run_state(self.paths).summary_current):
            self.log(f"{root}: already complete at step {st.step} of {self.plan.stop_at}; nothing to do")
            return EXIT_OK
        self.log(f"{root}: complete at step {st.step}, but its summary.json is missing or out of date: writing it")
        return self.finish(EXIT_OK, None, recovered=True)

    def log_start(self) -> None:
        log.info(placement_line(self.dist.rank, self.summary.where))  # every rank: where it runs
        for note in start_notes(self.cfg.profiler, self.plan.stop_at - self.state.step, self.use_cuda):
            self.log(note)
        where = (self.dist, self.backend, self.device)
        self.log(start_line(self.cfg, where, self.plan, len(self.data.subset), self.net.base_lr, self.state.step))

    # --- an epoch and its steps ---------------------------------------------------------------------
    def epoch_batches(self, order: np.ndarray) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of the epoch from the current position on."""
        from hpc.training import data as data_mod

        st = self.state
        dc = self.cfg.data
        micro = self.plan.micro
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
            if st.position % plan.grad_accum == 0:  # an optimizer step's first micro-batch
                inject.before_step(st.step + 1, plan.per_gpu, self.dist.world_size)
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
                inject.at("step")
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
        self.timer.ended(profiled)
        self.timeline.mark("last_step", again=True)
        if self.beat is not None:
            self.beat.step(self.paths, self.dist.rank)
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
            inject.at("eval")
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
    def finish(self, exit_code: int, profiling: Profiling | None, recovered: bool = False) -> int:
        """summary.json (every rank writes its own facts, then rank 0 the summary), the closing lines, a joint
        teardown. A trace that could not be written fails the run once its summary is written."""
        self.checkpointer.settle()  # an epoch's checkpoint still being written: whole before the summary
        # Every replay is done (the last step's flags were agreed by all ranks): drop the graph, which holds
        # NCCL's communicator, before the process group goes. Not in close(): after a failure a replay may
        # still wait on a dead peer, and waiting for it would hang the teardown.
        self.graph.release()
        self.summary.facts.update(self.graph.facts())
        st = self.state
        if self.graph.checked_unix is not None:
            self.timeline.mark("graph_checked", self.graph.checked_unix)
        self.timeline.mark("exit")  # the run's end: its summary next
        startup = startup_record(*self.joining, self.timer.first_step_unix, self.timeline)
        wall_s = self.progress.wall_s()
        record = self.summary.rank_record(st.step, st.epoch, self.timer, exit_code, profiling, wall_s, startup)
        record = recovered_record(record) if recovered else record
        self.group.sync_buffers(self.net.model)
        record.weights_sha256 = weights_digest(self.net.model)
        own_error = None
        try:  # every rank writes its own facts, as a script's rank does (hpc/training/hook/autoprofile.py)
            self.summary.write_own(record)
        except WriteError as e:
            own_error = e
        self.stop_if_write_failed(own_error, "its facts file", who="a rank")
        gathered: list[RankFacts | None] = [None] * self.dist.world_size
        tdist.all_gather_object(gathered, record, group=self.group.control)  # the closing lines' traces
        records = [r for r in gathered if r is not None]  # every rank's: all_gather_object fills each slot
        inject.at("summary")
        error = self.metrics.failed if self.metrics is not None else None
        if self.is_main and error is None:
            try:
                self.summary.write()
            except WriteError as e:
                error = e
        self.stop_if_write_failed(error, self.paths.summary.name)
        lines, lost = closing_lines(self.paths, self.checkpointer.path, exit_code, records)
        self.log(lines)
        self.group.barrier()  # tear down together: a peer closing its sockets early upsets gloo's threads
        if lost and self.is_main:
            raise WriteError(lost)
        return EXIT_FAILED if lost else exit_code

    def peer_lost(self, error: BaseException) -> PeerLostError:
        """The one line of a survivor: which peer, at which step, what a rerun resumes from."""
        return self.group.lost_error(
            error, self.state.step + 1, self.checkpointer.written_step(), self.checkpointer.path
        )

    def close(self) -> None:
        """Teardown, whatever happened: the TensorBoard writer and the process group."""
        if self.metrics is not None:
            self.metrics.close()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.sampler is not None:
            self.sampler.stop()
        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()
