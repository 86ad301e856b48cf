"""The straggler rule (analysis/runs/ranks.py) and the data-loading rule (analysis/explain/verdict.py), each
threshold pinned just under and just over it. The oracle is the README's rule in its words ("Verdicts":
over 10 or more steps every rank measured, above the others' median in 75% or more of them, by a median
excess more than twice the run's step-to-step spread, the median of the ranks' interquartile ranges; the
DataLoader named only where it takes 25% of half or more of the profiled steps): each case is built so
that the rule's terms are known by construction, and the expected answer is worked out here from them."""

import statistics

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from recordedruns import entries
from stragglers import readme_straggler

BASE_MS = 10.0


def others(steps: int, wobble: float) -> list[dict[int, float]]:
    """Three ranks whose own work wobbles by +-wobble ms around BASE_MS: a known step-to-step spread."""
    pattern = [-wobble, wobble, 0.0, -wobble / 2, wobble / 2]
    return [{n: BASE_MS + pattern[(n + k) % 5] for n in range(steps)} for k in range(3)]


def with_candidate(mates: list[dict[int, float]], excess_at: dict[int, float]) -> dict[int, dict[int, float]]:
    """Rank 0 at the others' median plus `excess_at[n]` at step n; ranks 1-3 the others."""
    steps = sorted(mates[0])
    candidate = {n: statistics.median(m[n] for m in mates) + excess_at[n] for n in steps}
    return {0: candidate, **{i + 1: m for i, m in enumerate(mates)}}


def run_spread(by_rank: dict[int, dict[int, float]]) -> float:
    """The README's spread, computed here: each rank's interquartile range (linear quartiles), their median."""
    def iqr(values):
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return q3 - q1

    return statistics.median(iqr(list(series.values())) for series in by_rank.values())


@pytest.mark.parametrize("above, holds", [(74, False), (75, True), (76, True)])
def test_a_straggler_is_above_the_others_in_three_quarters_of_the_steps(above, holds):
    """100 steps, a clear excess in `above` of them, a hair below the others' median in the rest."""
    from analysis.runs.ranks import consistency

    mates = others(100, wobble=0.2)
    excess_at = {n: (5.0 if n < above else -0.001) for n in range(100)}
    by_rank = with_candidate(mates, excess_at)
    got = consistency(by_rank, 0, 1.0)
    assert got.steps_compared == 100 and got.steps_above == above
    assert 5.0 > 2 * run_spread(by_rank)  # the excess term holds throughout: only the share decides
    assert got.holds is holds


@pytest.mark.parametrize("times_spread, holds", [(1.9, False), (2.0, False), (2.1, True)])
def test_a_straggler_is_slower_by_more_than_twice_the_spread(times_spread, holds):
    """Above the others in every step, by the same excess: the excess against twice the spread decides."""
    from analysis.runs.ranks import consistency

    mates = others(40, wobble=0.5)
    spread = run_spread(with_candidate(mates, {n: 0.0 for n in range(40)}))  # the candidate flat: its IQR is theirs
    by_rank = with_candidate(mates, {n: times_spread * spread for n in range(40)})
    assert run_spread(by_rank) == pytest.approx(spread)  # adding a constant moves no one's IQR
    got = consistency(by_rank, 0, 1.0)
    assert got.steps_above == 40 and got.excess == pytest.approx(times_spread * spread)
    assert got.holds is holds


def test_the_excess_is_a_median_not_a_mean():
    """One huge step among small ones: a mean would be far over twice the spread, the median is not."""
    from analysis.runs.ranks import consistency

    mates = others(40, wobble=0.5)
    spread = run_spread(with_candidate(mates, {n: 0.0 for n in range(40)}))
    excess_at = {n: 0.5 * spread for n in range(40)}
    excess_at[7] = 1000.0
    got = consistency(with_candidate(mates, excess_at), 0, 1.0)
    assert statistics.mean(excess_at.values()) > 2 * spread  # what a mean would say
    assert got.excess == pytest.approx(0.5 * spread) and got.holds is False


@pytest.mark.parametrize("steps, holds", [(9, False), (10, True)])
def test_ten_steps_are_needed(steps, holds):
    from analysis.runs.ranks import consistency

    got = consistency(with_candidate(others(steps, 0.2), {n: 5.0 for n in range(steps)}), 0, 1.0)
    assert got.holds is holds and got.steps_compared == steps


def test_with_two_ranks_the_candidate_is_measured_against_the_other_alone():
    """b73af57: the others' median leaves the candidate out; with two ranks it is the other rank's own work,
    so a rank 2x slower is 1x the other's work over it (a median over both would halve it)."""
    from analysis.runs.ranks import consistency, slow_rank

    def rank(r, ms):
        return {"rank": r, "node": "n", "own_step_time_s": {"n": 20, "median": ms / 1e3},
                "step_time_s": {"median": 2 * ms / 1e3},
                "own_step_series": {"first_step": 1, "ms": [ms + (0.01 if i % 2 else -0.01) for i in range(20)]}}

    s = slow_rank(entries([rank(0, 10.0), rank(1, 20.0)]))
    assert s.rank == 1 and s.median_own_s == pytest.approx(0.010)
    assert s.excess == pytest.approx(0.010) and s.holds is True
    series = {0: {n: 10.0 for n in range(20)}, 1: {n: 20.0 for n in range(20)}}
    assert consistency(series, 1, 1.0).excess == pytest.approx(10.0)  # not 5.0, half way


