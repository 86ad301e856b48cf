"""hpc/core/gpusample.py: the node's GPUs sampled by NVML and summed up for summary.json.

This machine has no GPU and no NVML library: the sampler's thread is run against a stand-in `pynvml`
(a mock, for the driver alone, which cannot run here) whose counters the test sets; the reading side is
tested on literal files, its figures worked out by hand. On a GPU, tests/gpu/run.sh's graphed epoch
records real samples (results/gpu/)."""

import json
import sys
import time
import types

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.core.gpusample import allocated, start_sampler, summarize

GIB = 2**30


def test_allocated_gpus_are_slurms_then_cuda_visible_devices():
    assert allocated({"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0"}) == ["2", "3"]
    assert allocated({"SLURM_JOB_GPUS": "0,1,2,3"}) == ["0", "1", "2", "3"]
    assert allocated({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert allocated({"CUDA_VISIBLE_DEVICES": ""}) is None and allocated({}) is None


def write_node(path, node, gpus, samples):
    lines = [json.dumps({"node": node, "period_s": 0.25, "gpus": gpus})]
    lines += [json.dumps({"t": t, "g": g}) for t, g in samples]
    path.write_text("\n".join(lines) + "\n")


def test_summary_of_literal_samples_names_the_idle_gpu(tmp_path):
    gpus = [{"index": 0, "name": "A100", "uuid": "GPU-0", "memory_total_bytes": 40 * GIB},
            {"index": 3, "name": "A100", "uuid": "GPU-3", "memory_total_bytes": 40 * GIB}]
    # fields: util %, memory util %, memory used, power W, SM MHz, memory MHz
    write_node(tmp_path / "nid001.jsonl", "nid001", gpus, [
        (100.0, [[90, 40, 10 * GIB, 300, 1410, 1215], [0, 0, 1 * GIB, 50, 210, 1215]]),
        (100.5, [[100, 60, 12 * GIB, 350, 1410, 1215], [2, 0, 1 * GIB, 52, 210, 1215]]),
    ])
    with open(tmp_path / "nid001.jsonl", "a") as f:
        f.write('{"t": 101.0, "g": [[50, 0')  # a kill cut this line short: skipped
    s = summarize(tmp_path)
    first, idle = s.gpus
    assert (first.node, first.index, first.samples, first.seconds) == ("nid001", 0, 2, 0.5)
    assert first.util_mean_pct == 95 and first.util_max_pct == 100 and first.mem_used_max_bytes == 12 * GIB
    assert first.power_mean_w == 325 and first.power_max_w == 350 and first.sm_mhz_mean == 1410
    assert idle.util_mean_pct == 1 and s.idle == ["nid001 GPU 3"] and s.sampled is True
    assert s.line == ("GPUs (NVML): nid001 GPU 0 95% busy, 12.0 of 40.0 GiB, 325 W; nid001 GPU 3 1% busy, "
                         "1.0 of 40.0 GiB, 51 W; allocated but idle (never 5% busy): nid001 GPU 3")


def test_a_node_with_nothing_to_sample_says_so(tmp_path):
    (tmp_path / "login1.jsonl").write_text(json.dumps({"node": "login1", "none": "no GPU to sample on login1 (NVML: x)"}) + "\n")
    s = summarize(tmp_path)
    assert msgspec.to_builtins(s) == {"sampled": False, "gpus": [], "idle": [], "none": ["no GPU to sample on login1 (NVML: x)"],
                 "line": "no GPU to sample on login1 (NVML: x)"}
    assert summarize(tmp_path / "missing") is None


def test_this_machine_has_no_gpu_to_sample_and_says_it_in_the_file(tmp_path):
    path = tmp_path / "gpus" / "here.jsonl"
    assert start_sampler(path, "here", {}) is None
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["node"] == "here" and record["none"].startswith("no GPU to sample on here (NVML: ")
    assert start_sampler(tmp_path / "off.jsonl", "here", {"HPC_GPU_SAMPLE_S": "0"}) is None
    assert not (tmp_path / "off.jsonl").exists()  # sampling turned off: nothing written


def fake_nvml(count=2, fail_after=None):
    """A stand-in for nvidia-ml-py's pynvml (no GPU here): fixed counters, optionally failing after N reads."""
    reads = {"n": 0}
    nvml = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, shut=[])
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: nvml.shut.append(True)
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nvml.nvmlDeviceGetName = lambda h: "Fake"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=40 * GIB, used=(h + 1) * GIB)

    def rates(h):
        reads["n"] += 1
        if fail_after is not None and reads["n"] > fail_after:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=80 if h == 0 else 0, memory=10)

    nvml.nvmlDeviceGetUtilizationRates = rates
    nvml.nvmlDeviceGetPowerUsage = lambda h: 250_000
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1410 if kind == 1 else 1215
    return nvml


