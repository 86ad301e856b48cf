"""The toolkit on a CUDA GPU: NCCL at world size 1, bf16 autocast, channels_last, fused SGD, the
profiler's CUDA activities, CUDA memory figures, the analysis and TensorBoard on the toolkit's own GPU
trace, deterministic resume, graph mode with DDP over NCCL (bit-identical to eager, resumed, profiled,
a smaller last batch, out of memory), torch.compile and the DataLoader path.

Nothing here is mocked. Without CUDA every test skips, saying so; `bash tests/gpu/run.sh` runs them
on a GPU machine (with `-m gpu`) and keeps the numbers they measured (HPC_GPU_RESULTS).
"""

import fcntl
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.pipeline import analyze_trace
from conftest import free_port, start_tensorboard, tb_operator_row
from hpc.training import data
from trainrun import SMOKE, metrics, same_weights, summary, train, weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (bash tests/gpu/run.sh on a GPU machine); the CPU tests cover "
                              "the same code on gloo"),
]

EAGER = ("--cuda-graph", "false")  # graph mode is the CUDA default (train.cuda_graph: auto)
GRAPH = ("--cuda-graph", "true")
RESNET152_STEPS = 30
RESNET152_BATCH = 128
MEASURED: dict = {}  # what the tests saw, written for tests/gpu/run.sh's summary


@pytest.fixture(scope="module", autouse=True)
def keep_measurements():
    """What this process's tests measured, added to OUTDIR/gpu_tests.json under a lock: with pytest-xdist
    each worker holds some of the tests."""
    yield
    out = os.environ.get("HPC_GPU_RESULTS")
    if out and MEASURED:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "gpu_tests.json"
        with open(Path(out) / ".gpu_tests.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**kept, **MEASURED}, indent=2, default=str))


def keep_trace(path: Path) -> None:
    """The toolkit's own GPU trace, gzipped beside the results, for the analysis to be tested on."""
    out = os.environ.get("HPC_GPU_RESULTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as src, gzip.open(Path(out) / "resnet152_rank0.pt.trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    # Exactly RESNET152_STEPS batches: the run ends at an epoch boundary, with its evaluation.
    data.synthesize(root, n_train=RESNET152_STEPS * RESNET152_BATCH, n_test=500, seed=0)
    return root


def run_args(data_root, run_dir, *extra) -> list[str]:
    return ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir), "--device", "cuda",
            "--set", "train.warmup_epochs=0", "--set", "model.zero_init_residual=true", *extra]


@pytest.fixture(scope="module")
def resnet152_run(data_root, tmp_path_factory):
    """ResNet152 (torchvision stem) for 30 steps under the profiler with CUDA activities and memory."""
    run = tmp_path_factory.mktemp("runs") / "resnet152"
    train(1, run_args(data_root, run, *EAGER, "--arch", "resnet152", "--stem", "torchvision", "--batch-size",
                      str(RESNET152_BATCH), "--lr", "0.1", "--max-steps", str(RESNET152_STEPS),
                      "--set", "train.log_every_steps=5", "--set", "profiler.profile_memory=true",
                      "--set", "profiler.key_averages=true"), timeout=600)
    return run


