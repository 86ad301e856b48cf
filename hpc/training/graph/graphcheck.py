"""Whether a captured step can be trusted: before the first counted step, the graph's first replay is
compared with an eager step taken from the same state, on every rank, and the ranks agree on the
outcome before any of them goes on (train.cuda_graph: auto | true; hpc/training/graph/graphmode.py).
GraphRun carries the graphed step through a run: checked, replayed, dropped or released.

The check, on each rank, leaves the state as it found it (the warm-up's snapshot and restore):
1. an eager step from the state S: its loss and its parameters after the optimizer step; back to S;
2. the capture (the warm-up's eager DDP iterations, then the recording, which runs nothing);
3. the ranks agree that every one of them captured (a replay runs the captured all-reduce: replaying
   a graph a peer does not have would wait for ever);
4. the first replay from S: its loss and parameters against step 1's; back to S;
5. the ranks agree on every rank's outcome (over the control group, which a failed graph cannot block).
A failed capture, a mismatch or a check that outlasts train.graph_check_timeout_s on any rank makes
every rank run eager (auto) or stops the run on every rank with exit 2 (true). A rank that never
finishes (hung in CUDA) cannot be helped by its peers: their wait on the control group ends after
train.collective_timeout_s as a lost peer (exit 5).

The tolerances compare the replay's update with the eager step's, not the weights themselves: one
step changes a weight by lr x gradient, far below its size, so a graph that skipped or garbled the
update would pass a weight check. bf16 autocast and cuDNN's non-deterministic backward kernels make two
eager steps from one state differ by a little; a graph that reads stale inputs, misses the optimizer
step or aliases its memory wrongly differs by the whole update. LOSS_RTOL and UPDATE_RTOL sit between
(summary.json keeps the differences seen, so the margin can be read off real runs). Under
train.deterministic the replay must be bit-identical. The check costs one eager step and one replay
(beside the warm-up capture needs anyway) and, for a moment, copies of the state: the snapshot (the
weights, buffers and momentum) and the eager step's weights, with the warm-up's own snapshot on top
while it runs (about six copies of the weights at the peak, 1.4 GB for ResNet152's 58 M parameters).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpc.core.errors import UsageError
from hpc.core.files import JsonObject
from hpc.settings.schema import TrainConfig
from hpc.training import inject
from hpc.training.graph.cudagraph import GraphedStep, Snapshot

log = logging.getLogger(__name__)

LOSS_RTOL = 1e-3  # |loss_graph - loss_eager| / |loss_eager|: the same forward on the same batch
UPDATE_RTOL = 1e-2  # ||params_graph - params_eager|| / ||params_eager - params_before||: one step's update

Gather = Callable[[Any], list[Any]]  # every rank's value, in rank order (over the control group)


@dataclasses.dataclass(frozen=True)
class RankCheck:
    """One rank's check: `cause` None when it passed."""

    rank: int
    cause: str | None
    seconds: float
    loss_rel_diff: float | None = None
    update_rel_diff: float | None = None


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The ranks' agreed result: `passed`, one `line` for rank 0's log, the `record` for summary.json."""

    passed: bool
    line: str
    record: JsonObject

    def facts(self) -> JsonObject:
        """summary.json's fields: `graph_check` ("passed", or what failed where), its detail, and the step
        mode where the check turned the run eager."""
        said: JsonObject = {
            "graph_check": "passed" if self.passed else self.line.removeprefix("graph check "),
            "graph_check_detail": self.record,
        }
        return said if self.passed else {**said, "step_mode": "eager"}


def settle(result: CheckResult, setting: bool | str) -> str:
    """The line rank 0 logs; with train.cuda_graph = true a failed check is a UsageError (exit 2)."""
    if result.passed:
        return result.line
    if setting is True:
        raise UsageError(f"train.cuda_graph = true, and the {result.line}")
    return f"{result.line}; every rank runs eager (train.cuda_graph = auto)"


def relative(diff_sq: float, size_sq: float) -> float:
    if not math.isfinite(diff_sq) or not math.isfinite(size_sq):
        return math.inf
    return math.sqrt(diff_sq / size_sq) if size_sq > 0 else (0.0 if diff_sq == 0 else math.inf)


def differences(
    before: Sequence[torch.Tensor],
    eager: Sequence[torch.Tensor],
    graph: Sequence[torch.Tensor],
    loss_e: float,
    loss_g: float,
) -> tuple[float, float, bool]:
    """(the loss's relative difference, the update's relative difference, bit-identical?)."""
    graph = [g.detach() for g in graph]  # the live parameters
    diff_sq = sum(float((g.double() - e.double()).pow(2).sum()) for g, e in zip(graph, eager, strict=True))
    update_sq = sum(float((e.double() - b.double()).pow(2).sum()) for e, b in zip(eager, before, strict=True))
    identical = loss_e == loss_g and all(torch.equal(g, e) for g, e in zip(graph, eager, strict=True))
    loss_rel = abs(loss_g - loss_e) / max(abs(loss_e), 1e-12) if math.isfinite(loss_g - loss_e) else math.inf
    return loss_rel, relative(diff_sq, update_sq), identical


def mismatch(loss_rel: float, update_rel: float, identical: bool, exact: bool) -> str | None:
    """Why the replay does not match the eager step, or None."""
    if exact and not identical:
        return (
            f"the replay is not bit-identical to an eager step under train.deterministic (loss {loss_rel:.2g}, "
            f"update {update_rel:.2g} apart)"
        )
    if loss_rel > LOSS_RTOL:
        return f"the replay's loss differs from an eager step's by {loss_rel:.2g} (tolerance {LOSS_RTOL:g})"
    if update_rel > UPDATE_RTOL:
        return f"the replay's update differs from an eager step's by {update_rel:.2g} (tolerance {UPDATE_RTOL:g})"
    return None


class GraphCheck:
    """The check of one rank's GraphedStep (see the module doc): its core run eagerly is the reference;
    `gather` collects a value from every rank; `exact`: bit-identical (train.deterministic). The fault
    point (hpc/training/inject.py, armed by HPC_FAULT_INJECT's graph-* entries) may fail it on purpose."""

    def __init__(
        self,
        step: GraphedStep,
        rank: int,
        gather: Gather,
        exact: bool,
        timeout_s: float,
    ):
        self.step = step
        self.eager = step.core
        self.rank = rank
        self.gather = gather
        self.exact = exact
        self.timeout_s = timeout_s
        named = list(step.model.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]

    def run(self, x: torch.Tensor, y: torch.Tensor) -> CheckResult:
        """Check, agree, and leave the state as it was; after a failure the graph is released."""
        start = time.monotonic()
        saved = self.step.snapshot()
        before = [saved[0][name] for name in self.names]  # the snapshot's copies of the parameters
        loss_e, eager_params = self.eager_step(x, y, saved)
        captured = self.capture(x, y)
        causes = self.gather(captured)
        if any(c is not None for c in causes):
            outcomes = [RankCheck(r, c, time.monotonic() - start) for r, c in enumerate(causes)]
        else:
            outcome = self.compare(x, y, saved, before, loss_e, eager_params, start)
            outcomes = self.gather(outcome)
        result = agree(outcomes, self.exact, self.timeout_s)
        if not result.passed:
            self.step.release(wait=False)  # no replay is in flight: its loss was read (or none ran)
            self.step.restore(saved)
            self.step.optimizer.zero_grad(set_to_none=True)
        return result

    def eager_step(self, x: torch.Tensor, y: torch.Tensor, saved: Snapshot) -> tuple[float, list[torch.Tensor]]:
        """An eager step from the state: its loss and the parameters after it; then the state put back."""
        self.step.optimizer.zero_grad(set_to_none=True)
        loss = float(self.eager(x, y).detach())
        after = [p.detach().clone() for p in self.params]
        self.step.restore(saved)
        self.step.optimizer.zero_grad(set_to_none=True)
        return loss, after

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> str | None:
        """None once captured, else why not (the error's type and first line)."""
        try:
            self.step.capture(x, y)
            if inject.graph_fault("capture-fail"):
                raise RuntimeError("fault injection (HPC_FAULT_INJECT=graph-capture-fail): capture failed on purpose")
        except Exception as e:  # whatever capture raises, the ranks must learn it before anyone replays
            log.debug("graph capture failed on rank %d", self.rank, exc_info=True)
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            return f"capture raised {type(e).__name__}: {first[:200]}"
        return None

    def compare(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        saved: Snapshot,
        before: Sequence[torch.Tensor],
        loss_e: float,
        eager_params: list[torch.Tensor],
        start: float,
    ) -> RankCheck:
        loss_g = float(self.step.replay(x, y).detach())
        if inject.graph_fault("mismatch"):
            with torch.no_grad():  # a replay that wrote the wrong weights: the restore below must undo it
                self.params[0].add_(1.0)
        loss_rel, update_rel, identical = differences(before, eager_params, self.params, loss_e, loss_g)
        self.step.restore(saved)
        cause = mismatch(loss_rel, update_rel, identical, self.exact)
        if inject.graph_fault("slow"):
            time.sleep(self.timeout_s + 0.5)
        seconds = time.monotonic() - start
        if cause is None and seconds > self.timeout_s:
            cause = f"the check took {seconds:.1f} s, over train.graph_check_timeout_s = {self.timeout_s:g}"
        return RankCheck(self.rank, cause, seconds, loss_rel, update_rel)


def agree(outcomes: list[RankCheck], exact: bool, timeout_s: float) -> CheckResult:
    """Every rank's outcomes (the same list on every rank) as one result."""
    failed = [o for o in outcomes if o.cause is not None]
    seconds = max(o.seconds for o in outcomes)
    if failed:
        first = failed[0]
        others = f" (and on {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        line = f"graph check failed on rank {first.rank}{others}: {first.cause}"
        return CheckResult(False, line, {"result": "failed", "rank": first.rank, "cause": first.cause})
    loss_rel = max(o.loss_rel_diff or 0.0 for o in outcomes)
    update_rel = max(o.update_rel_diff or 0.0 for o in outcomes)
    how = (
        "bit-identical to an eager step (train.deterministic)"
        if exact
        else f"the replay within {loss_rel:.2g} (loss) and {update_rel:.2g} (update) of an eager step's, "
        f"tolerances {LOSS_RTOL:g} and {UPDATE_RTOL:g}"
    )
    record = {
        "result": "passed",
        "seconds": round(seconds, 3),
        "loss_rel_diff": loss_rel,
        "update_rel_diff": update_rel,
        "exact": exact,
        "loss_rtol": LOSS_RTOL,
        "update_rtol": UPDATE_RTOL,
        "timeout_s": timeout_s,
    }
    return CheckResult(True, f"graph check passed on {len(outcomes)} rank(s) in {seconds:.1f} s: {how}", record)


class GraphRun:
    """A run's graphed step through its life (None: an eager run): checked before its first replay on
    every rank together, then replayed; dropped on every rank after a failed check (`setting` auto) or the
    run stopped (true); released at the run's end. Of the train section it reads cuda_graph,
    deterministic and graph_check_timeout_s; `say`: rank 0's lines."""

    def __init__(
        self,
        step: GraphedStep | None,
        tc: TrainConfig,
        rank: int = 0,
        gather: Gather | None = None,
        say: Callable[[str], None] = log.info,
    ):
        self.step = step
        self.setting = tc.cuda_graph
        self.say = say
        exact, timeout_s = tc.deterministic, tc.graph_check_timeout_s
        self.check = GraphCheck(step, rank, gather or (lambda v: [v]), exact, timeout_s) if step else None
        self.result: CheckResult | None = None
        self.checked_unix: float | None = None  # when the check ended (summary.json's startup.phases)
        self.replays = 0  # steps this start replayed (a smaller last batch runs eagerly: not one of them)

    @property
    def on(self) -> bool:
        return self.step is not None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The loss of a replayed step (a copy), or None: run this batch eagerly."""
        if self.check is not None and self.result is None:
            self.result = self.check.run(x, y)
            self.checked_unix = time.time()
            self.say(settle(self.result, self.setting))  # true and failed: UsageError, on every rank
            self.step = self.step if self.result.passed else None
        if self.step is None:
            return None
        self.replays += 1
        return self.step(x, y).clone()

    def facts(self) -> JsonObject:
        """summary.json's graph_check fields and the steps replayed, once checked; else none."""
        return {**self.result.facts(), "graph_replays": self.replays} if self.result is not None else {}

    def release(self) -> None:
        if self.step is not None:
            self.step.release()
            self.step = None
