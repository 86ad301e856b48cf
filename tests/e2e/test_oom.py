"""CUDA out of memory as a run's outcome (hpc/training/oom.py): exit 4, summary.json, the analysis shows OOM.

No GPU here, so the OOM is raised by the fault-injection switch HPC_FAULT_INJECT=oom-at-step:N (the
same torch.cuda.OutOfMemoryError the allocator raises); tests/gpu/test_gpu.py makes a real one."""

import json

import msgspec
import pytest

from analysis.report.figures import plot_sweep
from analysis.pipeline import analyze_run, analyze_sweep
from analysis.report.tables import RUN_COLUMNS, render
from conftest import run_module
from hpc.core.errors import EXIT_OOM, UsageError
from hpc.core.faults import Fault, parse_faults
from hpc.core.summary import OomRecord
from hpc.training.oom import describe, requested_bytes
from trainrun import SMOKE, summary, train

INJECT = {"HPC_FAULT_INJECT": "oom-at-step:2"}


@pytest.mark.parametrize("message, expected", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB", 2 * 2**30),
    ("CUDA out of memory. Tried to allocate 20.50 MiB (GPU 0; 39.39 GiB total capacity)", int(20.5 * 2**20)),
    ("Tried to allocate 512 B", 512),
    ("CUDA error: an illegal memory access was encountered", None),
])
def test_requested_bytes_from_the_allocators_message(message, expected):
    assert requested_bytes(message) == expected


@pytest.mark.parametrize("value, expected", [
    ("fail-at-step:2@batch=16", (Fault("fail", 2, 16),)), ("oom-at-step:3", (Fault("oom", 3),)),
    ("fail-at-step:2@batch=16@world=2,oom-at-step:1@world=4", (Fault("fail", 2, 16, 2), Fault("oom", 1, None, 4))),
    ("kill-during-checkpoint", (Fault("signal", signal="KILL", moment="checkpoint", once_saved=True),)), ("", ())])
def test_injected_faults_name_kind_step_and_point(value, expected):
    assert parse_faults(value) == expected


@pytest.mark.parametrize("value, entry", [("oom-at-step:x", "oom-at-step:x"), ("fail-at-step:2@batch=x", "@batch=x"),
                                          ("oom-at-step:1,junk", "'junk'"), ("fail-at-step:2@batch=16\n", "16\\n")])
def test_an_unknown_fault_entry_is_refused_naming_it(value, entry):
    """A typo must not switch every fault off without a word (it did: the test hook read it as none)."""
    with pytest.raises(UsageError, match="HPC_FAULT_INJECT=.*entry") as err:
        parse_faults(value)
    assert entry in str(err.value)


def test_a_fault_hits_only_its_step_batch_and_world():
    fault = Fault("oom", 2, batch=16, world=2)
    assert fault.hits(2, 16, 2) and not fault.hits(3, 16, 2) and not fault.hits(2, 8, 2) and not fault.hits(2, 16, 4)
    assert Fault("fail", 1).hits(1, 512, 8)


def test_describe_names_batch_rank_and_memory():
    oom = OomRecord(rank=1, message="CUDA out of memory.", batch_size_per_gpu=2048, requested_bytes=2**25,
                    device_free_bytes=70 * 2**30, device_total_bytes=80 * 2**30, limit_bytes=2 * 2**30,
                    memory_fraction=0.025, peak_allocated_bytes=2**31 - 2**28, snapshot="memory_snapshot.rank1.pickle")
    assert describe(oom) == ("CUDA out of memory at batch 2048 per GPU on rank 1: asked 0.03 GiB with 1.75 GiB "
                             "allocated at the peak, limit 2.00 GiB (train.cuda_memory_fraction 0.025) of 80.00 GiB; "
                             "snapshot memory_snapshot.rank1.pickle")
    cpu = msgspec.structs.replace(oom, device_free_bytes=None, device_total_bytes=None, limit_bytes=None,
                                  memory_fraction=None, peak_allocated_bytes=None, snapshot=None)
    assert describe(cpu) == ("CUDA out of memory at batch 2048 per GPU on rank 1: asked 0.03 GiB with ? allocated "
                             "at the peak, limit ? of ?")


def args(data_root, run_dir, *extra):
    return ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir), "--max-steps", "4",
            "--set", "profiler.wait=0", *extra]


def test_oom_on_every_rank_is_recorded_not_a_crash(data_root, tmp_path):
    run = tmp_path / "oom"
    results = train(2, args(data_root, run, "--batch-size", "16"), extra_env=INJECT, expect=EXIT_OOM)
    for _, _, stderr in results:
        assert "Traceback" not in stderr
        line = stderr.strip().splitlines()[-1]
        assert line.startswith("hpc.train: CUDA out of memory at batch 16 per GPU on rank") and "summary.json" in line
    s = summary(run)
    assert s["outcome"] == "oom" and s["world_size"] == 2 and s["oom"]["rank"] == 0
    assert s["oom"]["batch_size_per_gpu"] == 16 and s["oom"]["global_batch_size"] == 32
    assert s["oom"]["requested_bytes"] == 2**30 and "fault injection" in s["oom"]["message"]
    # the profiler writes what it recorded of the open window as the error unwinds: one trace per rank
    traces, row = analyze_run(run, [])
    assert len(traces) == 2
    assert row.outcome == "oom" and row.batch_size_per_gpu == 16 and row.gpus == 2
    proc = run_module("analysis", str(run))
    assert proc.returncode == 0 and "the run ended OUT OF MEMORY" in proc.stdout, proc.stdout + proc.stderr


def test_oom_before_any_trace_is_still_a_row(data_root, tmp_path):
    run = tmp_path / "early"
    train(1, args(data_root, run, "--batch-size", "16", "--no-profile"), extra_env={"HPC_FAULT_INJECT": "oom-at-step:1"},
          expect=EXIT_OOM)
    assert not (run / "traces").exists()
    proc = run_module("analysis", str(run), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    header, line = proc.stdout.strip().splitlines()
    row = dict(zip(header.split(","), line.split(",")))
    assert row["outcome"] == "oom" and row["batch_size_per_gpu"] == "16" and row["step_time_us_mean_max"] == ""


def test_sweep_shows_the_oom_point_and_keeps_the_others(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    points = []
    for i, (batch, gpus, env) in enumerate([(8, 1, None), (8, 2, None), (32, 1, INJECT), (32, 2, INJECT)]):
        train(gpus, args(data_root, sweep / f"7_{i}", "--batch-size", str(batch)), extra_env=env,
              expect=EXIT_OOM if env else 0)
        points.append({"data_fraction": 1.0, "batch_size": batch, "gpus": gpus, "nodes": 1, "job_id": f"7_{i}",
                       "run_dir": f"7_{i}"})
    (sweep / "index.json").write_text(json.dumps({"sweep": {}, "cluster": "local", "points": points}))
    _, rows = analyze_sweep(sweep, [])
    assert [(r.batch_size_per_gpu, r.gpus, r.outcome) for r in rows] == [
        (8, 1, "done"), (8, 2, "done"), (32, 1, "oom"), (32, 2, "oom")]
    assert rows[1].scaling_efficiency is not None and rows[3].scaling_efficiency is None
    table = render(rows, RUN_COLUMNS, "table").splitlines()
    assert sum(" oom " in line for line in table) == 2
    figures = plot_sweep(rows, tmp_path / "figures")
    assert figures and all(p.read_bytes()[:4] == b"\x89PNG" for p in figures)
