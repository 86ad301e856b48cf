"""Comparing a run's ranks step by step: how far apart their step times are (skew), and which rank the
others wait for at collectives (the straggler). Each rank is timed from its own step starts, so node
clocks need not agree.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import Literal, TypeVar

import msgspec

from analysis.records import Consistency, SlowRank, TraceRecord
from hpc.core.summary import RankEntry

T = TypeVar("T")  # what a trace records per step: a time, or a step's collective launch times
K = TypeVar("K", bound=Hashable)  # a rank as its records key it (a trace's may be None)


def _by_rank_and_step(
    records: list[TraceRecord], values: Callable[[TraceRecord], list[T] | None]
) -> dict[int | None, dict[int, T]]:
    """{rank: {ProfilerStep number: value}} from each trace's per-step lists."""
    out: dict[int | None, dict[int, T]] = {}
    for rec in records:
        # a cut-off trace has more step numbers than values: those steps have none (strict=None reads as False)
        out.setdefault(rec.rank, {}).update(zip(rec.step_numbers, values(rec) or [], strict=False))  # pragma: no mutate
    return out


def step_skew_us(records: list[TraceRecord]) -> float | None:
    """Mean over the profiled steps all ranks have of (slowest rank's step time - fastest rank's)."""
    by_rank = _by_rank_and_step(records, lambda r: r.step_time_us)
    if len(by_rank) < 2:
        return None
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    skews = [max(s[n] for s in by_rank.values()) - min(s[n] for s in by_rank.values()) for n in common]
    return sum(skews) / len(skews) if skews else None


def profiled_step_consistency(records: list[TraceRecord], rank: int | None) -> Consistency:
    """The rule (consistency) on the profiled steps' times, each rank's step by its ProfilerStep number."""
    return consistency(_by_rank_and_step(records, lambda r: r.step_time_us), rank, 1e-3)


def straggler(records: list[TraceRecord]) -> tuple[int | None, float | None]:
    """The rank that launches a collective last most often (each rank's launch time measured from its
    own step start), and the share of collectives it was last at."""
    by_rank = _by_rank_and_step(records, lambda r: r.collective_launch_us)
    if len(by_rank) < 2:
        return None, None
    last: Counter[int | None] = Counter()
    for n in set.intersection(*(set(steps) for steps in by_rank.values())):
        launches = {rank: steps[n] for rank, steps in by_rank.items()}
        for j in range(min(len(v) for v in launches.values())):
            last.update([max(launches, key=lambda rank: launches[rank][j])])
    if not last:
        return None, None
    rank = max(last, key=last.__getitem__)  # the first of the most often last, as most_common(1) has it
    return rank, last[rank] / sum(last.values())


# Its node is the slow one (not the rank) when the node's other ranks carry at least this part of its excess.
SLOW_NODE_PART = 0.5
# A rank's own work is a median over at least this many steps before it may name a straggler: one step of
# a CPU rank can be 4x its neighbour's (seen in a 4-step study point), and a median of three outvotes one.
MIN_OWN_STEPS = 3


def _own_median_s(rank: RankEntry) -> float | None:
    stats = rank.own_step_time_s
    return stats.median if stats is not None and stats.n >= MIN_OWN_STEPS else None


# Ranks talk when a collective ran in at least this part of the intervals between their optimizer steps:
# under DDP every interval has one; a script that only shares a sampler has one an epoch (a metric's
# all-reduce at validation), which makes no rank wait for another's steps.
TALKING_SHARE = 0.5


