"""The parts of many-rank runs, in-process: which ranks record traces (profiler.ranks), the straggler named from
every rank's own work, a step's own work timed, and a process's start time read from /proc. The 32-rank runs
themselves: tests/e2e/test_many_ranks.py."""

import os
import subprocess
import sys
import time

import pytest

from analysis.records import Consistency
from hypothesis import given
from hypothesis import strategies as st

from recordedruns import entries

from analysis.runs import ranks as rr
from analysis.runs.ranks import slow_rank_words
from hpc.bench import startuptime
from hpc.core.errors import UsageError
from hpc.settings.profranks import (
    ALL_RANKS_UP_TO,
    SLOWEST,
    check_setting,
    chosen,
    static_choice,
)


@given(st.integers(1, 2048), st.data())
def test_every_rank_of_a_small_job_records_and_a_large_one_waits_for_the_timing(world, data):
    rank = data.draw(st.integers(0, world - 1))
    assert static_choice("all", rank, world) is True
    assert static_choice("auto", rank, world) is (True if world <= ALL_RANKS_UP_TO else None)
    picked = data.draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=8))
    assert static_choice(",".join(map(str, picked)), rank, world) is (rank in picked)


@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_node_leaders_and_the_slowest_record(nodes, per_node, data):
    """Oracle: leaders are local rank 0 by construction of the layout; the slowest are found by sorting."""
    world = nodes * per_node
    own = data.draw(st.lists(st.one_of(st.none(), st.floats(0, 10)), min_size=world, max_size=world))
    locals_ = [r % per_node for r in range(world)]
    got = chosen(locals_, own)
    leaders = set(range(0, world, per_node))
    measured = sorted((-v, r) for r, v in enumerate(own) if v is not None)
    assert leaders <= set(got) and set(got) - leaders <= {r for _, r in measured[:SLOWEST]}
    assert {r for _, r in measured[:SLOWEST]} <= set(got) and got == sorted(got)
    assert chosen(locals_, own, leaders_only=True) == sorted(leaders)


@pytest.mark.parametrize("bad", ["", "some", "1,,2", "-1", "0;1", "1.5"])
def test_a_bad_ranks_setting_is_one_line_naming_it(bad):
    with pytest.raises(UsageError, match="profiler.ranks="):
        check_setting(bad)
    with pytest.raises(UsageError, match="rank 40 not in a job of 32"):
        static_choice("0,40", 0, 32)


def numbered(ranks):
    """summary.json's rank entries of the mappings a test writes, each with its rank where it gives none."""
    return entries({"rank": i, **r} for i, r in enumerate(ranks))


def slow_rank(ranks):
    return rr.slow_rank(numbered(ranks))


def separate_copies(ranks):
    return rr.separate_copies(numbered(ranks))


def starved(ranks, candidate, evidence):
    return rr.starved(numbered(ranks), candidate, evidence)


def figures(ranks, started):
    return startuptime.figures(numbered(ranks), started)


def phase_spans(ranks):
    return startuptime.phase_spans(numbered(ranks))


def ranks(own: list[float], per_node: int = 4, step: float = 0.6, steps: int = 8) -> list[dict]:
    return [{"rank": r, "node": f"nid{r // per_node + 1:03d}", "own_step_time_s": {"n": steps, "median": v},
             "step_time_s": {"median": step}} for r, v in enumerate(own)]


def test_a_slow_rank_is_named_with_its_node_and_its_node_is_not_blamed():
    s = slow_rank(ranks([0.01] * 13 + [0.31] + [0.01] * 18))
    assert (s.rank, s.node, s.slow_node) == (13, "nid004", False)
    assert s.median_own_s == pytest.approx(0.01) and s.wait_share == pytest.approx(0.3 / 0.6)
    assert "rank 13 on nid004" in slow_rank_words(s) and "a slow rank, not a slow node" in slow_rank_words(s)


def test_a_slow_node_is_told_from_a_slow_rank():
    own = [0.01] * 32
    own[12:16] = [0.30, 0.31, 0.29, 0.30]  # every rank of nid004
    s = slow_rank(ranks(own))
    assert (s.rank, s.node, s.slow_node) == (13, "nid004", True)
    assert "a slow node, not a slow rank" in slow_rank_words(s)


