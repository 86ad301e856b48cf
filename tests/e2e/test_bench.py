"""hpc.bench on the CPU: the command keeps working (structure only; CPU numbers are not the GPU targets)."""

import json

import pytest

from conftest import GRAPH_STANDIN, assert_one_line_error, run_module
from hpc.placement.scaling import scaling_prediction


def test_bench_runs_every_configuration_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_module("hpc.bench", "--arch", "tiny", "--batch", "8", "--steps", "2", "--warmup", "1", "--out", str(out),
                      timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["torch"] and "hpc.bench" in report["command"]
    names = [r["config"] for r in report["results"]]
    assert names[:2] == ["baseline", "toolkit"] and "toolkit, profiled" in names
    assert {"baseline + device data", "baseline + bf16", "baseline + channels_last", "baseline + fused SGD",
            "baseline + no host sync", "toolkit without DDP", "toolkit, again"} <= set(names)
    assert "toolkit + CUDA graph" not in names  # CUDA only: left out on a CPU, not faked
    profiled = next(r for r in report["results"] if r["config"] == "toolkit, profiled")
    assert profiled["profiler_extra_s"] == pytest.approx(
        profiled["wall_time_s"] - next(r for r in report["results"] if r["config"] == "toolkit, again")["wall_time_s"])
    for r in report["results"]:
        assert r["steps"] == 2 and r["images_per_s"] > 0 and r["model_flops_per_image"] > 0
        assert r["step_time_p90_s"] >= r["step_time_median_s"] > 0
        assert r["fraction_of_peak"] is None  # no device peak for a CPU: null, not invented
        assert 0 < r["data_share_pct"] < 100 and r["wall_time_s"] > 0
    assert "| configuration | batch | images/s |" in proc.stdout


def test_bench_bad_batch_is_one_line():
    assert_one_line_error(run_module("hpc.bench", "--batch", "8,x"), "--batch '8,x'")


def test_bench_refuses_unknown_configurations_and_unwritable_out_before_working(tmp_path):
    assert_one_line_error(run_module("hpc.bench", "--only", "toolkit,turbo"), "--only 'toolkit,turbo'", "'turbo'")
    missing = tmp_path / "no" / "bench.json"
    assert_one_line_error(run_module("hpc.bench", "--out", str(missing)), str(missing.parent))


def test_memory_grid_on_cpu_has_no_gpu_figures(tmp_path):
    out = tmp_path / "mem.json"
    proc = run_module("hpc.bench", "--arch", "tiny", "--memory-grid", "4,8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["memory"]
    assert [(r["config"], r["batch"]) for r in rows] == [("toolkit", 4), ("toolkit, fp32", 4), ("toolkit", 8),
                                                         ("toolkit, fp32", 8)]
    assert all(r["peak_memory_bytes"] is None and not r.get("error") for r in rows)


def test_profiler_overhead_is_counted_against_an_epoch():
    from hpc.bench.trainspeed import profiler_overhead

    plain = {"batch": 500, "wall_time_s": 10.0, "step_time_median_s": 0.1}
    prof = {"batch": 500, "wall_time_s": 11.0, "step_time_median_s": 0.11}
    o = profiler_overhead(plain, prof)  # one epoch: 50,000 / 500 = 100 steps x 0.1 s = 10 s
    assert o["profiler_extra_s"] == pytest.approx(1.0) and o["profiler_overhead_epoch_pct"] == pytest.approx(10.0)
    assert o["profiler_overhead_pct"] == pytest.approx(10.0)


def test_scaling_model():
    one = scaling_prediction(0.1, 233e6, 1, 1)
    assert one["efficiency"] == 1.0
    node = scaling_prediction(0.1, 233e6, 4, 1)
    two_nodes = scaling_prediction(0.1, 233e6, 4, 2)
    # 233 MB x 2*3/4 / 200 GB/s = 1.75 ms inside a node; over the NIC (20 GB/s) 8 GPUs take 20.4 ms
    assert node["allreduce_s"] == pytest.approx(233e6 * 1.5 / 200e9)
    assert two_nodes["allreduce_s"] == pytest.approx(233e6 * 1.75 / 20e9)
    assert 1 > node["efficiency"] > two_nodes["efficiency"]
    # a short step cannot hide the all-reduce under backward
    assert scaling_prediction(0.005, 233e6, 4, 2)["efficiency"] < 0.5


def test_the_graphed_configuration_is_the_trainers_checked_ddp_step(tmp_path):
    """"toolkit + CUDA graph" is built from the trainer's pieces (DDP by wrap_ddp, the step by graph_step,
    the check by GraphRun), so it times what hpc.train runs. No GPU here: the tests' CPU stand-in (HPC_GRAPH_CAPTURE)
    for capture lets the path run; a forced mismatch must then end that configuration with the check's
    line, not time a graph that was never trusted."""
    out = tmp_path / "bench.json"
    only = ("--arch", "tiny", "--batch", "8", "--steps", "2", "--warmup", "1", "--only", "toolkit + CUDA graph")
    proc = run_module("hpc.bench", *only, "--out", str(out), env=GRAPH_STANDIN)
    assert proc.returncode == 0, proc.stderr
    row, = json.loads(out.read_text())["results"]
    assert (row["config"], row["ddp"], row["cuda_graph"], row.get("error")) == ("toolkit + CUDA graph", True, True, None)
    assert "graph check passed on 1 rank(s)" in proc.stdout + proc.stderr
    proc = run_module("hpc.bench", *only, "--out", str(out), env={**GRAPH_STANDIN, "HPC_FAULT_INJECT": "graph-mismatch"})
    row, = json.loads(out.read_text())["results"]
    assert row["error"].startswith("UsageError: train.cuda_graph = true, and the graph check failed on rank 0")
