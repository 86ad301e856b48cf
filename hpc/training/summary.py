"""What a training rank measured, for summary.json: `RunSummary` knows the run's fixed facts from its
set-up and makes each rank's record at the end (step times, throughput, memory, the profiler's cycles,
the weights' digest); each rank writes its own facts (RUN/ranks/rank{R}.facts.json), as a script's rank
does, and rank 0 makes summary.json of them by its one writer (hpc/core/summary.py), as for any task.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import msgspec
import torch

from hpc.core.ending import Outcome
from hpc.core.errors import WriteError
from hpc.core.rundir import RunPaths
from hpc.core.summary import RankFacts, StartupRecord, attempt_of, write_facts, write_run_summary
from hpc.placement.distenv import DistEnv
from hpc.settings.rankcommand import RUN_DIR_VARIABLE
from hpc.settings.schema import RunConfig
from hpc.training.build import StepPlan, placement
from hpc.training.profiling import Profiling
from hpc.training.steptimes import RANK_MEASURES, StepClock, measures


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every tensor of the state: anyone can check that every rank ends with the same weights."""

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def performance_env() -> dict[str, str]:
    """The environment that shapes performance, for reproducing the run."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(("OMP_", "NCCL_", "FI_", "GLOO_", "HPC_", "TORCH_", "TEARDOWN_CUPTI", "CUDA_MODULE_"))
        or k == "CUDA_VISIBLE_DEVICES"
    }


class RunSummary:
    """The run's record in summary.json: fixed facts now, each rank's measurements at the end."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        dist: DistEnv,
        device: torch.device,
        backend: str,
        plan: StepPlan,
        train_images: int,
        flops_per_image: int | None = None,
        graphed: bool = False,
    ):
        self.cfg = cfg
        self.paths = RunPaths(run_dir)
        self.dist = dist
        self.device = device
        self.plan = plan
        self.use_cuda = device.type == "cuda"
        self.where = placement(device)  # its cores and GPU (hpc/placement/affinity.py)
        self.facts = {
            "rank": dist.rank,
            "world_size": dist.world_size,
            "local_rank": dist.local_rank,
            "node_rank": dist.node_rank,
            "hostname": socket.gethostname(),
            # the node as Slurm names it (nid001...: the hostname on Perlmutter, not on a one-machine cluster)
            "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "launcher": dist.launcher,
            "attempt": attempt_of(os.environ),  # which start of the job measured this
            "master_addr": dist.master_addr,
            "device": str(device),
            "backend": backend,
            "arch": cfg.model.arch,
            "stem": cfg.model.stem,
            "batch_size_per_gpu": plan.per_gpu,
            "global_batch_size": plan.global_batch,
            "data_fraction": cfg.data.fraction,
            "data_source": cfg.data.source,  # cifar100, or synthetic (checked against the root at set-up)
            # how a step ran: a replayed CUDA graph (train.cuda_graph) or eager
            "step_mode": "graph" if graphed else "eager",
            # a graphed run's check before its first step: "passed", or what failed where (then eager)
            "graph_check": None,
            "graph_check_detail": None,
            "graph_replays": None,  # steps of this start that replayed the graph (a smaller last batch: eager)
            "ddp": True,  # at every rank count, graphed or eager (DDP's all-reduce is captured with the step)
            "train_images": int(train_images),
            "steps_per_epoch": plan.steps_per_epoch,
            # forward FLOPs per image (conv and linear layers): the analysis's share of the device's peak
            "model_flops_per_image": flops_per_image,
            "affinity": self.where,
            "slurm": {k: os.environ.get(f"SLURM_{k.upper()}") for k in ("job_id", "job_qos", "job_partition")},
        }

    def rank_record(
        self,
        step: int,
        epoch: int,
        clock: StepClock,
        exit_code: int,
        profiling: Profiling | None,
        wall_s: float,
        startup: StartupRecord,
    ) -> RankFacts:
        """This rank's entry: the facts, where it stopped, its measurements (hpc/training/steptimes.py's
        `measures`, as a script's), throughput, the environment, the profiler's cycles and the traces it
        wrote (and those it could not: `profiler.failed`). `profiling`: hpc.training.profiling's Profiling,
        or None."""
        measured = measures(clock, profiling, wall_s, startup, self.device if self.use_cuda else None)
        record = {
            **self.facts,
            "device_name": torch.cuda.get_device_name(self.device) if self.use_cuda else "cpu",
            "torch": str(torch.__version__),
            "steps": step,
            "epochs_completed": epoch,
            "exit_code": exit_code,
            "complete": exit_code == 0,
            **measured,
            "env": performance_env(),
            "profiler": {
                "cycles": profiling.cycles if profiling is not None else [],
                "traces": self.paths.rank_traces(self.dist.rank),
                "failed": profiling.failed if profiling is not None else [],
            },
        }
        facts = msgspec.convert(record, RankFacts)
        mean_step = facts.step_time_s.mean if facts.step_time_s is not None else None
        facts.images_per_s = self.plan.per_gpu / mean_step if mean_step else None
        facts.global_images_per_s = self.plan.global_batch / mean_step if mean_step else None
        return facts

    def write_own(self, record: RankFacts) -> None:
        """This rank's facts (RUN/ranks/rank{R}.facts.json), written by the rank itself as a script's are.
        A write that fails is a WriteError naming the file."""
        try:
            write_facts(self.paths, record)
        except WriteError:
            raise
        except OSError as e:  # the ranks/ folder could not be made
            raise WriteError(f"{self.paths.rank_facts(self.dist.rank)}: not written ({e.strerror or e})") from None

    def write(self) -> Path:
        """summary.json made of every rank's facts (rank 0, once all have written theirs) by its one writer."""
        try:
            write_run_summary(self.paths)
        except WriteError:
            raise
        except OSError as e:  # the ranks/ folder could not be made
            raise WriteError(f"{self.paths.ranks}: not written ({e.strerror or e})") from None
        return self.paths.summary