@given(st.lists(st.floats(0, 5), min_size=2, max_size=300))
def test_the_named_rank_has_the_most_own_work(own):
    s = slow_rank(ranks(own))
    assert own[s.rank] == max(own) and s.rank == own.index(max(own))  # ties: the lowest rank
    assert 0 <= s.wait_share <= 1 and s.ranks_measured == len(own)


def test_no_straggler_without_two_measured_ranks():
    assert slow_rank(ranks([0.5])) is None
    assert slow_rank([{"rank": 0, "own_step_time_s": None}, {"rank": 1}]) is None


def test_one_step_of_own_work_names_no_straggler():
    """A 4-step study point's two CPU ranks, timed on one step each (summary.json of a CI run): 15.3 ms
    against 3.7 ms is noise, not a slow rank; from three steps each the same medians name rank 0."""
    assert slow_rank(ranks([0.0153, 0.0037], steps=1)) is None
    assert slow_rank(ranks([0.0153, 0.0037], steps=2)) is None
    assert slow_rank(ranks([0.0153, 0.0037], steps=3)).rank == 0
    few = ranks([0.0153, 0.0037, 0.004], steps=3)
    few[0]["own_step_time_s"]["n"] = 1  # the slowest median rests on one step: left out, not named
    assert slow_rank(few).rank == 2 and slow_rank(few).ranks_measured == 2


def test_a_steps_own_work_runs_from_the_last_step_to_its_last_backwards_first_gradient():
    """Known pauses around real backward passes: 30 ms before the backward, 40 ms after it, then the step's
    end; own work is the first part, the step both. With two backward passes (gradient accumulation) 50 ms
    apart, own work runs to the second's first gradient, the one that synchronizes under DDP."""
    import torch

    from hpc.training.steptimes import StepClock

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    clock = StepClock()
    assert clock.watch(model.parameters())
    spans = []  # each step's own work as the test saw it from outside: from before the clock's mark of the
    # previous end to after the backward pass (the gradient comes inside it), whatever the machine's load
    before_end = time.perf_counter()
    clock.ended()  # the previous step's end
    for _ in range(3):
        time.sleep(0.03)
        model(torch.randn(4, 8)).sum().backward()
        spans.append(time.perf_counter() - before_end)
        assert clock.own_so_far_s() is not None  # the step in progress counts once its gradient came
        time.sleep(0.04)
        before_end = time.perf_counter()
        clock.ended()
    own, steps = clock.own_times()[1:], clock.times()
    assert all(0.03 <= o <= span for o, span in zip(own, spans, strict=True)), (own, spans)
    assert all(s >= 0.07 for s in steps), steps
    for _ in range(2):  # the kept parameters chosen, each backward pass restarts the mark
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.05)
        model(torch.randn(4, 8)).sum().backward()
        clock.ended()
    assert all(o >= 0.05 for o in clock.own_times()[-2:]), clock.own_times()
    clock.ended()  # a step with no gradient seen (a graph's replay): not measured
    assert clock.own_times()[-1] is None and clock.first_step_unix is not None


def test_both_roads_record_every_rank_measure_from_one_clock():
    """The training's record and a script's facts take their measurements from steptimes.measures: its keys
    are RANK_MEASURES, in order, and nothing else."""
    from hpc.training.steptimes import RANK_MEASURES, StepClock, measures, startup_record

    clock = StepClock()
    for _ in range(3):
        clock.ended()
    record = measures(clock, None, 1.0, startup_record(None, None, clock.first_step_unix))
    assert tuple(record) == RANK_MEASURES and record["step_time_s"].n == 2 and record["wall_time_s"] == 1.0


def test_a_process_start_time_from_proc_is_when_it_was_started():
    from hpc.core.proc import process_started_unix

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = process_started_unix(child.pid)
    finally:
        child.kill()
        child.wait()
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # btime is whole seconds: the start may read up to a second early
    assert started is not None and before - 1 - tick <= started <= time.time() + tick


