"""The training's small parts, in-process: the batch plan and learning-rate schedule, the step's state,
timer and divergence guard, the metrics log, the door's C++ log level, the FLOP count."""

import os
import random
import time

import pytest
import torch

from hpc.core.errors import UsageError
from hpc.settings.schema import TrainConfig
from hpc.training.build import batch_plan, lr_factor
from hpc.training.metrics import MetricsLog
from hpc.training.steps import DivergenceGuard, TrainState
from hpc.training.steptimes import StepClock
from hpc.training.steptimes import percentile


@pytest.mark.parametrize("kw, world, expected", [
    ({"batch_size": 128}, 4, (128, 128)),
    ({"batch_size": 128, "batch_scope": "global"}, 4, (32, 32)),
    ({"batch_size": 128, "grad_accum_steps": 4}, 2, (128, 32)),
])
def test_batch_plan(kw, world, expected):
    assert batch_plan(TrainConfig(**kw), world) == expected


@pytest.mark.parametrize("kw, world, needle", [
    ({"batch_size": 10, "batch_scope": "global"}, 4, "does not divide by 4 ranks"),
    ({"batch_size": 10, "grad_accum_steps": 3}, 1, "train.grad_accum_steps = 3"),
])
def test_batch_plan_refuses(kw, world, needle):
    with pytest.raises(UsageError, match=needle):
        batch_plan(TrainConfig(**kw), world)


def test_lr_schedule():
    cosine = TrainConfig(schedule="cosine")
    assert lr_factor(0, 100, 10, cosine) == pytest.approx(0.1)  # warm-up: (step + 1) / warm-up steps
    assert lr_factor(10, 100, 10, cosine) == pytest.approx(1.0)
    assert lr_factor(100, 100, 10, cosine) == pytest.approx(0.0, abs=1e-12)
    multistep = TrainConfig(schedule="multistep", milestones=(0.5, 0.75))
    assert [lr_factor(s, 100, 0, multistep) for s in (0, 50, 75)] == pytest.approx([1.0, 0.1, 0.01])
    assert lr_factor(7, 100, 0, TrainConfig(schedule="constant")) == 1.0


def test_percentile_interpolates():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.9) == pytest.approx(9.0)


def test_train_state_round_trip_with_rng():
    state = TrainState(epoch=2, position=5, step=17)
    saved = state.state_dict()
    drawn = (torch.rand(3), random.random())
    again = TrainState()
    again.load_state_dict(saved)
    assert again == state
    assert torch.equal(torch.rand(3), drawn[0]) and random.random() == drawn[1]


def test_divergence_guard_finds_the_first_bad_step_on_cpu():
    guard = DivergenceGuard(use_cuda=False)
    guard.add(torch.tensor(1.0), 1)
    assert guard.bad_step(at_log=False, group_size=1) == 0
    guard.add(torch.tensor(2.0), 2)
    guard.add(torch.tensor(float("nan")), 2)
    assert guard.bad_step(at_log=False, group_size=2) == 2
    assert guard.mean() != guard.mean()  # NaN
    guard.reset()
    assert guard.losses == [] and guard.steps == []


def test_step_clock_on_cpu():
    clock = StepClock(cuda=False)
    clock.ended()
    for pause_s in (0.01, 0.02, 0.03):
        time.sleep(pause_s)
        clock.ended()
    # each at least the pause it timed (sleep never returns early), in order: not a clock's noise
    assert len(clock.times()) == 3 and all(t >= p for t, p in zip(clock.times(), (0.01, 0.02, 0.03), strict=True))


def test_metrics_log_off_rank_writes_nothing(tmp_path):
    log = MetricsLog(tmp_path, enabled=False, purge_step=0)
    log.record("train", {"loss": 1.0}, 1, 0)
    log.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given, shown", [(None, False), ("WARNING", True)])
def test_the_trainings_door_quiets_torchs_cpp_warnings_before_torch_loads(given, shown):
    """A dead peer's store connection reset is a C++ warning with its frames on every rank left, after the
    training's one line (seen in CI under load): hpc.train sets torch's C++ log level before torch loads,
    unless set. The oracle is torch's own C++ warning: a store client that finds no server says one
    (`[W... TCPStore.cpp] ... failed to connect`) on stderr at torch's default level."""
    import subprocess
    import sys

    probe = ("import datetime, socket\nfrom hpc import train\n"
             "try:\n    train.cli(['--help'])\nexcept SystemExit:\n    pass\n"
             "import torch.distributed as dist\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
             "try:\n    dist.TCPStore('127.0.0.1', port, is_master=False, timeout=datetime.timedelta(seconds=1))\n"
             "except Exception as e:\n    print('raised', type(e).__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env.update({} if given is None else {"TORCH_CPP_LOG_LEVEL": given})
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert "raised" in r.stdout, r.stdout + r.stderr  # the client did fail to connect
    warned = [line for line in r.stderr.splitlines() if line.startswith("[W") and "TCPStore" in line]
    assert bool(warned) == shown, r.stderr


def test_the_flop_count_does_not_autotune_cudnn_for_its_batch_of_one():
    """The count's forward runs with cuDNN's benchmark off (heuristics: its one-image shapes are never
    trained on), and the run's own setting is put back after. The flag is a global, readable without a GPU."""
    from hpc.settings.schema import ModelConfig
    from hpc.training.model import build_model, count_flops_per_image

    model = build_model(ModelConfig(arch="resnet18"))
    seen = []
    model.conv1.register_forward_pre_hook(lambda m, args: seen.append(torch.backends.cudnn.benchmark))
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        flops = count_flops_per_image(model)
        assert seen == [False] and torch.backends.cudnn.benchmark is True and flops > 0
    finally:
        torch.backends.cudnn.benchmark = saved