@pytest.mark.xdist_group("resnet152_run")  # one worker runs the shared ResNet152 run once
def test_resnet152_trains_with_nccl_bf16_channels_last(resnet152_run):
    rank = summary(resnet152_run)["ranks"][0]
    assert rank["backend"] == "nccl" and rank["device"].startswith("cuda") and rank["steps"] == RESNET152_STEPS
    assert rank["complete"] and rank["cuda_max_memory_allocated_bytes"] > 0
    losses = [r["loss"] for r in metrics(resnet152_run) if r["kind"] == "train"]
    assert len(losses) == RESNET152_STEPS // 5 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    saved = (resnet152_run / "config.yaml").read_text()
    assert "arch: resnet152" in saved and "amp: auto" in saved
    MEASURED["resnet152_run"] = {"device": rank["device_name"], "losses": losses,
                                 "step_time_median_s": rank["step_time_s"]["median"],
                                 "images_per_s": rank["images_per_s"],
                                 "cuda_max_memory_allocated_bytes": rank["cuda_max_memory_allocated_bytes"]}
    # NVML's samples of the node's GPU while it trained (hpc/core/gpusample.py), against torch's own figures:
    # the driver's memory in use covers what this process's allocator reserved; the GPU was busy.
    gpus = summary(resnet152_run)["gpus"]
    MEASURED["nvml"] = gpus
    gpu = next((g for g in gpus["gpus"] if g["name"] == torch.cuda.get_device_name(0)), gpus["gpus"][0])
    assert gpus["sampled"] and gpu["samples"] >= 2 and gpu["util_max_pct"] > 0 and gpu["power_max_w"] > 0
    assert gpu["mem_used_max_bytes"] >= rank["cuda_max_memory_reserved_bytes"] > 0
    assert gpus["line"].startswith("GPUs (NVML): ")


@pytest.mark.xdist_group("resnet152_run")  # one worker runs the shared ResNet152 run once
def test_one_trace_with_kernels_agrees_with_key_averages(resnet152_run):
    rank = summary(resnet152_run)["ranks"][0]
    traces = rank["profiler"]["traces"]
    assert len(traces) == 1, traces
    rec = analyze_trace(resnet152_run / "traces" / traces[0])
    cycle = rank["profiler"]["cycles"][0]
    MEASURED["trace_vs_key_averages"] = {
        "trace_cuda_time_us": rec.cuda_time_us, "key_averages_device_time_us": cycle["self_device_time_total_us"],
        "trace_kernel_calls": rec.kernel_calls, "key_averages_kernel_calls": cycle["kernel_calls"],
        "trace_peak_gpu_mem_bytes": rec.peak_gpu_mem_bytes,
        "window_max_memory_allocated_bytes": cycle["cuda_max_memory_allocated_bytes"],
        "kernel_calls_by_class": rec.kernel_calls_by_class, "steps": rec.steps}
    keep_trace(resnet152_run / "traces" / traces[0])
    assert rec.steps == 2 and rec.kernel_calls > 1000  # ~1,600 kernels per ResNet152 step
    assert rec.kernel_calls_by_class["convolution"] > 0
    assert rec.cuda_time_us == pytest.approx(cycle["self_device_time_total_us"], rel=0.01)
    assert rec.kernel_calls == cycle["kernel_calls"]
    assert rec.peak_gpu_mem_bytes == pytest.approx(cycle["cuda_max_memory_allocated_bytes"], rel=0.01)
    assert rec.peak_gpu_mem_bytes <= rank["cuda_max_memory_allocated_bytes"]


@pytest.mark.xdist_group("resnet152_run")  # one worker runs the shared ResNet152 run once
def test_tensorboard_shows_device_time_for_cudnn_convolution(resnet152_run):
    port = free_port()
    proc = start_tensorboard([sys.executable, "-m", "analysis.tensorboard", str(resnet152_run.parent),
                              "--port", str(port)], port)
    try:
        row = tb_operator_row(port, f"{resnet152_run.name}/traces", "aten::cudnn_convolution")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    MEASURED["tensorboard_cudnn_convolution"] = row
    assert row["device_self_duration"] > 0 and row["calls"] > 0


DETERMINISTIC = ("--arch", "resnet18", "--batch-size", "256", "--no-profile", "--deterministic")


@pytest.fixture(scope="module")
def deterministic_straight(data_root, tmp_path_factory):
    """An uninterrupted deterministic run: 3840 images / batch 256 = 15 steps, one epoch."""
    run = tmp_path_factory.mktemp("det") / "straight"
    train(1, run_args(data_root, run, *DETERMINISTIC, *EAGER))
    return run