def test_the_startup_benchmark_reads_where_the_start_went():
    """Two ranks with known start-up records (literal times): the figures are their differences."""
    from hpc.bench.startuptime import parse_ranks

    rank = {"process_start_unix": 100.0, "group_join_start_unix": 104.0, "group_join_s": 3.0,
            "first_step_end_unix": 110.0}
    late = {"process_start_unix": 101.0, "group_join_start_unix": 106.5, "group_join_s": 0.5,
            "first_step_end_unix": 110.2}
    f = figures([{"startup": rank, "peak_rss_bytes": 700 * 2**20}, {"startup": late, "peak_rss_bytes": 710 * 2**20}],
                started=99.0)
    assert f["to_process_s"] == 2.0 and f["setup_s"] == pytest.approx((4.0 + 5.5) / 2)
    assert f["group_after_last_s"] == pytest.approx(0.5) and f["longest_wait_s"] == 3.0
    assert f["to_first_step_s"] == pytest.approx(11.2) and (f["rss_median_mib"], f["rss_max_mib"]) == (705, 710)
    script = {"process_start_unix": 100.0, "group_join_start_unix": None, "group_join_s": None,
              "first_step_end_unix": 108.0}  # a script's hook does not time the group's forming
    g = figures([{"startup": script}], started=99.0)
    assert (g["setup_s"], g["group_after_last_s"], g["longest_wait_s"]) == (None, None, None)
    assert g["to_first_step_s"] == 9.0
    with pytest.raises(UsageError, match="no process start or first step time"):  # never a made-up figure
        figures([{"startup": rank}, {"startup": None}], started=99.0)
    assert parse_ranks("4,8,16,32") == [4, 8, 16, 32]
    for bad in ("0", "4,,8", "four", "-4"):
        with pytest.raises(UsageError, match="--ranks"):
            parse_ranks(bad)


def test_own_work_is_judged_outside_the_profilers_window_where_it_can_be():
    from hpc.training.steptimes import own_work_basis

    # the first step (caches warming) left out; of the rest, the unprofiled ones; unmeasured ones never
    assert own_work_basis([9.0, 1.0, 5.0, 6.0, 2.0], [False, False, True, True, False]) == [1.0, 2.0]
    assert own_work_basis([9.0, 5.0, 6.0], [False, True, True]) == [5.0, 6.0]  # all profiled: all of them
    assert own_work_basis([9.0, None, 3.0], [False, False, False]) == [3.0]
    assert own_work_basis([4.0], []) == [4.0] and own_work_basis([], []) == []


def test_over_16_ranks_the_window_waits_for_timed_steps_and_the_slowest_are_chosen():
    """A stand-in for the collective (every rank's (local rank, own work)): rank 5, not a leader, is the
    slowest and records; rank 6 does not; both profilers' windows open two steps after profiler.wait."""
    from torch.profiler import ProfilerAction, schedule

    from hpc.training.profiling import Choice, RankChoice

    everyone = [(r % 4, 0.3 if r == 5 else 0.01 + r / 1e4) for r in range(32)]
    base = schedule(wait=1, warmup=1, active=2, repeat=1)
    for rank, records in ((5, True), (6, False), (31, True)):  # 31: the second slowest (0.0131 s)
        choice = Choice("auto", RankChoice(rank, rank % 4, 32, lambda _: everyone, lambda: 0.0), wait=1)
        assert choice.records is None and choice.delay == 2
        assert [choice.shifted(base)(s) for s in range(3)] == [ProfilerAction.NONE] * 3
        assert choice.shifted(base)(3) == ProfilerAction.WARMUP  # base's step 1
        choice.decide()
        assert choice.records is records
        assert (choice.schedule(base)(4) == ProfilerAction.RECORD) is records
    leader = Choice("auto", RankChoice(0, 0, 32), wait=1)  # no collective (a user's script): leaders, no delay
    assert leader.records is True and leader.delay == 0
    assert Choice("auto", RankChoice(3, 3, 8), wait=1).records is True  # 8 ranks: everyone


def test_the_schema_and_the_choice_read_one_grammar():
    """A digit Python's isdigit takes but int() refuses ('²') is refused as a setting, not a traceback."""
    from hpc.settings.schema import ProfilerConfig

    with pytest.raises(UsageError, match="profiler.ranks='²'"):
        check_setting("²")
    with pytest.raises(Exception, match="ranks"):
        ProfilerConfig(ranks="²")
    assert ProfilerConfig(ranks=(0, 13)).ranks == "0,13" and check_setting("0, 13") == (0, 13)


