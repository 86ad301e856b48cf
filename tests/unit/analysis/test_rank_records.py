"""The straggler's inputs read from what a run recorded (analysis/runs/ranks.py): each rank's summary record
(own work per step, its series, its node) and each trace's steps. Every expected value is worked out here
from the records built, with binary-exact numbers where a threshold is met exactly."""

import math

import pytest

import msgspec
from recordedruns import entries

from analysis.records import Consistency, TraceRecord
from analysis.runs import ranks as rr

STEPS = 12  # over MIN_COMPARED_STEPS (10): the rule may hold


def rank(r, own_ms, node="nid001", step_s=0.5, queued_ms=None, **extra):
    """A rank's summary record as the training writes it: own work per step (median over the steps and each
    step's), its wait for a core, the step's wall time, its node."""
    series = {"first_step": 3, "ms": [own_ms] * STEPS}
    if queued_ms is not None:
        series["queued_ms"] = [queued_ms] * STEPS
    out = {"rank": r, "node": node, "own_step_time_s": {"n": STEPS, "median": own_ms / 1e3},
           "own_step_series": series, **extra}
    if step_s is not None:
        out["step_time_s"] = {"median": step_s}
    return out


def slow_rank(ranks):
    return rr.slow_rank(entries(ranks))


def own_series(rank):
    return rr.own_series(entries([{"rank": 0, **rank}])[0])


def separate_copies(ranks):
    return rr.separate_copies(entries(ranks))


def starved(ranks, candidate, evidence):
    return rr.starved(entries(ranks), candidate, evidence)


def wobbling(r, own_ms, node="nid001", **kw):
    """A rank whose own work wobbles by 1 ms step to step (a spread of about 1 ms) around own_ms."""
    out = rank(r, own_ms, node, **kw)
    out["own_step_series"]["ms"] = [own_ms + (-1.0, 1.0, 0.0, 0.5)[i % 4] for i in range(STEPS)]
    return out


def test_a_slow_node_is_one_whose_other_ranks_carry_half_its_excess_or_more():
    """Rank 0 at 750 ms, its node's other rank at 500, two ranks elsewhere at 250: the others' median is
    250, the excess 500, the node's other rank 250 over that median: half the excess exactly, a slow node."""
    at = slow_rank([rank(0, 750.0), rank(1, 500.0), rank(2, 250.0, "nid002"), rank(3, 250.0, "nid002")])
    assert (at.rank, at.node, at.own_s, at.median_own_s, at.node_others_own_s) == (
        0, "nid001", 0.75, 0.25, 0.5)
    assert at.slow_node is True and at.step_s == 0.5 and at.wait_share == 1.0  # capped at the step
    under = slow_rank([rank(0, 750.0), rank(1, 496.0), rank(2, 250.0, "nid002"), rank(3, 250.0, "nid002")])
    assert under.slow_node is False  # 246 ms of a 500 ms excess: under half
    level = slow_rank([rank(0, 250.0), rank(1, 250.0), rank(2, 250.0, "nid002")])
    assert level.slow_node is False and level.wait_share == 0.0  # no excess: no slow node


def test_the_node_is_the_records_node_else_its_hostname_else_unknown():
    ranks = [rank(0, 300.0, node=None, hostname="h0"), rank(1, 100.0, node=None, hostname="h1"),
             rank(2, 100.0, node=None)]
    at = slow_rank(ranks)
    assert at.node == "h0" and at.node_others_own_s is None  # alone on its host
    ranks[0]["hostname"] = None
    assert slow_rank(ranks).node == "?"


def test_a_rank_without_a_step_time_leaves_the_wait_share_unknown():
    at = slow_rank([rank(0, 300.0, step_s=None), rank(1, 100.0, step_s=None)])
    assert at.step_s is None and at.wait_share is None
    some = slow_rank([rank(0, 300.0, step_s=None), rank(1, 100.0, step_s=0.8)])
    assert some.step_s == 0.8 and some.wait_share == pytest.approx(0.2 / 0.8)


