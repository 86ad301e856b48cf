"""HPC_FAULT_INJECT, the test hook that makes a run fail on purpose, at a moment a test chooses, on a machine
without a GPU: its one grammar, parsed here and nowhere else (what each entry does in a training
process: hpc/training/inject.py, the one point the training arms).

    HPC_FAULT_INJECT=<entry>[,<entry>...]
    entry: oom-at-step:N[@batch=B][@world=W]    CUDA out of memory before optimizer step N (from 1)
           fail-at-step:N[@batch=B][@world=W]   a plain error there instead (a crashed point)
           signal:SIG@MOMENT[:N][@rank=R]       the process sends itself SIG (KILL, TERM, INT, USR2, STOP) at
                                                MOMENT of optimizer step N (every time it comes without
                                                N), on rank R only (every rank without it)
           kill-during-checkpoint               = signal:KILL@checkpoint once a checkpoint exists
           slow-step:MS[@rank=R]                every optimizer step sleeps MS milliseconds first (on rank R
                                                only): a straggler, or a run made long enough to act on
           graph-capture-fail[@rank=R]          the graph check's capture raises (on rank R only)
           graph-mismatch[@rank=R]              the graph check's replay leaves wrong weights (rank R)
           graph-slow[@rank=R]                  the graph check outlasts train.graph_check_timeout_s

    MOMENT  start       set-up done, before the first step
            step        inside step N, after its forward pass
            checkpoint  half-way through writing the checkpoint of step N
            trace       a trace exported after step N, before it is published under its name
            eval        evaluation after step N (an epoch's end) has begun
            summary     the run's last checkpoint written, summary.json not yet

`@batch` and `@world` limit an entry to runs of that per-GPU batch and world size: one point of a
sweep. An entry not in this grammar is an error naming it (a typo must not switch every fault off).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hpc.core.errors import UsageError

VARIABLE = "HPC_FAULT_INJECT"
_AT_STEP = re.compile(r"(oom|fail)-at-step:(\d{1,9})((?:@(?:batch|world)=\d{1,9})*)")
_FILTER = re.compile(r"@(batch|world)=(\d+)")
SIGNALS = ("KILL", "TERM", "INT", "USR2", "STOP")  # STOP: a rank that hangs, alive but silent
MOMENTS = ("start", "step", "checkpoint", "trace", "eval", "summary")
_SIGNAL = re.compile(rf"signal:({'|'.join(SIGNALS)})@({'|'.join(MOMENTS)})(?::(\d{{1,9}}))?(?:@rank=(\d{{1,6}}))?")
KILL_DURING_CHECKPOINT = "kill-during-checkpoint"
GRAPH_FAULTS = ("capture-fail", "mismatch", "slow")  # what the graph check (hpc/training/graph/graphcheck.py) meets
_SLOW = re.compile(r"slow-step:(\d{1,7})(?:@rank=(\d{1,6}))?")
_GRAPH = re.compile(rf"graph-({'|'.join(GRAPH_FAULTS)})(?:@rank=(\d{{1,6}}))?")


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # oom | fail | signal | slow | graph
    step: int | None = None  # oom/fail: before this optimizer step (from 1); signal: at this step (None: each)
    batch: int | None = None  # only runs of this per-GPU batch
    world: int | None = None  # only runs of this many ranks
    signal: str | None = None  # signal: KILL, TERM, INT or USR2
    moment: str | None = None  # signal: one of MOMENTS; graph: one of GRAPH_FAULTS
    rank: int | None = None  # signal, slow, graph: only this rank
    once_saved: bool = False  # kill-during-checkpoint: only once a checkpoint exists
    ms: int = 0  # slow: how long each optimizer step sleeps first

    def hits(self, next_step: int, batch_per_gpu: int, world: int) -> bool:
        return self.step == next_step and self.batch in (None, batch_per_gpu) and self.world in (None, world)

    def fires(self, moment: str, step: int, rank: int) -> bool:
        """A signal entry's: is `moment` of optimizer step `step` on `rank` its time?"""
        return (
            self.kind == "signal" and self.moment == moment and self.step in (None, step) and self.rank in (None, rank)
        )


def _entry(entry: str, text: str, source: str) -> Fault:
    if entry == KILL_DURING_CHECKPOINT:
        return Fault("signal", signal="KILL", moment="checkpoint", once_saved=True)
    if m := _GRAPH.fullmatch(entry):
        return Fault("graph", moment=m.group(1), rank=int(m.group(2)) if m.group(2) else None)
    if m := _SLOW.fullmatch(entry):
        return Fault("slow", rank=int(m.group(2)) if m.group(2) else None, ms=int(m.group(1)))
    if m := _SIGNAL.fullmatch(entry):
        step = int(m.group(3)) if m.group(3) else None
        return Fault("signal", step, signal=m.group(1), moment=m.group(2), rank=int(m.group(4)) if m.group(4) else None)
    if m := _AT_STEP.fullmatch(entry):
        filters = {k: int(v) for k, v in _FILTER.findall(m.group(3))}
        return Fault(m.group(1), int(m.group(2)), filters.get("batch"), filters.get("world"))
    raise UsageError(
        f"{source}={text[:200]!r}: entry {entry[:80]!r} is not oom-at-step:N, fail-at-step:N (each with optional "
        f"@batch=B@world=W), signal:SIG@MOMENT[:N][@rank=R] (SIG {'|'.join(SIGNALS)}, MOMENT "
        f"{'|'.join(MOMENTS)}), slow-step:MS[@rank=R], {KILL_DURING_CHECKPOINT} "
        f"or graph-{{{','.join(GRAPH_FAULTS)}}}[@rank=R]"
    )


def parse_faults(text: str, source: str = VARIABLE) -> tuple[Fault, ...]:
    """The entries of a HPC_FAULT_INJECT value; UsageError naming the first entry not in the grammar."""
    return tuple(_entry(entry, text, source) for entry in (text.split(",") if text else ()))


def graph_fault(faults: tuple[Fault, ...], what: str, rank: int) -> bool:
    """Whether a graph-`what` entry applies to `rank`."""
    return any(f.kind == "graph" and f.moment == what and f.rank in (None, rank) for f in faults)


def faults_from_env(env: Mapping[str, str]) -> tuple[Fault, ...]:
    return parse_faults(env.get(VARIABLE, ""))
