"""hpc.train on the CPU with gloo: multi-rank training, resume, faults, traces, bad input."""

import gzip
import json
import signal
import socket
import time

import pytest
import torch

from conftest import assert_one_line_error, has_lines, run_module, wait_until
from hpc.core.errors import EXIT_PEER_LOST
from trainrun import SMOKE, metrics, same_weights, start_ranks, summary, train, wait_all, weights


def common(data_root, run_dir, *extra):
    return ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir), *extra]


@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank_training_learns_and_agrees(data_root, tmp_path, world):
    run = tmp_path / f"w{world}"
    train(world, common(data_root, run, "--epochs", "3", "--batch-size", "16", "--batch-scope", "global", "--lr", "0.1",
                        "--set", "train.log_every_steps=5"))
    records = metrics(run)
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.8 * losses[0], losses
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 3
    assert all(r["eval_images"] == 250 for r in epochs)  # every test image counted exactly once
    assert epochs[-1]["eval_top1"] > 5  # chance is 1 %
    s = summary(run)
    assert [r["rank"] for r in s["ranks"]] == list(range(world))
    assert len({r["weights_sha256"] for r in s["ranks"]}) == 1  # identical weights on every rank
    assert all(r["steps"] == s["ranks"][0]["steps"] for r in s["ranks"])
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert {"model", "optimizer", "scheduler", "epoch", "position", "step", "rng"} <= set(ckpt)
    for rank in range(world):
        traces = list((run / "traces").glob(f"rank{rank}.*.pt.trace.json*"))
        assert len(traces) == 1, traces
        opener = gzip.open if traces[0].suffix == ".gz" else open
        with opener(traces[0], "rt") as f:
            events = json.load(f)["traceEvents"]
        assert sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) == 2
    saved = (run / "config.yaml").read_text()
    assert "arch: tiny" in saved and "batch_size: 16" in saved and "batch_scope: global" in saved


# The uninterrupted run these end like is straight_smoke_2x4 (conftest.py: the same 4 epochs on 2 ranks;
# profiling and the logging cadence enter no arithmetic), run once for all of them.