def samples_written(path, n: int, timeout_s: float = 30.0) -> None:
    """Until the sampler has written `n` sample lines (each with its time "t"), bounded: the event the test
    needs, not a span of time."""
    deadline = time.monotonic() + timeout_s
    while sum('"t"' in line for line in (path.read_text().splitlines() if path.exists() else [])) < n:
        assert time.monotonic() < deadline, f"{n} samples not written within {timeout_s} s"
        time.sleep(0.01)


def test_the_sampler_thread_samples_the_allocated_gpus_until_stopped(tmp_path, monkeypatch):
    nvml = fake_nvml(count=4)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    path = tmp_path / "gpus" / "nid001.jsonl"
    sampler = start_sampler(path, "nid001", {"SLURM_STEP_GPUS": "0,2", "HPC_GPU_SAMPLE_S": "0.02"})
    assert sampler is not None
    samples_written(path, 5)
    sampler.stop()
    assert not sampler.thread.is_alive() and nvml.shut == [True]
    s = summarize(path.parent)
    assert [(g.index, g.util_mean_pct, g.mem_used_max_bytes) for g in s.gpus] == [(0, 80, GIB), (2, 0, 3 * GIB)]
    assert s.gpus[0].samples >= 5 and s.idle == ["nid001 GPU 2"] and s.gpus[0].power_mean_w == 250


def test_an_error_inside_the_sampler_is_said_once_and_stops_it(tmp_path, monkeypatch, caplog):
    nvml = fake_nvml(count=1, fail_after=3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    path = tmp_path / "n.jsonl"
    sampler = start_sampler(path, "n", {"HPC_GPU_SAMPLE_S": "0.01"})
    sampler.thread.join(timeout=5)
    assert not sampler.thread.is_alive() and nvml.shut == [True]
    said = [r.getMessage() for r in caplog.records if "GPU sampling" in r.getMessage()]
    assert said == ["hpc: GPU sampling of n stopped: GPU is lost"]
    assert summarize(tmp_path).gpus[0].samples == 3  # what it took before is kept


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.builds(json.dumps, st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["t", "g", "gpus", "none", "node", "index"]), kids, max_size=4),
    max_leaves=12))), max_size=12))
def test_any_file_reads_without_an_error(tmp_path_factory, lines):
    folder = tmp_path_factory.mktemp("gpus")
    (folder / "x.jsonl").write_text("\n".join(lines))
    s = summarize(folder)
    assert s is None or isinstance(s.line, str)


def test_the_summary_reads_the_running_figures_and_only_the_lines_after_them(tmp_path, monkeypatch):
    """A long run's samples are not read line by line at its end: the sampler keeps its figures in
    gpus/{node}.sum.json with the offset they reach; a requeued start carries them on; a damaged figures
    file falls back to every line."""
    import hpc.core.gpusample as gs

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=1))
    monkeypatch.setattr(gs, "SUM_EVERY_S", 0.0)
    path = tmp_path / "gpus" / "nid001.jsonl"
    env = {"HPC_GPU_SAMPLE_S": "0.01"}
    sampler = start_sampler(path, "nid001", env)
    samples_written(path, 4)
    sampler.stop()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    written = sum(1 for r in lines if "t" in r)
    sums = json.loads((tmp_path / "gpus" / "nid001.sum.json").read_text())
    assert sums["offset"] == path.stat().st_size and sums["gpus"][0]["n"] == written > 3
    # a line after the figures (a sampler killed between two writes of them) is still counted, once
    with open(path, "a") as f:
        f.write(json.dumps({"t": 1e10, "g": [[100, 0, 5 * GIB, 300, 1410, 1215]]}) + "\n")
    (gpu,) = summarize(path.parent).gpus
    assert gpu.samples == written + 1 and gpu.util_max_pct == 100 and gpu.mem_used_max_bytes == 5 * GIB
    # the next start (a requeue) carries the figures on
    again = start_sampler(path, "nid001", env)
    samples_written(path, written + 3)  # its own samples after the earlier start's
    again.stop()
    total = sum(1 for line in path.read_text().splitlines() if '"t"' in line)
    assert summarize(path.parent).gpus[0].samples == total
    # damaged figures: every line is read instead
    (tmp_path / "gpus" / "nid001.sum.json").write_text('{"node": "nid001", "offset": 3, "gpus": [{"n": "x"}]}')
    assert summarize(path.parent).gpus[0].samples == total


