"""analysis: the study's numbers from traces. Real GPU traces from ../shared/traces (other people's
runs) for the GPU-side quantities; CPU runs made here for agreement with key_averages()."""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.measure.kernels import classify_kernel
from analysis.pipeline import analyze_trace
from conftest import GPU_RESULTS, OWN_GPU_TRACE, SHARED_TRACES, run_module
from hpc.training import data
from trainrun import SMOKE, train

needs_shared = pytest.mark.traces
KINETO0 = SHARED_TRACES / "kineto_tb_plugin_samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DF_INDEX = SHARED_TRACES / "hta_single/df_index_resolver.json.gz"
NCCL = SHARED_TRACES / "hta_single/nccl_data.json.gz"


@needs_shared
def test_counted_facts_of_the_real_traces():
    # shared/traces/README.md: counted directly from the files' events.
    k = analyze_trace(KINETO0)
    assert (k.kernel_calls, k.steps, k.op_calls["aten::conv2d"]) == (8772, 6, 318)
    assert k.gpu_mem_relative_to_window is True  # 2021 schema: Bytes only
    d = analyze_trace(DF_INDEX)
    assert d.kernel_calls == 19370 and d.peak_gpu_mem_bytes == 6_629_508_096
    assert d.rank == 1 and d.gpu_mem_relative_to_window is False
    n = analyze_trace(NCCL)
    assert (n.kernel_calls, n.steps, n.op_calls["aten::conv2d"]) == (2700, 3, 159)
    assert n.rank == 0 and n.peak_gpu_mem_bytes is None  # no memory events: null, not 0
    assert n.kernel_calls_by_class["communication"] > 0 and 0 <= n.comm_overlap_pct <= 100
    assert sum(n.kernel_calls_by_class.values()) == n.kernel_calls
    assert n.gpu_busy_us <= n.cuda_time_us