def separate_copies(ranks: list[RankEntry]) -> str | None:
    """Why a run's ranks never waited for each other, in words, or None: two or more ranks, each said by its
    start-up hook to be in no process group at its first step (a DataParallel or single-process script
    started on every GPU), or to have run a collective in under TALKING_SHARE of its step intervals
    (a process group, no DDP: pytorch/examples' imagenet/main.py on a CPU). No imbalance is told of them."""
    if len(ranks) < 2:
        return None
    said = [r.process_group for r in ranks if r.process_group is not None]
    if said and not any(said):
        return f"{len(ranks)} ranks each trained a separate copy: no torch.distributed process group"
    counts: list[tuple[int, int]] = []
    for r in ranks:
        c = r.collectives_in_steps
        # n >= 0 would let (0, 0) in, and any() then says the same: not mutated
        if c is not None and c.intervals > 0 and c.with_collectives >= 0:  # pragma: no mutate
            counts.append((c.intervals, c.with_collectives))
    if len(counts) < len(ranks):  # a rank that did not measure it (or said nonsense): not said
        return None
    if any(w >= TALKING_SHARE * n for n, w in counts):
        return None
    most, fewest = max(w for _, w in counts), min(n for n, _ in counts)
    talk = (
        f"no collective in any of their {fewest} or more step intervals"
        if most == 0
        else f"a collective in only {most} of their {fewest} or more step intervals"
    )
    return (
        f"{len(ranks)} ranks each trained a separate copy: a process group, but {talk} (no "
        "DistributedDataParallel), so no rank waited for another"
    )


# A straggler is named only on evidence that holds across the steps, not in a mean (README, "Verdicts"):
# compared step by step over at least MIN_COMPARED_STEPS steps that every rank measured, it is above the
# others' median in at least MOST_STEPS of them, and its median excess over them is more than SPREADS
# times the run's own step-to-step spread (the median over ranks of each rank's interquartile range). A
# busy machine's noise moves from rank to rank, and one rank a little behind on a loaded machine stays
# within its spread; a slow rank is slow in nearly every step, by more than the noise.
MIN_COMPARED_STEPS = 10
MOST_STEPS = 0.75
SPREADS = 2.0


def _excesses(by_rank: Mapping[K, dict[int, float]], candidate: K) -> tuple[list[int], list[float]]:
    """The steps every rank measured, and at each the candidate's value over the others' median."""
    others = [r for r in by_rank if r != candidate]
    common = sorted(set(by_rank.get(candidate, {})).intersection(*(set(by_rank[r]) for r in others)))
    if not others:
        return [], []
    return common, [by_rank[candidate][n] - statistics.median(by_rank[r][n] for r in others) for n in common]


def _iqr(values: list[float]) -> float:
    """The interquartile range, linear interpolation between ranks' values (the stdlib's inclusive method)."""
    q1, _, q3 = statistics.quantiles(values, method="inclusive")  # quartiles, its default
    return q3 - q1


def consistency(by_rank: Mapping[K, dict[int, float]], candidate: K, to_ms: float) -> Consistency:
    """Whether `candidate` is slower than the others step by step (the rule above), from each rank's
    {step: time}: the steps compared, those it was above the others' median in, its median excess and the
    run's spread (in the values' unit; `to_ms` makes them ms for the words), whether that holds, and if
    not, why, in words."""
    common, excesses = _excesses(by_rank, candidate)
    if len(common) < MIN_COMPARED_STEPS:
        few = f"{len(common)} step(s) measured by every rank, {MIN_COMPARED_STEPS} needed to compare ranks"
        return Consistency(steps_compared=len(common), why_not=few)
    above = sum(e > 0 for e in excesses)
    excess = statistics.median(excesses)
    spread = statistics.median(_iqr([v[n] for n in common]) for v in by_rank.values())
    holds = above >= MOST_STEPS * len(common) and excess > SPREADS * spread
    why = (
        None
        if holds
        else f"rank {candidate} was above the others in {above} of {len(common)} steps (a straggler: "
        f"{MOST_STEPS:.0%} or more), by a median {excess * to_ms:.2f} ms against the run's step-to-step spread "
        f"of {spread * to_ms:.2f} ms (a straggler: over {SPREADS:g}x)"
    )
    return Consistency(
        steps_compared=len(common), steps_above=above, excess=excess, spread=spread, holds=holds, why_not=why
    )


# A rank whose own work exceeds the others' because it waited for a core (runnable, not running: other
# processes on its CPUs) did no more work: at least this part of its excess spent so is the machine's load.
STARVED_PART = 0.5


