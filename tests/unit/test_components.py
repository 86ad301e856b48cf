"""The parts, in-process: the trainer's components, the checkpoint policy, the submission plan, the
analysis's folding of trace records into runs and sweeps, and the shared CLI helpers. No process, no
cluster: the unit tier (the trace reader and its accumulators: test_trace_parts.py)."""

import dataclasses
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from analysis.records import CpuTotals, DeviceTotals, MemoryPeaks, Spread, TraceRecord, as_row
from analysis.report.tables import RUN_COLUMNS
from analysis.runs.fold import rank_totals, run_record
from analysis.runs.sweep import with_scaling
from analysis.measure.trace import trace_record
from hpc.core.cli import Parser, check_name, one_line, shown
from hpc.core.errors import UsageError, WriteError
from hpc.core.rundir import read_index
from hpc.core.summary import read_summary
from hpc.launch.submission.plan import make_plan
from hpc.settings.schema import TrainConfig
from hpc.launch.status import point_state
from hpc.launch.submission.submit import STUDY_RUN, build_parser, print_plan
from hpc.training.checkpoint import Checkpointer, load_checkpoint, state_digest
from hpc.training.metrics import MetricsLog
from hpc.core.stop import StopSignal
from hpc.training.steps import DivergenceGuard, StepTimer, TrainState
from hpc.training.build import batch_plan, lr_factor
from hpc.training.summary import percentile

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
    for pause_s in (0.01, 0.02, 0.03):
        timer.start()
        time.sleep(pause_s)
        timer.stop()
    # each at least the pause it timed (sleep never returns early), in order: not a clock's noise
    assert len(timer.times()) == 3 and all(t >= p for t, p in zip(timer.times(), (0.01, 0.02, 0.03), strict=True))


def test_stop_signal_is_handed_back():
    before = signal.getsignal(signal.SIGUSR2)
    stop = StopSignal().install()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.signum == signal.SIGUSR2
    stop.restore()
    assert signal.getsignal(signal.SIGUSR2) == before


@pytest.mark.parametrize("sig, stops", [(signal.SIGTERM, True), (signal.SIGUSR2, True), (signal.SIGINT, True),
                                         (signal.SIGHUP, True), (signal.SIGUSR1, False), (signal.SIGQUIT, False)])
def test_every_signal_a_job_gets_is_caught_a_stop_or_passed_on(sig, stops):
    """Each of them would end this process by default (QUIT with a core): caught, never this test's death."""
    before = signal.getsignal(sig)
    stop = StopSignal().install()
    os.kill(os.getpid(), sig)
    assert (stop.signum, stop.passed) == ((sig, []) if stops else (None, [sig]))
    stop.restore()
    assert signal.getsignal(sig) == before


def test_a_signal_caught_early_is_the_runs():
    """A door installs the handlers before its heavy imports; the run takes them over with what they caught."""
    before = signal.getsignal(signal.SIGTERM)
    early = StopSignal.early()
    os.kill(os.getpid(), signal.SIGTERM)
    stop = StopSignal.take(None)
    assert stop is early and stop.signum == signal.SIGTERM
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) == before and StopSignal.take(None) is not early
    StopSignal.take(None).restore()


def test_metrics_log_off_rank_writes_nothing(tmp_path):
    log = MetricsLog(tmp_path, enabled=False, purge_step=0)
    log.record("train", {"loss": 1.0}, 1, 0)
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_checkpointer_policy_save_and_checked_load(tmp_path):
    said = []
    agreed = []
    ckpt = Checkpointer(tmp_path, every_steps=5, is_main=True, agree=lambda failed: agreed.append(failed) or failed,
                        log=said.append)
    assert [s for s in range(1, 16) if ckpt.due(s)] == [5, 10, 15]
    assert not Checkpointer(tmp_path, 0, True, lambda f: f, said.append).due(5)
    assert ckpt.load() is None and ckpt.saved_step is None
    (tmp_path / "checkpoints").mkdir()
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "scheduler": {}, "epoch": 1, "position": 0, "step": 5,
             "rng": {}}
    ckpt.save(state, "periodic", stop_at=20, complete=False)
    assert said and "checkpoint (periodic): epoch 1, batch 0, step 5" in said[0] and agreed == [False]
    assert torch.equal(load_checkpoint(ckpt.path)["model"]["w"], torch.ones(2)) and ckpt.saved_step == 5
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))  # the temp file was renamed
    info = json.loads((tmp_path / "checkpoints" / "last.json").read_text())
    assert (info["step"], info["stop_at"], info["reason"]) == (5, 20, "periodic")
    ckpt.save({**state, "step": 10, "model": {"w": torch.full((2,), 2.0)}}, "periodic", stop_at=20, complete=False)
    assert load_checkpoint(tmp_path / "checkpoints" / "previous.pt")["step"] == 5  # the one before, kept
    assert load_checkpoint(ckpt.path)["step"] == 10