def test_ranks_in_a_group_that_never_talk_between_steps_are_separate_copies():
    def talk(*counts):  # (intervals, with_collectives) per rank, as the start-up hook records them
        return [{"rank": i, "process_group": True, "collectives_in_steps": {"intervals": n, "with_collectives": w}}
                for i, (n, w) in enumerate(counts)]

    assert "no collective in any of their 20 or more" in separate_copies(talk((20, 0), (21, 0)))
    assert "only 1 of their 40 or more" in separate_copies(talk((40, 1), (40, 0)))  # a metric all-reduce an epoch
    assert separate_copies(talk((15, 15), (15, 15))) is None  # DDP: every interval
    assert separate_copies(talk((20, 0), (20, 10))) is None  # one rank talks half its steps: they wait
    assert separate_copies(talk((20, 0))) is None  # one rank
    unknown = [{"rank": 0, "process_group": True, "collectives_in_steps": None}, *talk((20, 0), (20, 0))[1:]]
    assert separate_copies(unknown) is None  # not measured on every rank: not said
    alone = [{"rank": 0, "process_group": False}, {"rank": 1, "process_group": False}]
    assert "no torch.distributed process group" in separate_copies(alone)


def with_series(own_by_rank: list[list[float]], per_node: int = 4, step: float = 0.6) -> list[dict]:
    """Summary records as the start-up hook writes them: the medians and the series of own work (ms)."""
    import statistics

    return [{"rank": r, "node": f"nid{r // per_node + 1:03d}", "step_time_s": {"median": step},
             "own_step_time_s": {"n": len(v), "median": statistics.median(v)},
             "own_step_series": {"first_step": 1, "ms": [x * 1e3 for x in v]}} for r, v in enumerate(own_by_rank)]


@pytest.mark.parametrize("ranks_n", [2, 4, 32])
def test_noise_alone_names_no_straggler(ranks_n):
    """Every rank's own work drawn from one distribution (10 ms, a busy machine's spread: lognormal, and a
    rank descheduled 20 ms in one step of ten): whichever rank has the largest median is no straggler. The
    oracle is the generator: no rank is slower by construction; 200 seeded runs, none named."""
    import random

    from analysis.runs.ranks import consistency

    for seed in range(200):
        rng = random.Random(seed)
        runs = [[0.01 * rng.lognormvariate(0, 0.3) + (0.02 if rng.random() < 0.1 else 0) for _ in range(60)]
                for _ in range(ranks_n)]
        s = slow_rank(with_series(runs))
        assert s is not None and not s.holds, (seed, s)
        by_rank = {r: dict(enumerate(v)) for r, v in enumerate(runs)}
        assert not consistency(by_rank, s.rank, 1e3).holds


@pytest.mark.parametrize("ranks_n", [2, 4, 32])
def test_a_rank_slowed_in_every_step_is_named_through_the_same_noise(ranks_n):
    import random

    for seed in range(50):
        rng = random.Random(seed)
        runs = [[0.01 * rng.lognormvariate(0, 0.3) + (0.02 if rng.random() < 0.1 else 0) for _ in range(60)]
                for _ in range(ranks_n)]
        slowed = seed % ranks_n
        runs[slowed] = [x + 0.03 for x in runs[slowed]]  # 30 ms more own work each step: 3x the typical
        s = slow_rank(with_series(runs))
        assert s.holds and s.rank == slowed and s.steps_above >= 0.75 * 60, (seed, s)
        assert f"above the others in {s.steps_above} of 60 steps" in slow_rank_words(s)


def test_too_few_steps_compared_names_no_straggler_and_says_so():
    s = slow_rank(with_series([[0.01] * 9, [0.31] * 9]))  # 9 steps compared, 10 needed
    assert s.rank == 1 and not s.holds and s.why_not == (
        "9 step(s) measured by every rank, 10 needed to compare ranks")
    s = slow_rank(with_series([[0.01] * 12, [0.31] * 12]))
    assert s.holds and s.steps_compared == 12


def test_a_rank_that_waited_for_a_core_is_no_straggler():
    """Rank 1's own work 3.5 ms longer in every step, as a rank sharing its core with another process shows
    it: 3 ms of it runnable but not running (queued_ms). The same excess without the wait (a sleep, or more
    work) is a straggler. The oracle is how each run was built."""
    import random

    rng = random.Random(7)
    base = [[0.0024 + rng.uniform(0, 2e-4) for _ in range(20)] for _ in range(2)]
    wall = [list(base[0]), [c + 0.0035 for c in base[1]]]
    queued = [[1e-5] * 20, [0.003] * 20]
    starved_run = with_series(wall)
    for rec, q in zip(starved_run, queued, strict=True):
        rec["own_step_series"]["queued_ms"] = [x * 1e3 for x in q]
    s = slow_rank(starved_run)
    waited_ms = (0.003 - 1e-5) * 1e3  # rank 1's queued time over rank 0's, as built
    assert s.rank == 1 and not s.holds and f"{waited_ms:.2f} ms of it waiting for a core" in s.why_not, s
    slept = with_series(wall)
    for rec in slept:
        rec["own_step_series"]["queued_ms"] = [0.01] * 20
    assert slow_rank(slept).holds


