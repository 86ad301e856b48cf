"""The graph check (hpc/training/graph/graphcheck.py) in-process on the CPU, world size 1: the comparison on
literal tensors, the ranks' agreement on literal outcomes, and the whole check on a small model with
the CPU stand-in for capture (tests/standins/graphstandin.py: a GPU cannot run here; the stand-in replays the
step eagerly, so everything else in the check is the real code). Two ranks over gloo:
tests/e2e/test_graph_check.py; the real capture on a GPU: tests/gpu/test_gpu.py."""

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from hpc.core.errors import UsageError
from hpc.core.faults import Fault, parse_faults
from hpc.settings.schema import TrainConfig
from hpc.training import inject
from graphstandin import StandInStep
from hpc.training.graph.cudagraph import whole_step
from hpc.training.graph.graphcheck import (
    LOSS_RTOL,
    UPDATE_RTOL,
    GraphCheck,
    GraphRun,
    RankCheck,
    agree,
    differences,
    mismatch,
    settle,
)


def test_the_fault_hook_has_graph_entries_with_an_optional_rank():
    assert parse_faults("graph-capture-fail,graph-mismatch@rank=1,graph-slow@rank=0") == (
        Fault("graph", moment="capture-fail"),
        Fault("graph", moment="mismatch", rank=1),
        Fault("graph", moment="slow", rank=0))
    # graph mode without CUDA is no fault (issue 73: the tests' capture comes through HPC_GRAPH_CAPTURE)
    for bad in ("graph-mismatch@rank=x", "graph-wrong", "graph-standin"):
        with pytest.raises(UsageError, match=r"graph-\{capture-fail,mismatch,slow\}\[@rank=R\]"):
            parse_faults(bad)


def tensors(*values):
    return [torch.tensor(v, dtype=torch.float32) for v in values]


def test_the_update_is_compared_not_the_weights():
    before, eager = tensors([1.0, 1.0]), tensors([0.9, 1.1])  # an update of size sqrt(0.02)
    same_weights_within_1pct = tensors([0.905, 1.1])  # 0.5% of the weights, 3.5% of the update
    loss_rel, update_rel, identical = differences(before, eager, same_weights_within_1pct, 2.0, 2.0)
    assert loss_rel == 0 and not identical and update_rel == pytest.approx(0.005 / math.sqrt(0.02), rel=1e-5)
    assert "update differs" in mismatch(loss_rel, update_rel, identical, exact=False)
    assert differences(before, eager, [t.clone() for t in eager], 2.0, 2.0) == (0.0, 0.0, True)


@pytest.mark.parametrize(
    ("loss_rel", "update_rel", "identical", "exact", "said"),
    [
        (0.0, 0.0, True, True, None),
        (0.0, 1e-9, False, True, "not bit-identical to an eager step under train.deterministic"),
        (LOSS_RTOL, UPDATE_RTOL, False, False, None),  # at the tolerance: passes
        (LOSS_RTOL * 1.01, 0.0, False, False, "loss differs"),
        (0.0, UPDATE_RTOL * 1.01, False, False, "update differs"),
        (math.inf, 0.0, False, False, "loss differs"),  # a non-finite loss
        (0.0, math.inf, False, False, "update differs"),
    ],
)
def test_what_counts_as_a_mismatch(loss_rel, update_rel, identical, exact, said):
    got = mismatch(loss_rel, update_rel, identical, exact)
    assert (got is None) if said is None else (said in got)


def test_a_nan_in_the_replay_is_a_mismatch():
    before, eager = tensors([1.0]), tensors([0.5])
    loss_rel, update_rel, identical = differences(before, eager, tensors([float("nan")]), 1.0, float("nan"))
    assert mismatch(loss_rel, update_rel, identical, exact=False) is not None


def test_the_ranks_agree_on_the_first_failure_and_say_how_many_more():
    outcomes = [RankCheck(0, None, 1.0, 0.0, 0.0), RankCheck(1, "capture raised X: y", 2.5), RankCheck(2, "slow", 9.0)]
    result = agree(outcomes, exact=False, timeout_s=5)
    assert not result.passed
    assert result.line == "graph check failed on rank 1 (and on 1 other rank(s)): capture raised X: y"
    assert result.facts() == {"graph_check": "failed on rank 1 (and on 1 other rank(s)): capture raised X: y",
                              "graph_check_detail": {"result": "failed", "rank": 1, "cause": "capture raised X: y"},
                              "step_mode": "eager"}
    with pytest.raises(UsageError, match=r"^train.cuda_graph = true, and the graph check failed on rank 1 "):
        settle(result, True)
    assert settle(result, "auto").endswith("; every rank runs eager (train.cuda_graph = auto)")
    passed = agree([RankCheck(0, None, 0.5, 1e-5, 2e-4), RankCheck(1, None, 0.7, 3e-5, 1e-4)], False, 5)
    assert passed.passed and passed.record["loss_rel_diff"] == 3e-5 and passed.record["update_rel_diff"] == 2e-4
    assert passed.facts()["graph_check"] == "passed" and "step_mode" not in passed.facts()
    assert settle(passed, True) == passed.line and "in 0.7 s" in passed.line


