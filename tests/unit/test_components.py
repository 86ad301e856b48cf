"""The parts, in-process: the trainer's components, the checkpoint policy, the submission plan, the
analysis accumulators and the shared CLI helpers. No process, no cluster: the unit tier."""

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from analysis.report import read_index, read_summary
from analysis.trace import CpuOps, DeviceActivity, DeviceMemory
from hpc.checkpoint import Checkpointer, load_checkpoint
from hpc.cli import Parser, UsageError, check_name, one_line, shown
from hpc.config import TrainConfig
from hpc.submit import build_parser, make_plan, print_plan
from hpc.trainer import (DivergenceGuard, MetricsLog, StepTimer, StopSignal, TrainState, batch_plan, lr_factor,
                         percentile)

REPO = Path(__file__).resolve().parents[2]


# --- trainer parts -------------------------------------------------------------------------------------

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


def test_step_timer_on_cpu():
    timer = StepTimer(use_cuda=False)
    for _ in range(3):
        timer.start()
        timer.stop()
    assert len(timer.times()) == 3 and all(t >= 0 for t in timer.times())


def test_stop_signal_is_handed_back():
    before = signal.getsignal(signal.SIGUSR2)
    stop = StopSignal().install()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.signum == signal.SIGUSR2
    stop.restore()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_metrics_log_off_rank_writes_nothing(tmp_path):
    log = MetricsLog(tmp_path, enabled=False, purge_step=0)
    log.record("train", {"loss": 1.0}, 1, 0)
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_checkpointer_policy_save_and_checked_load(tmp_path):
    said = []
    ckpt = Checkpointer(tmp_path, every_steps=5, is_main=True, barrier=lambda: None, log=said.append)
    assert [s for s in range(1, 16) if ckpt.due(s)] == [5, 10, 15]
    assert not Checkpointer(tmp_path, 0, True, lambda: None, said.append).due(5)
    assert ckpt.load() is None
    (tmp_path / "checkpoints").mkdir()
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "scheduler": {}, "epoch": 1, "position": 0, "step": 5,
             "rng": {}}
    ckpt.save(state, "periodic")
    assert said and "checkpoint (periodic): epoch 1, batch 0, step 5" in said[0]
    assert torch.equal(load_checkpoint(ckpt.path)["model"]["w"], torch.ones(2))
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))  # the temp file was renamed


# --- submission plan ----------------------------------------------------------------------------------

def plan_for(*argv, tmp_path):
    return make_plan(build_parser().parse_args(["--runs-dir", str(tmp_path / "runs"), *argv]))


def test_a_single_job_is_a_plan_of_one_point(tmp_path):
    plan = plan_for("--dry-run", "--account", "m1", "--nodes", "2", "--gpus", "4", tmp_path=tmp_path)
    (spec,) = plan.specs
    assert not spec.array and len(spec.points) == 1 and spec.points[0][0] is None
    assert (spec.request.nodes, spec.request.gpus, spec.request.name) == (2, 4, "resnet152")
    assert not (tmp_path / "runs").exists()  # planning writes nothing


def test_the_study_is_three_arrays_of_twelve(tmp_path, capsys):
    plan = plan_for("--dry-run", "--account", "m1", "--sweep", str(REPO / "profiles" / "study.yaml"), tmp_path=tmp_path)
    assert [(s.request.gpus, len(s.points), s.array) for s in plan.specs] == [(1, 12, True), (2, 12, True), (4, 12, True)]
    fractions = {p["data_fraction"] for s in plan.specs for p, _ in s.points}
    assert fractions == {1.0, 0.5, 0.1}
    assert {cfg.train.batch_size for s in plan.specs for _, cfg in s.points} == {128, 512, 1024, 2048}
    print_plan(plan)
    out = capsys.readouterr().out
    assert out.count("#SBATCH --array=0-11") == 3 and not (tmp_path / "runs").exists()


# --- analysis accumulators ----------------------------------------------------------------------------