def _loading_trace(path, loading_us):
    """A CPU trace of 10 ms steps, each with a DataLoader range of the given length at its start."""
    import json

    events, t = [], 0.0
    for n, load in enumerate(loading_us):
        step = 10_000.0 + load
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 2}", "pid": 1, "tid": 1,
                       "ts": t, "dur": step})
        events.append({"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": t + 1.0, "dur": load,
                       "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + load + 2.0,
                       "dur": 9_000.0})
        t += step
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_data_loading_is_named_when_it_holds_up_most_steps_not_one_slow_fetch(tmp_path):
    """Known by construction: one 120 ms fetch among nine of 0.5 ms is 57% of the steps' sum but 25%+ of a
    step in 1 of 10 (no verdict, and the line says why); 5 ms in every 15 ms step is 33% of each (named)."""
    from analysis.pipeline import analyze_trace

    one_slow = analyze_trace(_loading_trace(tmp_path / "a.json", [120_000.0] + [500.0] * 9)).verdict
    assert one_slow.bound == "unknown", one_slow.line
    assert one_slow.shares["data-loading"] > 0.5
    assert "no data-loading named: the DataLoader took 25% of a step or more in 1 of 10 profiled steps" in one_slow.line
    every = analyze_trace(_loading_trace(tmp_path / "b.json", [5_000.0] * 10)).verdict
    assert every.bound == "data-loading" and "no data-loading named" not in every.line, every.line


def _queued(rank: int, queued_ms: float, steps: int) -> dict:
    return {"rank": rank, "own_step_series": {"first_step": 1, "ms": [3.0] * steps, "queued_ms": [queued_ms] * steps}}


@pytest.mark.parametrize("queued_ms, steps, said", [
    (1.99, 12, False), (2.0, 12, True), (2.01, 12, True),  # half of a 4 ms excess spent waiting for a core
    (3.0, 9, False), (3.0, 10, True),  # the rule's ten steps, every rank measured
])
def test_a_straggler_that_waited_for_a_core_for_half_its_excess_is_the_machines_load(queued_ms, steps, said):
    ranks = [_queued(0, 0.0, steps), _queued(1, queued_ms, steps), _queued(2, 0.0, steps)]
    why = starved(ranks, 1, Consistency(steps_compared=12, holds=True, excess=0.004))
    assert (why is not None) is said
    if said:
        assert why.startswith("rank 1's own work took a median 4.00 ms more") and f"{queued_ms:.2f} ms of it" in why


def test_no_core_wait_is_judged_without_a_straggler_or_its_measure():
    ranks = [_queued(0, 0.0, 12), _queued(1, 3.0, 12)]
    assert starved(ranks, 1, Consistency(steps_compared=12, holds=False, excess=0.004)) is None  # no straggler held
    assert starved(ranks[1:], 1, Consistency(steps_compared=12, holds=True, excess=0.004)) is None  # one rank: no others
    assert starved(ranks, 5, Consistency(steps_compared=12, holds=True, excess=0.004)) is None  # not a rank of the run
    bare = [ranks[0], {"rank": 1, "own_step_series": {"first_step": 1, "ms": [3.0] * 12}}]
    assert starved(bare, 1, Consistency(steps_compared=12, holds=True, excess=0.004)) is None  # no queued_ms recorded
    assert starved(ranks, 1, Consistency(steps_compared=12, holds=True, excess=0.004)) is not None


def test_the_startup_benchmark_gives_each_phase_after_each_ranks_own_start():
    """Three ranks' phases (literal times): each phase's median and slowest, as seconds after the rank's own
    process start, in the phases' order; a phase no rank saw is left out, one some ranks saw is theirs."""
    def rank(start, **at):
        return {"startup": {"phases": {"process_start": start, "imports": None, "first_step": None, **at}}}

    ranks = [rank(100.0, imports=102.0, first_step=110.0), rank(101.0, imports=102.0, first_step=113.0),
             rank(99.0, imports=104.0), {"startup": {}}, {}]
    assert phase_spans(ranks) == [("imports", 2.0, 5.0), ("first_step", 11.0, 12.0)]