def small_training(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    step = StandInStep(whole_step(model, opt, lambda: torch.autocast("cpu", enabled=False)), model, opt, 2)
    gen = torch.Generator().manual_seed(seed)
    return model, opt, step, torch.randn(6, 3, 8, 8, generator=gen), torch.randint(0, 5, (6,), generator=gen)


def state_of(model, opt) -> list[torch.Tensor]:
    momentum = [opt.state.get(p, {}).get("momentum_buffer") for p in model.parameters()]
    return [v.clone() for v in model.state_dict().values()] + [m.clone() for m in momentum if m is not None]


def same_state(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def armed(faults: str):
    """The fault point armed with these HPC_FAULT_INJECT entries, disarmed after."""
    inject.arm(parse_faults(faults), 0, lambda: 0)
    try:
        yield
    finally:
        inject.arm((), 0, lambda: 0)


def check(trained, faults="", exact=False, timeout_s=60.0):
    _, _, step, x, y = trained
    with armed(faults):
        return GraphCheck(step, 0, lambda v: [v], exact, timeout_s).run(x, y)


@pytest.fixture
def trained():
    """A model one eager step in (momentum buffers exist), its stand-in step and a batch."""
    model, opt, step, x, y = small_training()
    whole_step(model, opt, lambda: torch.autocast("cpu", enabled=False))(x, y)
    opt.zero_grad(set_to_none=True)
    return model, opt, step, x, y


def test_a_stand_in_passes_bit_for_bit_and_leaves_the_state_as_it_was(trained):
    model, opt, step, _, _ = trained
    before = state_of(model, opt)
    result = check(trained, exact=True)
    assert result.passed and "bit-identical" in result.line and result.record["exact"]
    assert same_state(before, state_of(model, opt)) and step.captured


@pytest.mark.parametrize(("fault", "said"), [
    ("graph-mismatch", "the replay's update differs from an eager step's by"),
    ("graph-capture-fail", "capture raised RuntimeError: fault injection"),
])
def test_a_failed_check_releases_the_step_and_restores_the_state(trained, fault, said):
    model, opt, step, _, _ = trained
    before = state_of(model, opt)
    result = check(trained, fault)
    assert not result.passed and result.line.startswith(f"graph check failed on rank 0: {said}")
    assert same_state(before, state_of(model, opt))  # the mismatch's wrong weights undone
    assert not step.captured and all(p.grad is None for p in model.parameters())


def test_a_check_over_its_time_is_a_failure(trained):
    result = check(trained, "graph-slow", timeout_s=0.05)
    assert not result.passed and "over train.graph_check_timeout_s = 0.05" in result.line


def test_graph_run_is_eager_after_a_failed_check_and_replays_after_a_passed_one(trained):
    _, _, step, x, y = trained
    quiet = {"say": lambda line: None}
    run = GraphRun(step, TrainConfig(deterministic=True, graph_check_timeout_s=60), **quiet)
    assert run.on and run.facts() == {}
    loss = run(x, y)
    assert loss is not None and run.facts()["graph_check"] == "passed"
    assert run(x, y) is not None and run.facts()["graph_replays"] == 2  # each call a replay; the check's own not
    failing = GraphRun(small_training(1)[2], TrainConfig(), **quiet)
    with armed("graph-mismatch"):
        assert failing(x, y) is None and not failing.on
    assert failing(x, y) is None  # checked once: eager from then on
    assert failing.facts()["graph_replays"] == 0
    with armed("graph-mismatch"), pytest.raises(UsageError, match="cuda_graph = true, and the graph check failed on rank 0"):
        GraphRun(small_training(2)[2], TrainConfig(cuda_graph=True), **quiet)(x, y)


@settings(max_examples=12)
@given(faults=st.sets(st.sampled_from(["graph-mismatch", "graph-capture-fail"])), exact=st.booleans(),
       seed=st.integers(0, 2**16))
def test_whatever_the_check_meets_it_leaves_the_state_as_it_found_it(faults, exact, seed):
    model, opt, step, x, y = small_training(seed)
    whole_step(model, opt, lambda: torch.autocast("cpu", enabled=False))(x, y)  # momentum exists
    opt.zero_grad(set_to_none=True)
    before = state_of(model, opt)
    with armed(",".join(sorted(faults))):
        result = GraphCheck(step, 0, lambda v: [v], exact, 60.0).run(x, y)
    assert result.passed is (not faults)
    assert same_state(before, state_of(model, opt))