def stop_and_resume(data_root, run, *extra) -> str:
    """Stop at step 6 (mid-epoch), then the same command without --max-steps; returns its stdout."""
    train(1, run_args(data_root, run, *DETERMINISTIC, *extra, "--max-steps", "6"))
    saved = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert saved["step"] == 6 and saved["position"] == 6
    out = train(1, run_args(data_root, run, *DETERMINISTIC, *extra))[0][1]
    assert "resuming from" in out and "step 6" in out, out
    assert summary(run)["ranks"][0]["steps"] == 15
    return out


def max_weight_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts' floating-point tensors."""
    return max((b[k].double() - a[k].double()).abs().max().item() for k in a if a[k].is_floating_point())


def test_deterministic_resume_is_bit_identical(data_root, deterministic_straight, tmp_path):
    stop_and_resume(data_root, tmp_path / "resumed", *EAGER)
    identical = same_weights(weights(deterministic_straight), weights(tmp_path / "resumed"))
    MEASURED["deterministic_resume"] = {"arch": "resnet18", "stopped_at_step": 6, "final_step": 15,
                                        "bit_identical": identical}
    assert identical


def test_cuda_graph_run_resumes_and_matches_eager(data_root, deterministic_straight, tmp_path):
    """The graphed step with DDP over NCCL (hpc/training/graph/cudagraph.py) takes the same steps as the eager
    one, bit for bit under --deterministic: its warm-up is undone, its learning rate follows the
    schedule, and it resumes from a checkpoint (captured again after the restart)."""
    run = tmp_path / "graphed"
    out = stop_and_resume(data_root, run, *GRAPH)
    assert "step mode: graph (train.cuda_graph = true; DDP captured with NCCL" in out, out
    eager, graphed = weights(deterministic_straight), weights(run)
    worst = max_weight_difference(eager, graphed)
    # Loss records by step; the record after the restart covers fewer steps, so compare step 4's.
    losses = {name: {r["step"]: r["loss"] for r in metrics(path) if r["kind"] == "train"}
              for name, path in (("eager", deterministic_straight), ("graph", run))}
    MEASURED["cuda_graph_vs_eager"] = {"max_abs_weight_difference": worst, "bit_identical": same_weights(eager, graphed),
                                       "losses": losses,
                                       "step_time_median_s": {"eager": summary(deterministic_straight)["ranks"][0]["step_time_s"]["median"],
                                                              "graph": summary(run)["ranks"][0]["step_time_s"]["median"]}}
    rank = summary(run)["ranks"][0]
    MEASURED["cuda_graph_vs_eager"]["graph_check"] = rank["graph_check_detail"]
    assert (rank["step_mode"], rank["ddp"], rank["env"].get("TORCH_NCCL_ASYNC_ERROR_HANDLING")) == ("graph", True, "0")
    assert rank["graph_check"] == "passed" and rank["graph_check_detail"]["exact"]  # bit-identical under --deterministic
    assert losses["graph"][4] == losses["eager"][4]
    assert same_weights(eager, graphed), worst


def test_the_graph_check_passes_on_a_gpu_and_a_forced_failure_falls_back_or_stops(data_root, tmp_path):
    """train.cuda_graph = auto, not deterministic: the real capture's first replay against an eager step,
    within the tolerances (the differences seen are kept: the margin on a real GPU); then the check made to
    fail (HPC_FAULT_INJECT): auto runs eager to the end, true stops with exit 2 and leaves nothing."""
    common = ("--arch", "resnet18", "--batch-size", "256", "--max-steps", "8", "--no-profile")
    out = train(1, run_args(data_root, tmp_path / "auto", *common))[0][1]
    rank = summary(tmp_path / "auto")["ranks"][0]
    MEASURED["graph_check"] = rank["graph_check_detail"]
    assert rank["graph_check"] == "passed" and rank["step_mode"] == "graph", out
    assert "graph check passed on 1 rank(s)" in out
    out = train(1, run_args(data_root, tmp_path / "mismatch", *common), {"HPC_FAULT_INJECT": "graph-mismatch"})[0][1]
    rank = summary(tmp_path / "mismatch")["ranks"][0]
    assert rank["step_mode"] == "eager" and rank["steps"] == 8, out
    assert "graph check failed on rank 0: the replay's update differs" in out
    (code, _, err), = train(1, run_args(data_root, tmp_path / "true", *common, *GRAPH),
                            {"HPC_FAULT_INJECT": "graph-capture-fail"}, expect=2)
    assert "train.cuda_graph = true, and the graph check failed on rank 0: capture raised" in err
    assert not (tmp_path / "true").exists()