def test_a_flipped_byte_in_a_tensor_is_found_and_the_previous_checkpoint_offered(tmp_path):
    ckpt = Checkpointer(tmp_path, 0, True, lambda failed: failed, lambda line: None)
    (tmp_path / "checkpoints").mkdir()
    state = {"model": {"w": torch.arange(64, dtype=torch.float32)}, "optimizer": {"state": {0: {"m": torch.ones(3)}}},
             "scheduler": {"lr": [0.1]}, "epoch": 0, "position": 3, "step": 3, "rng": {"python": [3, (1, 2), None]}}
    ckpt.save(state, "periodic", stop_at=9, complete=False)
    ckpt.save({**state, "step": 6}, "periodic", stop_at=9, complete=False)
    data = bytearray(ckpt.path.read_bytes())
    at = bytes(data).index(torch.arange(64, dtype=torch.float32).numpy().tobytes())  # the tensor's own bytes
    data[at + 100] ^= 0x04
    ckpt.path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"last.pt: damaged: its contents do not match the checksum.*"
                                         r"previous.pt \(step 3\) is intact: add --resume-from previous"):
        ckpt.load()
    ckpt.use_previous()  # what --resume-from previous does on rank 0
    assert ckpt.load()["step"] == 3 and (tmp_path / "checkpoints" / "damaged.pt").exists()
    ckpt.save({**state, "step": 4}, "periodic", stop_at=9, complete=False)  # previous.pt is the step-3 one, not the damaged one
    assert load_checkpoint(tmp_path / "checkpoints" / "previous.pt")["step"] == 3
    assert not [p.name for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]


def test_the_checksum_reads_the_same_through_a_save_and_a_load(tmp_path):
    state = {"model": {"w": torch.randn(3, 4).to(torch.bfloat16), "b": torch.tensor(True)}, "optimizer": {
        "state": {0: {"momentum_buffer": torch.zeros(2)}}, "param_groups": [{"lr": 0.1, "params": [0], "x": None}]},
        "scheduler": {}, "epoch": 0, "position": 0, "step": 0, "rng": {"python": [3, tuple(range(5)), None]}}
    before = state_digest(state)
    torch.save(state, tmp_path / "s.pt")
    assert state_digest(torch.load(tmp_path / "s.pt", weights_only=True)) == before
    assert state_digest({**state, "step": 1}) != before
    assert state_digest({**state, "model": {**state["model"], "w": state["model"]["w"] + 1}}) != before


def test_a_failed_write_is_one_error_on_every_rank(tmp_path):
    """rank 0's WriteError on itself; the others learn through `agree` and stop with a line naming the file."""
    (tmp_path / "checkpoints").mkdir()
    blocked = tmp_path / "checkpoints" / "last.pt"
    blocked.mkdir()  # a directory where the file would go: the rename fails
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 0, "position": 0, "step": 1, "rng": {}}
    with pytest.raises(WriteError, match="last.pt: could not be written"):
        Checkpointer(tmp_path, 0, True, lambda failed: failed, print).save(state, "periodic", 5, False)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]
    with pytest.raises(WriteError, match="rank 0 could not write the checkpoint"):
        Checkpointer(tmp_path, 0, False, lambda failed: True, print).save(state, "periodic", 5, False)


# --- submission plan ----------------------------------------------------------------------------------

def plan_for(*argv, tmp_path):
    """hpc.submit's plan; with --sweep FILE, hpc.study run's (the one way to submit a sweep)."""
    argv = list(argv)
    if "--sweep" in argv:
        at = argv.index("--sweep")
        argv = [argv[at + 1], *argv[:at], *argv[at + 2:]]
        return make_plan(build_parser(STUDY_RUN).parse_args(["--runs-dir", str(tmp_path / "runs"), *argv]), None)
    return make_plan(build_parser().parse_args(["--runs-dir", str(tmp_path / "runs"), *argv]), None)