def starved(ranks: list[RankEntry], candidate: int, evidence: Consistency) -> str | None:
    """Why a straggler by wall time is a rank that waited for a core, in words; None where its wait for a
    core (own_step_series' queued_ms) explains under STARVED_PART of its excess, or is not known."""
    queued = {r.rank: own_series(r, "queued_ms") for r in ranks}
    if not evidence.holds or evidence.excess is None:
        return None
    common, waits = _excesses(queued, candidate)  # none in common where a rank (or the candidate) has none
    if len(common) < MIN_COMPARED_STEPS:
        return None
    waited = statistics.median(waits)
    if waited < STARVED_PART * evidence.excess:
        return None
    return (
        f"rank {candidate}'s own work took a median {evidence.excess * 1e3:.2f} ms more than the others' a step, "
        f"{waited * 1e3:.2f} ms of it waiting for a core (other processes on its CPUs: the machine's load), "
        "not more work"
    )


def own_series(rank: RankEntry, key: Literal["ms", "queued_ms"] = "ms") -> dict[int, float]:
    """{step: own work in seconds} of a rank's summary record (own_step_series, hpc/training/steptimes.py);
    `key` queued_ms: its wait for a core in the same spans."""
    series = rank.own_step_series
    if series is None:
        return {}
    values = series.ms if key == "ms" else series.queued_ms
    return {
        series.first_step + i: v / 1e3
        for i, v in enumerate(values or [])
        if v is not None and math.isfinite(v) and v >= 0
    }


def slow_rank(ranks: list[RankEntry]) -> SlowRank | None:
    """The straggler from every rank's step timing in summary.json, profiled or not: the rank with the most
    own work per step (the part before its gradient sync, hpc/training/steptimes.py's StepClock), against the
    other ranks' median (what they wait for it: with two ranks, the other's own work), and whether its
    node's other ranks are as slow (a slow node, not a slow rank).
    `wait_share`: the part of a step the other ranks wait for it. None: under two ranks measured over
    MIN_OWN_STEPS steps or more. `holds`: the rule above (consistency), without which no straggler is named;
    `why_not` says why it does not hold."""
    own = {r.rank: v for r in ranks if (v := _own_median_s(r)) is not None}
    if len(own) < 2:
        return None
    node = {r.rank: str(r.node or r.hostname or "?") for r in ranks if r.rank in own}
    slowest = max(own, key=lambda r: (own[r], -r))
    median = statistics.median([v for r, v in own.items() if r != slowest])
    mates = [v for r, v in own.items() if r != slowest and node[r] == node[slowest]]
    mates_median = statistics.median(mates) if mates else None
    steps = [s.median for r in ranks if (s := r.step_time_s) is not None and s.median]
    step = statistics.median(steps) if steps else None
    excess = own[slowest] - median
    evidence = consistency({r.rank: own_series(r) for r in ranks if r.rank in own}, slowest, 1e3)
    waited_for_a_core = starved([r for r in ranks if r.rank in own], slowest, evidence)
    if waited_for_a_core:
        evidence = msgspec.structs.replace(evidence, holds=False, why_not=waited_for_a_core)
    return SlowRank(
        **msgspec.structs.asdict(evidence),
        rank=slowest,
        node=node[slowest],
        own_s=own[slowest],
        median_own_s=median,
        ranks_measured=len(own),
        node_others_own_s=mates_median,
        slow_node=mates_median is not None and excess > 0 and mates_median - median >= SLOW_NODE_PART * excess,
        step_s=step,
        wait_share=max(0.0, min(1.0, excess / step)) if step else None,
    )


def slow_rank_words(s: SlowRank) -> str:
    """`rank 13 on nid004: own work 0.31 s a step against the other 31 ranks' median of 0.01 s (25x); its node's
    other 3 ranks 0.01 s: a slow rank, not a slow node`."""
    ratio = f" ({s.own_s / s.median_own_s:.1f}x)" if s.median_own_s > 0 else ""
    mates = s.node_others_own_s
    node = (
        f"its node's other ranks {mates * 1e3:.1f} ms: "
        + ("a slow node, not a slow rank" if s.slow_node else "a slow rank, not a slow node")
        if mates is not None
        else "no other rank on its node"
    )
    steps = f", above the others in {s.steps_above} of {s.steps_compared} steps" if s.steps_above is not None else ""
    return (
        f"rank {s.rank} on {s.node}: own work (before the gradient sync) {s.own_s * 1e3:.1f} ms a step "
        f"against the other {s.ranks_measured - 1} ranks' median of {s.median_own_s * 1e3:.1f} ms{ratio}{steps}; "
        f"{node}"
    )