def test_a_median_not_measured_is_no_measurement():
    bad = rank(0, 300.0)
    bad["own_step_time_s"]["median"] = None
    assert slow_rank([bad, rank(1, 100.0), rank(2, 100.0)]).rank in (1, 2)  # rank 0 is not measured
    assert slow_rank([bad, rank(1, 100.0)]) is None  # one rank measured: nothing to compare


@pytest.mark.parametrize("median", [True, "0.3", "x"])
def test_a_median_that_is_not_a_number_is_refused_when_read(median):
    bad = rank(0, 300.0)
    bad["own_step_time_s"]["median"] = median
    with pytest.raises(msgspec.ValidationError, match="own_step_time_s.median"):
        entries([bad])


def test_why_a_rank_a_little_behind_is_no_straggler_in_milliseconds():
    """Rank 0 0.25 ms behind ranks wobbling by a 1 ms spread: not over twice the spread. The words give the
    excess and spread in ms from the records' seconds."""
    ranks = [wobbling(0, 100.25), wobbling(1, 100.0), wobbling(2, 100.0)]
    at = slow_rank(ranks)
    by_rank = {r["rank"]: own_series(r) for r in ranks}
    iqr = [rr._iqr(list(series.values())) for series in by_rank.values()]
    assert at.spread == pytest.approx(sorted(iqr)[1]) and at.excess == pytest.approx(0.25e-3)
    assert at.holds is False and at.why_not == (
        f"rank 0 was above the others in {STEPS} of {STEPS} steps (a straggler: 75% or more), by a median 0.25 ms "
        f"against the run's step-to-step spread of {at.spread * 1e3:.2f} ms (a straggler: over 2x)")
    # each rank's 12 values, sorted: -1, 0, 0.5, 1 (ms, about its own) thrice; linear quartiles at positions
    # 2.75 and 8.25 of 0..11: -0.25 and 0.625, an IQR of 0.875 ms (the exclusive method would give 1.625)
    assert at.spread == pytest.approx(0.875e-3)


def test_a_rank_that_waited_for_a_core_is_the_machines_load_and_said_so():
    """Rank 0's own work 50 ms over the others' in every step, 40 ms of it waiting for a core: at least
    half of the excess, so the straggler does not hold and the words say why."""
    ranks = [rank(0, 150.0, queued_ms=40.0), rank(1, 100.0, queued_ms=0.0), rank(2, 100.0, queued_ms=0.0)]
    at = slow_rank(ranks)
    assert at.holds is False and at.why_not == (
        "rank 0's own work took a median 50.00 ms more than the others' a step, 40.00 ms of it waiting for a core "
        "(other processes on its CPUs: the machine's load), not more work")
    ranks[1]["own_step_series"].pop("queued_ms")  # a rank that did not measure it: the straggler stands
    assert slow_rank(ranks).holds is True
    assert starved(ranks[:1], 0, Consistency(steps_compared=12, holds=True, excess=50e-3)) is None  # no other rank to compare with


def test_words_for_a_slow_rank_give_its_node_mates_in_milliseconds():
    at = slow_rank([rank(0, 750.0), rank(1, 500.0), rank(2, 250.0, "nid002"), rank(3, 250.0, "nid002")])
    assert rr.slow_rank_words(at) == (
        f"rank 0 on nid001: own work (before the gradient sync) 750.0 ms a step against the other 3 ranks' median "
        f"of 250.0 ms (3.0x), above the others in {STEPS} of {STEPS} steps; its node's other ranks 500.0 ms: "
        "a slow node, not a slow rank")