def test_a_single_job_is_a_plan_of_one_point(tmp_path):
    plan = plan_for("--dry-run", "--account", "m1_g", "--nodes", "2", "--gpus", "4", tmp_path=tmp_path)
    (spec,) = plan.specs
    assert not spec.array and len(spec.points) == 1 and spec.points[0][0] is None
    assert (spec.request.nodes, spec.request.gpus, spec.request.name) == (2, 4, "resnet152")
    assert not (tmp_path / "runs").exists()  # planning writes nothing


def test_the_study_is_three_arrays_of_twelve(tmp_path, capsys):
    plan = plan_for("--dry-run", "--account", "m1_g", "--sweep", str(REPO / "profiles" / "study.yaml"), tmp_path=tmp_path)
    assert [(s.request.gpus, len(s.points), s.array) for s in plan.specs] == [(1, 12, True), (2, 12, True), (4, 12, True)]
    fractions = {p["data_fraction"] for s in plan.specs for p, _ in s.points}
    assert fractions == {1.0, 0.5, 0.1}
    assert {task.config["train"]["batch_size"] for s in plan.specs for _, task in s.points} == {128, 512, 1024, 2048}
    print_plan(plan)
    out = capsys.readouterr().out
    assert out.count("#SBATCH --array=0-11") == 3 and not (tmp_path / "runs").exists()


# --- analysis: records folded into runs and sweeps ---------------------------------------------------

def _trace(rank, steps, cpu_us, step_us, peak=None):
    cpu = CpuTotals(steps=steps, step_time_us_mean=step_us, cpu_time_us=cpu_us, op_calls={})
    rec = trace_record(Path(f"rank{rank}.json"), {}, 0, 0, cpu, DeviceTotals(), MemoryPeaks())
    return dataclasses.replace(rec, peak_cpu_mem_bytes=peak)


def test_run_record_folds_cycles_per_rank_then_spreads_over_ranks():
    # rank 0: two cycles (2 + 2 steps); rank 1: one cycle of 4 steps, twice as slow
    records = [_trace(0, 2, 200.0, 100.0, peak=5), _trace(0, 2, 200.0, 120.0, peak=7), _trace(1, 4, 800.0, 220.0)]
    totals = {t.rank: t for t in rank_totals(records)}
    assert (totals[0].steps, totals[0].cpu_time_us, totals[0].step_time_us_mean) == (4, 400.0, 110.0)
    assert totals[0].peak_cpu_mem_bytes == 7 and totals[1].peak_cpu_mem_bytes is None
    assert totals[0].cpu_time_us_per_step == 100.0 and totals[1].cpu_time_us_per_step == 200.0
    run = run_record(Path("r"), records, None)
    assert (run.traces, run.ranks, run.gpus) == (3, 2, 2)
    assert run.cpu_time_us_per_step == Spread(mean=150.0, max=200.0)
    assert run.rank_imbalance == pytest.approx(2.0) and run.cuda_time_us == Spread()  # a CPU run: no CUDA time
    row = as_row(run)  # the flat columns the tables and the README use
    assert row["step_time_us_mean_max"] == 220.0 and row["cuda_time_us_per_step_mean"] is None
    assert set(RUN_COLUMNS) <= set(row) and row["run_dir"] == "r"


def _gpu_trace(rank, step_us, parts, launches, steps=2):
    """A rank's trace record as trace.py would build it from a GPU run (the GPU cannot run here)."""
    comp, comm, mem = parts
    return TraceRecord(file=f"rank{rank}.json", rank=rank, steps=steps, step_time_us_mean=step_us,
                       step_time_us=[step_us] * steps, step_numbers=list(range(5, 5 + steps)), cpu_time_us=1.0,
                       temporal_breakdown_us={"computation_us": comp * steps, "communication_us": comm * steps,
                                              "memory_us": mem * steps, "idle_us": 1.0, "span_us": 2.0},
                       collective_launch_us=[launches] * steps,
                       collectives=[{"kind": "all_reduce", "calls": 3 * steps, "bytes_per_call": 1e6, "busbw_GBps": 10.0}])