# What a rank measures while it trains (the training's and a script's alike: RANK_MEASURES), and what only
# the training can (its batch); a rerun that only writes a finished run's missing summary saw none of it,
# so it records none of it (null) rather than its own few seconds.
MEASURED = (*RANK_MEASURES, "images_per_s", "global_images_per_s")


def recovered_record(record: RankFacts) -> RankFacts:
    return msgspec.structs.replace(record, **dict.fromkeys(MEASURED), recovered=True)


def closing_lines(paths: RunPaths, checkpoint: Path, exit_code: int, records: list[RankFacts]) -> tuple[str, str]:
    """(what rank 0 prints at the end, the line of the failure when a trace could not be written or "")."""
    outcome = "stopped by signal, checkpoint written (rerun to resume)" if exit_code else str(Outcome.DONE)
    failed = [(r.rank, f) for r in records if r.profiler is not None for f in r.profiler.failed]
    written = sum(len(r.profiler.traces) for r in records if r.profiler is not None)
    traces = f"{paths.traces} ({written} written{f', {len(failed)} NOT written' if failed else ''})"
    if not written and not failed:
        traces = "none written (the profiler was off, or the run ended before its window closed)"
    lines = [
        outcome,
        f"  run:        {paths.root}",
        f"  traces:     {traces}",
        *(f"    not written: rank {rank}'s {f.file} ({f.error})" for rank, f in failed),
        f"  summary:    {paths.summary}",
        f"  checkpoint: {checkpoint}",
    ]
    if os.environ.get(RUN_DIR_VARIABLE):  # run by a job's runner, whose launcher says where things are, once
        lines = lines[:1]
    lost = ""
    if failed:
        rank, first = failed[0]
        lost = (
            f"{len(failed)} profiler trace(s) could not be written, first rank {rank}'s "
            f"{paths.traces / str(first.file)} "
            f"({first.error}); the run's other files are complete (summary.json lists what was written)"
        )
    return "\n".join(lines), lost