def test_resume_is_bit_identical(data_root, tmp_path, straight_smoke_2x4):
    args = ("--epochs", "4", "--set", "train.log_every_steps=5")
    # Stop after 11 steps (mid-epoch), then the very same command without --max-steps.
    train(2, common(data_root, tmp_path / "resumed", *args, "--max-steps", "11"))
    assert torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)["step"] == 11
    out = train(2, common(data_root, tmp_path / "resumed", *args))
    assert "resuming from" in out[0][1]
    assert same_weights(straight_smoke_2x4, weights(tmp_path / "resumed"))


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGINT])  # Slurm's warning; Ctrl-C
def test_stop_signal_checkpoints_and_resumes_identically(data_root, tmp_path, sig, straight_smoke_2x4):
    args = ("--epochs", "4", "--set", "train.log_every_steps=1")
    procs = start_ranks(2, common(data_root, tmp_path / "pre", *args))
    log = tmp_path / "pre" / "metrics.jsonl"
    wait_until(lambda: has_lines(log, 5), f"5 records in {log}", 120, every_s=0.05)
    for p in procs:
        p.send_signal(sig)
    results = wait_all(procs)
    assert [rc for rc, _, _ in results] == [3, 3], results
    assert f"signal {sig.name}" in results[0][1] and not any("Traceback" in err for _, _, err in results)
    stopped = torch.load(tmp_path / "pre" / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert 0 < stopped < 4 * 32
    train(2, common(data_root, tmp_path / "pre", *args))
    assert same_weights(straight_smoke_2x4, weights(tmp_path / "pre"))


def test_kill_during_checkpoint_write_keeps_previous(data_root, tmp_path):
    args = ("--epochs", "1", "--set", "train.checkpoint_every_steps=5")
    train(1, common(data_root, tmp_path / "straight", *args))
    run = tmp_path / "crash"
    # The second checkpoint write dies half-way (SIGKILL): last.pt must still be the first one.
    results = wait_all(start_ranks(1, common(data_root, run, *args),
                                   {"HPC_FAULT_INJECT": "kill-during-checkpoint"}))
    assert results[0][0] == -signal.SIGKILL
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == 5
    assert list((run / "checkpoints").glob(".last.pt.tmp.*"))  # the half-written temp file
    train(1, common(data_root, run, *args))
    assert same_weights(weights(tmp_path / "straight"), weights(run))


def test_nonfinite_loss_stops_with_step_and_rank(data_root, tmp_path):
    run = tmp_path / "nan"
    results = train(2, common(data_root, run, "--lr", "1e30", "--set", "train.checkpoint_every_steps=1",
                              "--set", "train.momentum=0", "--no-profile"), expect=1)
    err = results[0][2].strip().splitlines()[-1]
    assert "non-finite loss at step" in err and "on rank" in err and "Traceback" not in results[0][2]
    bad_step = int(err.split("non-finite loss at step ")[1].split()[0])
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == bad_step - 1


def test_dead_peer_ends_the_run(data_root, tmp_path):
    run = tmp_path / "dead"
    procs = start_ranks(2, common(data_root, run, "--epochs", "50", "--no-profile", "--set",
                                  "train.collective_timeout_s=20", "--set", "train.log_every_steps=1"))
    # both ranks train once the first step's record is written
    wait_until(lambda: has_lines(run / "metrics.jsonl", 1), "the first step's record")
    procs[1].kill()
    start = time.time()
    rc, _, stderr = wait_all(procs[:1], timeout=120)[0]
    procs[1].wait()
    # a peer lost is exit 5 (requeue and resume), the line naming the rank, its pid and its host
    assert rc == EXIT_PEER_LOST and time.time() - start < 60, stderr[-500:]
    line = stderr.strip().splitlines()[-1]
    assert "rank 0 lost a peer during step" in line, line
    assert f"rank 1 (pid {procs[1].pid}) on {socket.gethostname()} ended" in line, line


def test_no_profile_writes_no_traces(data_root, tmp_path):
    train(1, common(data_root, tmp_path / "np", "--no-profile", "--max-steps", "3"))
    assert not (tmp_path / "np" / "traces").exists()
    assert summary(tmp_path / "np")["ranks"][0]["profiler"]["cycles"] == []


def test_profiler_totals_recorded(data_root, tmp_path):
    train(1, common(data_root, tmp_path / "off", "--max-steps", "6"))
    assert "self_cpu_time_total_us" not in summary(tmp_path / "off")["ranks"][0]["profiler"]["cycles"][0]  # opt-in
    train(1, common(data_root, tmp_path / "p", "--max-steps", "6", "--set", "profiler.key_averages=true"))
    cycle = summary(tmp_path / "p")["ranks"][0]["profiler"]["cycles"][0]
    assert cycle["self_cpu_time_total_us"] > 0
    assert cycle["conv2d_calls"] == 2 * 3  # 2 active steps x TinyNet's 3 convolutions


def test_resnet152_forward_backward_has_155_convolutions():
    from torch.profiler import ProfilerActivity, profile

    from hpc.settings.schema import ModelConfig
    from hpc.training.model import build_model

    model = build_model(ModelConfig(arch="resnet152"))
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    convs = {e.key: e.count for e in prof.key_averages()}["aten::conv2d"]
    assert convs == 155
    assert all(p.grad is not None for p in model.parameters())


def test_bad_inputs_are_one_line_errors(tmp_path, data_root):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_module("hpc.train", "--config", SMOKE, "--data-root", str(empty), "--run-dir",
                                     str(tmp_path / "r1"), "--set", "data.source=cifar100"),
                          str(empty), "no cifar-100-python/")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(run_module("hpc.train", *common(data_root, blocker / "run")), str(blocker / "run"),
                          "is a file")
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "r2", "--batch-size", "-4")),
                          "--batch-size", "train.batch_size = -4")
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "r3", "--arch", "vgg")),
                          "--arch", "model.arch = 'vgg'")
    # A run directory holds one run: resuming with another model is refused, nothing is touched.
    train(1, common(data_root, tmp_path / "r4", "--max-steps", "2", "--no-profile"))
    before = (tmp_path / "r4" / "checkpoints" / "last.pt").read_bytes()
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "r4", "--arch", "resnet18")),
                          "model.arch = 'tiny', not 'resnet18'")
    assert (tmp_path / "r4" / "checkpoints" / "last.pt").read_bytes() == before
    (tmp_path / "r4" / "checkpoints" / "last.pt").write_bytes(before[:100])
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "r4")), "last.pt",
                          "not a checkpoint this toolkit can load")


def test_gradient_accumulation_halves_optimizer_steps(data_root, tmp_path):
    run = tmp_path / "accum"
    train(2, common(data_root, run, "--batch-size", "16", "--grad-accum-steps", "2", "--no-profile"))
    s = summary(run)
    # 1000 images / 2 ranks = 500 per rank; micro-batches of 8 -> 63 per epoch -> 32 optimizer steps
    assert [r["steps"] for r in s["ranks"]] == [32, 32]
    assert s["ranks"][0]["batch_size_per_gpu"] == 16 and len({r["weights_sha256"] for r in s["ranks"]}) == 1
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "bad", "--batch-size", "16",
                                                          "--grad-accum-steps", "3")),
                          "train.batch_size = 16", "train.grad_accum_steps = 3")


def test_cuda_graph_needs_one_cuda_process(data_root, tmp_path):
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "g", "--device", "cpu",
                                                          "--set", "train.cuda_graph=true")),
                          "train.cuda_graph = true", "no CUDA device in use")
    assert not (tmp_path / "g" / "config.yaml").exists()


def test_deterministic_flag_is_saved_and_must_match_on_resume(data_root, tmp_path):
    train(1, common(data_root, tmp_path / "d", "--max-steps", "2", "--no-profile", "--deterministic"))
    assert "deterministic: true" in (tmp_path / "d" / "config.yaml").read_text()
    assert_one_line_error(run_module("hpc.train", *common(data_root, tmp_path / "d")),
                          "train.deterministic = True, not False")