def test_sweep_point_loss_adds_up_to_the_step_time_difference_and_names_the_straggler():
    one = run_record(Path("g1"), [_gpu_trace(0, 1000.0, (600.0, 0.0, 50.0), [])], None)
    # 2 GPUs: rank 1 launches its 2nd and 3rd bucket last and its steps are the slowest
    two = run_record(Path("g2"), [_gpu_trace(0, 1200.0, (610.0, 200.0, 50.0), [100.0, 200.0, 300.0]),
                                  _gpu_trace(1, 1300.0, (620.0, 150.0, 50.0), [90.0, 250.0, 310.0])], None)
    one, two = (dataclasses.replace(r, data_fraction=1.0, batch_size_per_gpu=128, gpus=gpus)
                for r, gpus in ((one, 1), (two, 2)))
    one, two = with_scaling([one, two])
    assert two.step_skew_us == 100.0 and (two.straggler_rank, two.straggler_share) == (1, pytest.approx(2 / 3))
    loss = two.loss_us
    assert loss["total"] == 300.0 and sum(v for k, v in loss.items() if k != "total") == pytest.approx(300.0)
    assert loss["communication"] == 175.0 and loss["imbalance"] == 50.0 and loss["computation"] == 15.0
    assert two.allreduce_bytes_per_step == 3e6 and 0 < two.predicted_efficiency < 1
    assert one.loss_us is None and one.scaling_efficiency == 1.0


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
    from hpc.settings.schema import may_change_on_resume

    assert all(may_change_on_resume(*k.split(".")) for k in (
        "data.root", "data.num_workers", "train.max_steps", "train.eval", "train.cuda_memory_fraction",
        "profiler.enabled", "profiler.active", "profiler.memory_snapshot"))
    assert not any(may_change_on_resume(*k.split(".")) for k in (
        "train.batch_size", "train.lr", "train.seed", "model.arch", "data.fraction", "data.augment", "train.nokey"))


# --- hpc.study status: a point's state from literal queue states, run directories and logs ---------------

def _run_dir(root, name, summary=None, err="", metrics=()):
    d = root / name
    d.mkdir()
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    (d / f"{name}_0_log.err").write_text(err)
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return d


def test_point_state_from_queue_run_directory_and_logs(tmp_path):
    done = _run_dir(tmp_path, "1_0", {"ranks": [{"rank": 0, "complete": True, "steps": 6}]})
    oom = _run_dir(tmp_path, "1_1", {"outcome": "oom", "ranks": []})
    crashed = _run_dir(tmp_path, "1_2", err="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n",
                       metrics=[{"kind": "train", "step": 2}, {"kind": "train", "step": 3}])
    timed_out = _run_dir(tmp_path, "1_3", err="slurmstepd: error: *** JOB 1 ON nid001 CANCELLED AT 2026 DUE TO TIME LIMIT ***\n"
                                             "submitit INFO (2026) - Requeued job 1 (2 remaining timeouts)\n")
    assert point_state(done, "1_0", None, None)["state"] == "done"
    assert point_state(done, "1_0", None, None)["steps"] == 6
    assert point_state(oom, "1_1", None, None)["state"] == "oom"
    assert point_state(crashed, "1_2", None, None) == {"state": "failed", "requeues": 0, "steps": 3,
                                                        "error": "RuntimeError: boom"}
    t = point_state(timed_out, "1_3", None, None)
    assert t["state"] == "timeout" and t["requeues"] == 1 and "DUE TO TIME LIMIT" in t["error"]
    assert point_state(tmp_path / "never", "1_4", None, None)["state"] == "missing"
    assert point_state(crashed, "1_2", "RUNNING", None)["state"] == "running"  # the queue knows best
    assert point_state(tmp_path / "never", "1_4", "PENDING", None)["state"] == "pending"
    # pending again after it ran: Slurm requeued it (a lost node, a preemption) or it requeued itself
    assert point_state(_checkpoint_info(crashed, 2, 6), "1_2", "PENDING", None)["state"] == "requeued"
    assert point_state(timed_out, "1_3", "PENDING", None)["state"] == "requeued"  # "Requeued job" in its log
    assert point_state(crashed, "1_2", None, "OUT_OF_MEMORY")["state"] == "failed"  # host OOM: sacct's word