def test_a_gpu_busy_in_part_of_a_short_run_is_not_named_idle(tmp_path):
    """The rule is "never 5% busy", not a low mean: a GPU that worked at 90% in one sample of twenty (a
    short run's steps after its set-up) has a mean of 4.5% and is not idle; one never above 2% is."""
    gpus = [{"index": 0, "name": "A100", "uuid": "GPU-0", "memory_total_bytes": 40 * GIB},
            {"index": 1, "name": "A100", "uuid": "GPU-1", "memory_total_bytes": 40 * GIB}]
    samples = [(100.0 + i, [[90 if i == 19 else 0, 0, GIB, 60, 210, 1215], [2, 0, GIB, 50, 210, 1215]])
               for i in range(20)]
    write_node(tmp_path / "nid001.jsonl", "nid001", gpus, samples)
    s = summarize(tmp_path)
    busy_once, never = s.gpus
    assert busy_once.util_mean_pct == 4.5 and busy_once.util_max_pct == 90  # a mean rule would name it
    assert s.idle == ["nid001 GPU 1"], s.idle


def test_the_summary_takes_the_running_figures_and_reads_only_the_lines_after_their_offset(tmp_path):
    """The oracle is a figures file that disagrees with the lines before its offset (100 samples where
    the file holds 2): a reader that reads every line counts 3, one that takes the figures counts 101."""
    about = {"index": 0, "name": "A100", "uuid": "GPU-0", "memory_total_bytes": 40 * GIB}
    path = tmp_path / "nid001.jsonl"
    write_node(path, "nid001", [about], [(0.0, [[10, 0, GIB, 100, 1000, 1215]]),
                                         (1.0, [[10, 0, GIB, 100, 1000, 1215]])])
    figures = {"about": about, "n": 100, "first_t": 0.0, "last_t": 99.0, "sums": [5000.0, 0.0, 100.0 * GIB,
               20000.0, 100000.0, 121500.0], "maxes": [80.0, 0.0, 2.0 * GIB, 300.0, 1410.0, 1215.0]}
    (tmp_path / "nid001.sum.json").write_text(json.dumps({"node": "nid001", "offset": path.stat().st_size,
                                                          "gpus": [figures]}))
    with open(path, "a") as f:
        f.write(json.dumps({"t": 100.0, "g": [[100, 0, 3 * GIB, 400, 1410, 1215]]}) + "\n")
    (gpu,) = summarize(tmp_path).gpus
    assert gpu.samples == 101 and gpu.seconds == 100.0
    assert gpu.util_mean_pct == (5000 + 100) / 101 and gpu.util_max_pct == 100
    assert gpu.mem_used_max_bytes == 3 * GIB and gpu.power_max_w == 400


def test_a_figures_file_that_is_no_regular_file_is_not_read(tmp_path):
    """gpus/{node}.sum.json linked to /dev/zero (planted in a shared run folder) is passed over, as any
    file that is not a regular one of bounded size, and the samples are read line by line: in a child
    process with a bound, since reading /dev/zero would never end."""
    import subprocess

    about = {"index": 0, "name": "A100", "uuid": "GPU-0", "memory_total_bytes": 40 * GIB}
    write_node(tmp_path / "nid001.jsonl", "nid001", [about], [(0.0, [[10, 0, GIB, 100, 1000, 1215]])])
    (tmp_path / "nid001.sum.json").symlink_to("/dev/zero")
    code = ("import sys; from pathlib import Path; from hpc.core.gpusample import summarize; "
            "print(summarize(Path(sys.argv[1])).gpus[0].samples)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-2000:]