def test_compile_runs(data_root, tmp_path):
    """torch.compile, and graph mode's auto (the default) stepping aside for it, saying why."""
    run = tmp_path / "compiled"
    out = train(1, run_args(data_root, run, "--arch", "resnet18", "--batch-size", "256", "--max-steps", "8", "--compile",
                            "--no-profile", "--set", "train.log_every_steps=4"), timeout=600)[0][1]
    assert "step mode: eager; train.cuda_graph = auto, and a graph does not work with model.compile = true" in out
    rank = summary(run)["ranks"][0]
    losses = [r["loss"] for r in metrics(run) if r["kind"] == "train"]
    MEASURED["compile"] = {"steps": rank["steps"], "losses": losses, "step_time_median_s": rank["step_time_s"]["median"]}
    assert rank["steps"] == 8 and all(math.isfinite(x) for x in losses)


def test_dataloader_path_with_workers_and_pinned_memory(data_root, tmp_path):
    run = tmp_path / "loader"
    train(1, run_args(data_root, run, "--arch", "resnet18", "--batch-size", "256", "--max-steps", "8", "--no-profile",
                      "--loader", "dataloader", "--set", "data.num_workers=2", "--set", "data.pin_memory=true",
                      "--set", "train.log_every_steps=4"))
    rank = summary(run)["ranks"][0]
    losses = [r["loss"] for r in metrics(run) if r["kind"] == "train"]
    MEASURED["dataloader"] = {"steps": rank["steps"], "losses": losses, "images_per_s": rank["images_per_s"]}
    assert rank["steps"] == 8 and all(math.isfinite(x) for x in losses)
    assert summary(run)["config"]["data"]["loader"] == "dataloader"


def test_cuda_graph_smaller_last_batch_runs_eagerly(data_root, tmp_path):
    """3840 images in batches of 500: seven replays, then a last batch of 340 run eagerly."""
    common = ("--arch", "resnet18", "--batch-size", "500", "--no-profile", "--deterministic", "--max-steps", "8")
    train(1, run_args(data_root, tmp_path / "eager", *common, *EAGER))
    train(1, run_args(data_root, tmp_path / "graph", *common, *GRAPH))
    eager, graphed = weights(tmp_path / "eager"), weights(tmp_path / "graph")
    worst = max_weight_difference(eager, graphed)
    MEASURED["cuda_graph_partial_batch"] = {"max_abs_weight_difference": worst, "bit_identical": same_weights(eager, graphed)}
    rank = summary(tmp_path / "graph")["ranks"][0]
    assert rank["steps"] == 8 and rank["graph_replays"] == 7  # 3840 = 7 x 500 + 340: the last ran eagerly
    assert same_weights(eager, graphed), worst  # --deterministic: the replays and the eager last batch, bit for bit