def _checkpoint_info(run_dir, step, stop_at):
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "checkpoints" / "last.json").write_text(json.dumps({"step": step, "stop_at": stop_at}))
    return run_dir


def test_a_silent_queue_leaves_unknown_what_the_run_directory_cannot_settle(tmp_path):
    """squeue failing (controller down): done and oom come from the run directory; a point that is not
    finished may be running, so it is unknown, never "failed" (and never resubmitted on that word)."""
    done = _run_dir(tmp_path, "2_0", {"ranks": [{"rank": 0, "complete": True, "steps": 6}]})
    oom = _run_dir(tmp_path, "2_1", {"outcome": "oom", "ranks": []})
    halfway = _checkpoint_info(_run_dir(tmp_path, "2_2", metrics=[{"kind": "train", "step": 4}]), 4, 8)
    crashed = _run_dir(tmp_path, "2_3", err="RuntimeError: boom\n")
    assert point_state(done, "2_0", None, None, queue_known=False)["state"] == "done"
    assert point_state(oom, "2_1", None, None, queue_known=False)["state"] == "oom"
    assert point_state(halfway, "2_2", None, None, queue_known=False) == {
        "state": "unknown", "requeues": 0, "steps": 4, "error": None}
    assert point_state(crashed, "2_3", None, None, queue_known=False)["state"] == "unknown"
    assert point_state(tmp_path / "never", "2_4", None, None, queue_known=False)["state"] == "unknown"
    assert point_state(halfway, "2_2", None, None)["state"] == "failed"  # the queue read: it is not running


def test_a_finished_run_without_its_summary_is_done_and_says_what_is_missing(tmp_path):
    """Killed between its last checkpoint and summary.json: the checkpoint says it is complete."""
    finished = _checkpoint_info(_run_dir(tmp_path, "3_0"), 8, 8)
    state = point_state(finished, "3_0", None, None)
    assert state["state"] == "done" and state["steps"] == 8 and "summary.json missing" in state["error"]
    stale = _checkpoint_info(_run_dir(tmp_path, "3_1", {"ranks": [{"rank": 0, "complete": False, "steps": 4}]}), 8, 8)
    assert point_state(stale, "3_1", None, None)["state"] == "done"  # the summary said stopped at 4: out of date
    said_stopped = _checkpoint_info(_run_dir(tmp_path, "3_2", {"ranks": [{"rank": 0, "complete": False, "steps": 4}]}),
                                    4, 8)
    assert point_state(said_stopped, "3_2", None, None)["state"] == "stopped"


def test_trace_discovery_stays_near_the_directory_it_is_given(tmp_path):
    """`python -m analysis /` must not walk the disk (found by the property tests: minutes under /proc): traces
    are looked for at most three levels down, and looking stops after MAX_ENTRIES entries."""
    from analysis.read import discover

    for depth in range(1, 6):
        d = tmp_path.joinpath(*["d"] * depth)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"rank{depth}.pt.trace.json").write_text("{}")
    assert sorted(p.name for p in discover.find_traces(tmp_path)) == ["rank1.pt.trace.json", "rank2.pt.trace.json",
                                                                        "rank3.pt.trace.json"]
    warnings: list[str] = []
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(discover.MAX_ENTRIES + 5):
        (wide / f"f{i}").touch()
    assert discover.find_traces(wide, warnings) == [] and "stopped looking" in warnings[0]


def test_a_memory_figure_without_categories_says_how_to_get_them():
    """The study's profile leaves memory by category off (its cost): its memory figures say how to turn it
    on, and say nothing once a run has recorded them (their own figure is drawn)."""
    from analysis.report.figures import memory_note
    from analysis.records import RunRecord

    plain = RunRecord(run_dir="a", gpus=1, batch_size_per_gpu=8, data_fraction=1.0)
    assert "--set profiler.memory_categories=true" in memory_note([plain])
    recorded = RunRecord(run_dir="b", gpus=2, batch_size_per_gpu=8, data_fraction=1.0,
                         peak_mem_by_category={"parameters": 1, "activations": 2})
    assert memory_note([plain, recorded]) is None


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
    from hpc.training.model import build_model, count_flops_per_image
    from hpc.settings.schema import ModelConfig

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