@needs_shared
def test_both_ranks_of_a_real_two_rank_set(tmp_path):
    for f in (SHARED_TRACES / "hta/trace_filter_2rank").glob("*.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    proc = run_module("analysis", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    records = doc["traces"]
    assert doc["level"] == "run" and doc["run"]["ranks"] == 2 and doc["run"]["verdict"]["line"]
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert all(r["steps"] == 2 and r["comm_time_us"] > 0 for r in records)


def _world_of(trace: Path) -> tuple:
    """The oracle: what the trace file itself says of its world (json.load, not our reader)."""
    with gzip.open(trace) as f:
        doc = json.load(f)
    info = doc.get("distributedInfo") or {}
    return info.get("world_size"), info.get("backend"), (doc.get("deviceProperties") or [{}])[0].get("name")


@needs_shared
def test_a_folder_in_tensorboards_layout_is_analysed_run_by_run():
    # torch-tb-profiler's own two sample runs: logdir/RUN/*.pt.trace.json, one folder a run
    logdir = SHARED_TRACES / "kineto_tb_plugin_samples"
    folders = sorted(d.name for d in logdir.iterdir() if any(d.glob("*.pt.trace.json*")))
    proc = run_module("analysis", str(logdir), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    assert sorted(r["run_dir"] for r in runs) == folders and len(folders) == 2
    assert all(r["traces"] == 1 and r["ranks"] == 1 and r["verdict"]["line"] for r in runs)
    table = run_module("analysis", str(logdir))
    assert f"holds 2 runs, each analysed on its own: {', '.join(folders)}" in table.stderr
    verdicts = table.stdout.split("Verdict:")[1].split("\n\n")[0].strip().splitlines()
    assert [v.split(" (")[0].strip() for v in verdicts] == folders  # a verdict each, named once


@needs_shared
def test_traces_of_different_worlds_are_never_one_run(tmp_path):
    # HTA's trace_diff pair: one rank of an 8-GPU A100 run and one of a 2-GPU V100 run, side by side
    pair = sorted((SHARED_TRACES / "more/hta_trace_diff").glob("*.json.gz"))
    for f in pair:
        shutil.copy(f, tmp_path / f.name)
    worlds = {_world_of(f) for f in pair}
    assert len(worlds) == 2
    proc = run_module("analysis", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    assert len(runs) == 2 and all(r["ranks"] == 1 and r["rank_imbalance"] == 1.0 for r in runs)
    assert all("imbalance" not in r["verdict"]["line"] for r in runs)
    assert {f"world {w[0]}, {w[1]}, {w[2]}" for w in worlds} == {r["run_dir"].split(" (")[1][:-1] for r in runs}


def test_kernel_classes():
    assert classify_kernel("ncclKernel_AllReduce_RING_LL_Sum_float") == "communication"
    assert classify_kernel("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32") == "convolution"
    assert classify_kernel("cudnn::bn_fw_tr_1C11_kernel_NCHW<float>") == "normalisation"
    assert classify_kernel("ampere_sgemm_128x64_tn") == "gemm"
    assert classify_kernel("void at::native::reduce_kernel<512, 1>") == "reduction"
    assert classify_kernel("void at::native::vectorized_elementwise_kernel<4>") == "elementwise"
    assert classify_kernel("mystery") == "other"


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("an")
    data.synthesize(root / "data", n_train=400, n_test=100)
    run = root / "run"
    train(2, ["--config", SMOKE, "--data-root", str(root / "data"), "--run-dir", str(run), "--max-steps", "8",
              "--set", "profiler.repeat=2", "--set", "profiler.wait=0", "--set", "profiler.key_averages=true"])
    return run


def test_trace_numbers_agree_with_key_averages(cpu_run):
    """Tolerance: 1 µs per profiled step. Both sides come from the same event timestamps; self times
    of nested events sum to their roots' durations, so the only gap is the trace's rounding of
    timestamps (1 ns), far below 1 µs a step."""
    summary = json.loads((cpu_run / "summary.json").read_text())
    checked = 0
    for rank_rec in summary["ranks"]:
        names = rank_rec["profiler"]["traces"]
        assert len(names) == 2  # repeat=2: two cycles, two traces per rank
        for name, cycle in zip(names, rank_rec["profiler"]["cycles"]):
            rec = analyze_trace(cpu_run / "traces" / name)
            assert rec.rank == rank_rec["rank"]
            assert abs(rec.cpu_time_us - cycle["self_cpu_time_total_us"]) <= 1.0 * rec.steps, (rec, cycle)
            trace_ops = {k: v for k, v in rec.op_calls.items() if k.startswith("aten::")}
            assert trace_ops == cycle["op_calls"]
            checked += 1
    assert checked == 4


def test_own_h100_trace_agrees_with_the_profilers_totals():
    """The toolkit's own GPU trace (ResNet152, bf16, channels_last, H100; tests/gpu/run.sh) against
    the key_averages() totals and allocator peak the same run recorded on the GPU machine."""
    recorded = json.loads((GPU_RESULTS / "gpu_tests.json").read_text())["trace_vs_key_averages"]
    rec = analyze_trace(OWN_GPU_TRACE)
    assert rec.steps == 2 and rec.kernel_calls == recorded["key_averages_kernel_calls"]
    assert rec.cuda_time_us == pytest.approx(recorded["key_averages_device_time_us"], rel=0.01)
    assert rec.peak_gpu_mem_bytes == recorded["window_max_memory_allocated_bytes"]
    # Why eager ResNet152 on 32x32 images is slow: the GPU works ~10% of each step.
    assert rec.gpu_busy_us < 0.2 * rec.steps * rec.step_time_us_mean


def test_run_level_and_cli_formats(cpu_run, tmp_path):
    proc = run_module("analysis", str(cpu_run), "--format", "json")
    doc = json.loads(proc.stdout)
    records = doc["traces"]
    # the table's level (the run, its verdict the table's own line) first, the traces under their own key
    table = run_module("analysis", str(cpu_run)).stdout
    said = table.split("Verdict:", 1)[1].split("\n\n", 1)[0]
    verdict, gpus = said.strip().splitlines()  # the run's verdict, then what NVML saw (here: no GPU to sample)
    assert doc["level"] == "run" and verdict.endswith(f": {doc['run']['verdict']['line']}"), said
    assert gpus.split(", GPUs: ")[1] == doc["run"]["gpu_line"] and gpus.split(", GPUs: ")[1].startswith("no GPU to sample on")
    assert doc["run"]["ranks"] == 2 and doc["run"]["traces"] == len(records)
    assert len(records) == 4 and all(r["peak_cpu_mem_bytes"] > 0 for r in records)  # from summary.json
    assert all(r["cuda_time_us"] is None and r["peak_gpu_mem_bytes"] is None for r in records)
    assert all(r["kernel_calls"] is None and r["kernel_calls_by_class"] is None for r in records)  # no device
    for fmt, marker in (("csv", "file,rank,steps"), ("md", "| file | rank |"), ("table", "run: done; 4 trace(s), 2 rank(s)")):
        out = run_module("analysis", str(cpu_run), "--format", fmt)
        assert out.returncode == 0 and marker in out.stdout, out.stdout
    out = run_module("analysis", str(cpu_run), "--out", str(tmp_path / "o"))
    runs = json.loads((tmp_path / "o" / "runs.json").read_text())
    assert runs[0]["ranks"] == 2 and runs[0]["gpus"] == 2 and runs[0]["arch"] == "tiny"
    # the slowest rank's mean step over the fastest's, from the ProfilerStep#N spans read here from the traces
    means = []
    for rank in (0, 1):
        spans = [e["dur"] for path in (cpu_run / "traces").glob(f"rank{rank}.*")
                 for e in _events(path) if str(e.get("name", "")).startswith("ProfilerStep#")]
        means.append(sum(spans) / len(spans))
    assert runs[0]["rank_imbalance"] == pytest.approx(max(means) / min(means), rel=1e-3), means
    assert (tmp_path / "o" / "runs.csv").read_text().startswith("arch,data_fraction")


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["traceEvents"]


def test_bad_inputs_warn_and_the_rest_is_analysed(cpu_run, tmp_path):
    good = next((cpu_run / "traces").glob("rank0.*"))
    shutil.copy(good, tmp_path / "good.pt.trace.json")
    text = good.read_text()
    (tmp_path / "truncated.pt.trace.json").write_text(text[: len(text) // 2])
    (tmp_path / "corrupt.pt.trace.json.gz").write_bytes(gzip.compress(text.encode())[:500])
    (tmp_path / "other.json").write_text('{"not": "a trace"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    proc = run_module("analysis", str(tmp_path), "--format", "json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert [Path(r["file"]).name for r in json.loads(proc.stdout)["traces"]] == ["good.pt.trace.json"]
    warnings = proc.stderr.strip().splitlines()
    assert len(warnings) == 4 and all(w.startswith("analysis: warning: ") for w in warnings)
    for name, why in (("truncated", "truncated or malformed JSON"), ("corrupt", "corrupt gzip"),
                      ("other.json", "no top-level traceEvents"), ("list.json", "no top-level traceEvents")):
        assert any(name in w and why in w for w in warnings), (name, warnings)
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (empty, tmp_path / "other.json", tmp_path / "missing"):
        bad = run_module("analysis", str(path))
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("error:") == 1


def test_streaming_memory_does_not_grow_like_json_load(tmp_path):
    """A 60 MB trace: json.load holds ~10x that as Python objects; the streaming reader keeps two
    floats per CPU event. Peak RSS of each, in a fresh process."""
    events = []
    for i in range(200_000):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "pid": 1, "tid": 1 + i % 2,
                       "ts": i * 10.0, "dur": 5.0, "args": {"External id": i, "Input Dims": [[64, 3, 32, 32]],
                                                            "Input type": ["float"], "Sequence number": i}})
    big = tmp_path / "big.pt.trace.json"
    big.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    del events
    # VmHWM, not ru_maxrss: ru_maxrss survives fork+exec, so a child would report pytest's own peak.
    code = ("import sys, json\nimport numpy, analysis.pipeline\n"
            "hwm = lambda: int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
            "base = hwm()\n"
            "r = analysis.pipeline.analyze_trace(sys.argv[2]) if sys.argv[1] == 'stream' else json.load(open(sys.argv[2]))\n"
            "print(hwm() - base)")
    def peak_kib(mode):
        out = subprocess.run([sys.executable, "-c", code, mode, str(big)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())
    stream, whole = peak_kib("stream"), peak_kib("json")
    size_kib = big.stat().st_size // 1024
    assert stream < size_kib and stream * 4 < whole, (stream, whole, size_kib)
    rec = analyze_trace(big)
    assert rec.op_calls["aten::op7"] == 4000 and rec.cpu_time_us == pytest.approx(200_000 * 5.0)


@pytest.mark.slow
def test_sweep_table_and_figures(tmp_path):
    """A sweep directory as hpc.submit writes it (index.json + run directories), from real CPU runs."""
    root = tmp_path / "d"
    data.synthesize(root, n_train=300, n_test=100)
    sweep = tmp_path / "sweep"
    points = []
    for i, (frac, batch, gpus) in enumerate([(1.0, 8, 1), (1.0, 8, 2), (1.0, 16, 1), (1.0, 16, 2), (0.5, 8, 1), (0.5, 8, 2)]):
        run = sweep / f"100_{i}"
        train(gpus, ["--config", SMOKE, "--data-root", str(root), "--run-dir", str(run), "--max-steps", "4",
                     "--batch-size", str(batch), "--data-fraction", str(frac), "--set", "profiler.wait=0"])
        points.append({"data_fraction": frac, "batch_size": batch, "gpus": gpus, "nodes": 1, "job_id": f"100_{i}",
                       "run_dir": f"100_{i}"})
    (sweep / "index.json").write_text(json.dumps({"sweep": {}, "cluster": "local", "points": points}))
    out = tmp_path / "out"
    proc = run_module("analysis", str(sweep), "--format", "csv", "--out", str(out), "--plots")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.strip().splitlines()
    assert rows[0].startswith("arch,data_fraction,batch_size_per_gpu,gpus") and len(rows) == 7
    header, *table = [line.split(",") for line in (out / "sweep.csv").read_text().splitlines()]
    table = [dict(zip(header, line)) for line in table]
    assert all(r["speedup"] and r["scaling_efficiency"] for r in table if r["gpus"] == "2")
    assert "| arch |" in (out / "sweep.md").read_text()
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    # per fraction: the study's CPU runtime and CPU memory figures (1 = Figures 5 and 14; 0.5 = 3 and 12),
    # CPU time per step beside them; CUDA time, kernel calls and GPU memory are null on CPU runs: not
    # drawn. Plus scaling efficiency. (max_steps 4 ends before any epoch: no epoch-time figure.)
    assert figures == sorted(["fig05_cpu_runtime_fraction1.png", "fig14_cpu_memory_fraction1.png",
                              "fig03_cpu_runtime_fraction0.5.png", "fig12_cpu_memory_fraction0.5.png",
                              "cpu_time_us_per_step_mean_fraction1.png", "cpu_time_us_per_step_mean_fraction0.5.png",
                              "scaling_efficiency.png", "metric_train_loss.png"])  # and its own loss over steps
    assert all((out / "figures" / f).read_bytes()[:4] == b"\x89PNG" for f in figures)


def test_analysis_does_not_import_torch():
    code = "import sys, analysis.pipeline, analysis.compare, analysis.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