@pytest.mark.parametrize("slow_steps, named", [(4, False), (5, True), (6, True)])
def test_data_loading_is_named_where_it_takes_a_quarter_of_half_the_steps(slow_steps, named):
    """10 profiled steps; the DataLoader takes 30% of `slow_steps` of them and 1% of the rest. The sum's share
    is over 25% either way when the slow steps are long enough; only the step count decides."""
    from analysis.explain.verdict import DATA, unsteady

    class Evidence:
        data_step_shares = [0.30] * slow_steps + [0.01] * (10 - slow_steps)

    assert (unsteady(Evidence(), DATA) is None) is named


@pytest.mark.parametrize("share, counts", [(0.24, False), (0.25, True), (0.26, True)])
def test_a_steps_dataloader_share_counts_from_a_quarter(share, counts):
    from analysis.explain.verdict import DATA, unsteady

    class Evidence:
        data_step_shares = [share] * 5 + [0.0] * 5  # half the steps: named exactly when they count

    assert (unsteady(Evidence(), DATA) is None) is counts


@pytest.mark.parametrize("equal, holds", [(0, False), (1, False)])
def test_a_step_level_with_the_others_is_not_above_them(equal, holds):
    """74 steps clearly above, `equal` steps exactly at the others' median, the rest a hair below: a step at
    the median is not "above the others", so 74 + 1 is still under three quarters."""
    from analysis.runs.ranks import consistency

    excess_at = {n: 5.0 if n < 74 else (0.0 if n < 74 + equal else -0.001) for n in range(100)}
    got = consistency(with_candidate(others(100, wobble=0.2), excess_at), 0, 1.0)
    assert got.steps_above == 74 and got.holds is holds


def test_why_no_straggler_is_named_golden_sentences():
    """The two reasons a user reads, whole (their numbers are checked by the boundary tests above)."""
    from analysis.runs.ranks import consistency

    share = consistency(with_candidate(others(100, 0.2), {n: (5.0 if n < 74 else -0.001) for n in range(100)}), 0, 1.0)
    assert share.why_not == ("rank 0 was above the others in 74 of 100 steps (a straggler: 75% or more), by a "
                                "median 5.00 ms against the run's step-to-step spread of 0.20 ms (a straggler: over "
                                "2x)")
    few = consistency(with_candidate(others(9, 0.2), {n: 5.0 for n in range(9)}), 0, 1.0)
    assert few.why_not == "9 step(s) measured by every rank, 10 needed to compare ranks"
    assert few.steps_above is None and few.excess is None and few.spread is None
    held = consistency(with_candidate(others(40, 0.5), {n: 5.0 for n in range(40)}), 0, 1.0)
    assert held.why_not is None and held.holds is True


def _summary(ms: list[list[float]], queued: list[list[float]] | None, step_ms: float) -> dict:
    """summary.json as the ranks write it: each rank's own work a step (ms) and its wait for a core."""
    def rank(r: int) -> dict:
        series = {"first_step": 1, "ms": ms[r], **({"queued_ms": queued[r]} if queued else {})}
        return {"rank": r, "node": "n", "own_step_time_s": {"n": len(ms[r]), "median": statistics.median(ms[r]) / 1e3},
                "step_time_s": {"n": len(ms[r]), "median": step_ms / 1e3}, "own_step_series": series}

    return {"ranks": [rank(r) for r in range(len(ms))]}


@st.composite
def _runs(draw):
    """2-4 ranks over 10-24 steps: one slow by a drawn excess, with a drawn wait for a core in its steps."""
    world, steps = draw(st.integers(2, 4)), draw(st.integers(10, 24))
    noise = st.floats(0.0, 2.0, allow_nan=False)
    base = [[10.0 + draw(noise) for _ in range(steps)] for _ in range(world)]
    excess = draw(st.floats(0.0, 8.0, allow_nan=False))
    base[0] = [v + excess for v in base[0]]
    wait = st.floats(0.0, 6.0, allow_nan=False)
    queued = [[draw(wait) if r == 0 else draw(st.floats(0.0, 0.5)) for _ in range(steps)] for r in range(world)]
    return base, draw(st.none() | st.just(queued)), draw(st.floats(12.0, 60.0))


@given(_runs())
@settings(max_examples=300, deadline=None)
def test_the_analysis_names_the_straggler_the_tests_oracle_names(run):
    """Two writings of the README's rule, the analysis's and tests/stragglers.py's (the e2e tests' oracle,
    from the README's words alone), name the same rank on any run: the e2e tests compare a run's verdict
    with the oracle, and a clause one has and the other lacks (the wait for a core, 2026-11-30) failed CI
    there on the machine's noise. Cases within a rounding of a threshold are left to the boundary tests."""
    from analysis.runs.ranks import consistency, own_series, slow_rank

    ms, queued, step_ms = run
    summary = _summary(ms, queued, step_ms)
    ranks = entries(summary["ranks"])
    s = slow_rank(ranks)
    evidence = consistency({r.rank: own_series(r) for r in ranks}, s.rank, 1e3)
    near = [(evidence.excess, 2 * evidence.spread), (s.wait_share, 0.10)]
    if queued:
        waits = [q - statistics.median(o[i] for o in queued if o is not queued[s.rank]) for i, q in
                 enumerate(queued[s.rank])]
        near.append((statistics.median(waits) / 1e3, 0.5 * evidence.excess))
    assume(all(abs(a - b) > 1e-9 for a, b in near))
    named = s.rank if s.holds and s.wait_share >= 0.10 else None
    assert named == readme_straggler(summary), (s, evidence)