def test_a_ranks_series_keeps_its_step_numbers_and_only_real_durations():
    r = {"own_step_series": {"first_step": 5, "ms": [1.0, -1, float("nan"), None, 4, float("inf"), 0]}}
    assert own_series(r) == {5: 1e-3, 9: 4e-3, 11: 0.0}
    for bad in ({"first_step": 5.0, "ms": [1.0]}, {"first_step": 5, "ms": ["3"]}, {"first_step": 5, "ms": [True]}):
        with pytest.raises(msgspec.ValidationError):  # a step number is whole, a time a number: else refused
            own_series({"own_step_series": bad})


@pytest.mark.parametrize("intervals, talked, said", [
    (1, 0, "2 ranks each trained a separate copy: a process group, but no collective in any of their 1 or more "
           "step intervals (no DistributedDataParallel), so no rank waited for another"),
    (10, 4, "2 ranks each trained a separate copy: a process group, but a collective in only 4 of their 10 or "
            "more step intervals (no DistributedDataParallel), so no rank waited for another"),
    (10, 5, None),  # half the intervals: they talk (TALKING_SHARE)
    (0, 0, None),  # no interval measured: nothing said
])
def test_ranks_that_rarely_talk_are_separate_copies(intervals, talked, said):
    ranks = [{"rank": r, "collectives_in_steps": {"intervals": intervals, "with_collectives": talked}} for r in (0, 1)]
    assert separate_copies(ranks) == said


@pytest.mark.parametrize("talked", [None, True, 1.5])
def test_a_collectives_count_that_is_not_a_count_is_refused_when_read(talked):
    with pytest.raises(msgspec.ValidationError, match="with_collectives"):
        entries([{"rank": 0, "collectives_in_steps": {"intervals": 10, "with_collectives": talked}}])


def test_a_candidate_without_steps_compares_none():
    got = rr.consistency({1: {n: 1.0 for n in range(20)}, 2: {n: 1.0 for n in range(20)}}, 0, 1.0)
    assert got.steps_compared == 0 and got.holds is False


def trace(r, steps, times=None, launches=None):
    return TraceRecord(file=f"rank{r}.json", rank=r, step_numbers=list(steps), step_time_us=list(times or []),
                       collective_launch_us=launches)


def test_profiled_steps_are_compared_by_their_numbers_in_microseconds():
    """Rank 1 is 500 us slower in the 12 profiled steps both ranks traced; a trace with a step number more
    than it has times (a cut-off trace) adds nothing for that step."""
    fast = [trace(0, range(STEPS + 1), [1000.0 + (n % 3) for n in range(STEPS)])]
    slow = [trace(1, range(STEPS), [1500.0 + (n % 3) for n in range(STEPS)])]
    got = rr.profiled_step_consistency(fast + slow, 1)
    assert got.steps_compared == STEPS and got.steps_above == STEPS and got.excess == 500.0
    assert got.holds is True
    level = rr.profiled_step_consistency([trace(0, range(STEPS), [1000.0 + (n % 3) for n in range(STEPS)]),
                                          trace(1, range(STEPS), [1000.5 + (n % 3) for n in range(STEPS)])], 1)
    assert level.why_not.endswith("by a median 0.00 ms against the run's step-to-step spread of 0.00 ms "
                                     "(a straggler: over 2x)")  # 0.5 us and 1 us spread, in ms


def test_the_straggler_by_launches_is_the_rank_most_often_last():
    launches = {0: [[1.0, 5.0], [1.0, 1.0]], 1: [[2.0, 1.0], [2.0, 2.0]], 2: [[0.0, 0.0], [0.0, 3.0]]}
    records = [trace(r, [7, 8], launches=steps) for r, steps in launches.items()]
    # step 7: rank 1 last at the first collective, rank 0 at the second; step 8: rank 1, then rank 2
    assert rr.straggler(records) == (1, 0.5)
    assert rr.straggler(records[:1]) == (None, None)
    assert math.isclose(rr.step_skew_us([trace(0, [1, 2], [10.0, 20.0]), trace(1, [2, 3], [25.0, 9.0])]), 5.0)