def test_real_oom_is_an_outcome_with_a_memory_snapshot(data_root, tmp_path):
    """ResNet152 at batch 2048 (4.6 GiB peak on an H100, results/gpu) in 2.5% of the GPU's memory: the
    allocator's own OutOfMemoryError ends the run with exit 4, summary.json says oom, and the allocator
    history is dumped for memory_viz. Batch 128 (1.3 GiB) under the same cap completes: it is the batch."""
    cap = ("--set", "train.cuda_memory_fraction=0.025", "--set", "profiler.memory_snapshot=true", "--no-profile",
           "--arch", "resnet152", "--stem", "torchvision", "--max-steps", "2", *EAGER)
    results = train(1, run_args(data_root, tmp_path / "oom", *cap, "--batch-size", "2048"), expect=4, timeout=600)
    stderr = results[0][2]
    assert "Traceback" not in stderr and "CUDA out of memory at batch 2048 per GPU on rank 0" in stderr
    s = summary(tmp_path / "oom")
    oom = s["oom"]
    MEASURED["oom"] = oom
    assert s["outcome"] == "oom" and oom["batch_size_per_gpu"] == 2048 and oom["memory_fraction"] == 0.025
    assert oom["requested_bytes"] > 0 and oom["device_total_bytes"] == torch.cuda.mem_get_info()[1]
    assert 0 < oom["peak_allocated_bytes"] <= oom["limit_bytes"] == int(0.025 * oom["device_total_bytes"])
    import pickle  # the toolkit's own file, written by torch.cuda.memory._dump_snapshot just now

    snapshot = pickle.loads((tmp_path / "oom" / oom["snapshot"]).read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"][0]
    train(1, run_args(data_root, tmp_path / "fits", *cap, "--batch-size", "128"), timeout=600)
    assert summary(tmp_path / "fits")["ranks"][0]["steps"] == 2
    # Graph mode: the same outcome (the warm-up before capture is where it runs out).
    graphed = train(1, run_args(data_root, tmp_path / "oom-graph", *cap[:-2], *GRAPH, "--batch-size", "2048"),
                    expect=4, timeout=600)
    assert "CUDA out of memory at batch 2048 per GPU on rank 0" in graphed[0][2]
    assert summary(tmp_path / "oom-graph")["outcome"] == "oom"


def test_profiled_graph_run_records_the_replayed_kernels(data_root, tmp_path):
    """Graph mode under the profiler, attached after the capture (the schedule waits a step): CUPTI records
    the kernels replayed inside the graph, the analysis counts those the steps launched (not the replay
    launched before the window that the lagging device is still running; the graph's copy nodes as
    copies), within 5% of the eager trace's kernels per step of the same configuration, and its verdict
    names the run's graph steps. The cycle's record says what the profiler cost the host, that CUPTI was
    detached after it, and how many of its steps were replays."""
    common = ("--arch", "resnet18", "--batch-size", "256", "--max-steps", "10", "--set", "profiler.wait=2")
    runs = {mode: tmp_path / mode for mode in ("eager", "graph")}
    train(1, run_args(data_root, runs["eager"], *common, *EAGER))
    train(1, run_args(data_root, runs["graph"], *common, *GRAPH))
    recs, cycles = {}, {}
    for mode, run in runs.items():
        rank = summary(run)["ranks"][0]
        recs[mode] = analyze_trace(run / "traces" / rank["profiler"]["traces"][0])
        cycles[mode] = rank["profiler"]["cycles"][0]
        cycles[mode]["after_window_median_s"] = rank["step_time_after_profiler_s"]["median"]
        cycles[mode]["step_median_s"] = rank["step_time_s"]["median"]
    per_step = {mode: rec.kernel_calls_per_step for mode, rec in recs.items()}
    report = subprocess.run([sys.executable, "-m", "analysis", str(runs["graph"]), "--format", "md"],
                            capture_output=True, text=True, timeout=300)
    MEASURED["graph_trace"] = {"kernel_calls_per_step": per_step, "cycles": cycles,
                               "cuda_time_us": {m: r.cuda_time_us for m, r in recs.items()}}
    assert per_step["graph"] == pytest.approx(per_step["eager"], rel=0.05)
    assert report.returncode == 0 and "graph steps" in report.stdout, report.stdout + report.stderr
    for cycle in cycles.values():
        assert cycle["cupti_detached"] is True and 0 < cycle["profiler_host_s"] < 5
    assert cycles["graph"]["graph_replays"] == recs["graph"].steps and cycles["eager"]["graph_replays"] == 0