def test_cpu_ops_self_time_steps_and_merged_calls():
    cpu = CpuOps()
    ev = {"pid": 1, "tid": 1}
    cpu.add(ev, 0.0, 100.0, "ProfilerStep#1", "user_annotation")
    cpu.add(ev, 10.0, 20.0, "aten::div_", "cpu_op")
    cpu.add(ev, 12.0, 5.0, "aten::div_", "cpu_op")  # a redispatch: merged into its parent, as torch does
    cpu.add(ev, 40.0, 10.0, "aten::add", "cpu_op")
    r = cpu.result()
    assert r["steps"] == 1 and r["step_time_us_mean"] == 100.0
    assert r["cpu_time_us"] == 100.0 and r["op_calls"] == {"aten::div_": 1, "aten::add": 1}


def test_device_activity_busy_time_and_overlap():
    dev = DeviceActivity()
    dev.kernel(0.0, 10.0, "implicit_convolve_sgemm")
    dev.kernel(5.0, 10.0, "ncclKernel_AllReduce_RING_LL_Sum_float")
    dev.copy(20.0, 2.0, memset=False)
    r = dev.result()
    assert r["cuda_time_us"] == 22.0 and r["gpu_busy_us"] == 17.0 and r["kernel_calls"] == 2
    assert r["kernel_calls_by_class"]["communication"] == 1 and r["kernel_calls_by_class"]["convolution"] == 1
    assert r["comm_time_us"] == 10.0 and r["comm_overlap_pct"] == pytest.approx(50.0)
    assert DeviceActivity().result()["kernel_calls"] is None  # a CPU run: absent, not zero


def test_device_memory_peaks_and_mistyped_events():
    mem = DeviceMemory()
    assert mem.add({"args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 100, "Total Reserved": 200}})
    assert mem.add({"args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 300, "Total Reserved": 200}})
    assert mem.add({"args": {"Device Type": 0, "Device Id": -1, "Total Allocated": 10**12}})  # CPU: ignored
    assert not mem.add({"args": [1]}) and not mem.add({"args": {"Device Type": 1, "Total Allocated": "x"}})
    assert mem.result() == {"peak_gpu_mem_bytes": 300, "peak_gpu_reserved_bytes": 200,
                            "gpu_mem_relative_to_window": False}


def test_summary_and_index_readers(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"world_size": 2, "ranks": [{"rank": 0}, {"rank": "x"}]}))
    assert [r["rank"] for r in read_summary(tmp_path / "summary.json")["ranks"]] == [0]
    (tmp_path / "index.json").write_text(json.dumps({"points": [
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "a"},
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "/etc"}]}))
    assert [p["run_dir"] for p in read_index(tmp_path / "index.json")] == ["a"]


# --- the shared CLI helpers ---------------------------------------------------------------------------

def test_parser_errors_are_one_line_usage_errors():
    parser = Parser(prog="x")
    parser.add_argument("--n", type=int)
    parser.add_argument("--name")
    with pytest.raises(UsageError, match=r"command line: argument --n: invalid int value: 'a'"):
        parser.parse_args(["--n", "a"])
    with pytest.raises(UsageError, match=r"--name '': must not be empty"):
        parser.parse_args(["--name", ""])
    assert parser.parse_args(["--n", "3"]).n == 3


def test_values_and_messages_are_cut():
    bomb = ["x"] * 10
    for _ in range(8):
        bomb = [bomb] * 10
    assert len(shown(bomb)) <= 120 and len(shown("y" * 10**6)) <= 120
    assert one_line("a\nb\tc") == "a b c" and len(one_line("z" * 10**5)) <= 600


@pytest.mark.parametrize("name", ["", "a/b", "..", "-x", "a\nb", "n" * 201])
def test_check_name_refuses(name):
    with pytest.raises(UsageError):
        check_name(name, "--name")


def test_check_name_accepts_a_hostile_but_valid_name():
    check_name("we ird'\"$(touch x);`y`", "--name")


def test_which_keys_may_change_on_resume_is_marked_on_the_fields():
    from hpc.config import may_change_on_resume

    assert all(may_change_on_resume(*k.split(".")) for k in (
        "data.root", "data.num_workers", "train.max_steps", "train.eval", "train.cuda_memory_fraction",
        "profiler.enabled", "profiler.active", "profiler.memory_snapshot"))
    assert not any(may_change_on_resume(*k.split(".")) for k in (
        "train.batch_size", "train.lr", "train.seed", "model.arch", "data.fraction", "data.augment", "train.nokey"))
