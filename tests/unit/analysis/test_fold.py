"""analysis/runs/: a run's records folded per rank and spread over ranks, a sweep point's loss, trace
discovery, the memory figure's note."""

import dataclasses
from pathlib import Path

import pytest

from analysis.measure.trace import trace_record
from analysis.records import (
    CpuTotals,
    DeviceTotals,
    MemoryPeaks,
    Spread,
    TraceRecord,
    as_row,
)
from analysis.report.tables import RUN_COLUMNS
from analysis.runs.fold import rank_totals, run_record
from analysis.runs.sweep import with_scaling
from hpc.core.summary import RunRecord
from recordedruns import summary_of


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
    from analysis.records import RunRow
    from analysis.report.figures import memory_note

    plain = RunRow(run_dir="a", gpus=1, batch_size_per_gpu=8, data_fraction=1.0)
    assert "--set profiler.memory_categories=true" in memory_note([plain])
    recorded = RunRow(run_dir="b", gpus=2, batch_size_per_gpu=8, data_fraction=1.0,
                         peak_mem_by_category={"parameters": 1, "activations": 2})
    assert memory_note([plain, recorded]) is None


def test_a_point_of_swept_values_scales_against_the_1_gpu_point_of_the_same_values():
    """lr=0.1 on 2 GPUs against lr=0.1 on 1, not against lr=0.01's (issue 75); the runs table shows the values."""
    from analysis.records import RunRow
    from analysis.report.tables import run_columns

    def row(gpus, lr, images_per_s):
        return RunRow(run_dir=f"{gpus}-{lr}", data_fraction=1.0, batch_size_per_gpu=8, gpus=gpus,
                      swept=f"lr={lr}", images_per_s=images_per_s)

    rows = with_scaling([row(1, 0.1, 100.0), row(1, 0.01, 50.0), row(2, 0.1, 150.0), row(2, 0.01, 100.0)])
    assert {(r.gpus, r.swept): r.speedup for r in rows} == {(1, "lr=0.1"): 1.0, (1, "lr=0.01"): 1.0,
                                                            (2, "lr=0.1"): 1.5, (2, "lr=0.01"): 2.0}
    assert run_columns(rows)[run_columns(rows).index("nodes") + 1] == "swept"
    assert run_columns([dataclasses.replace(r, swept=None) for r in rows]) == RUN_COLUMNS


def test_a_scripts_runs_table_leaves_out_the_trainings_facts_no_run_has():
    """Issue 88: a script's runs showed `steps -` and `model -`; a fact one run has is kept for all."""
    from analysis.records import RunRow
    from analysis.report.tables import run_columns

    runs = [RunRow(run_dir=str(i), data_fraction=1.0, batch_size_per_gpu=128, gpus=1, data_source="script")
            for i in range(2)]
    assert [c for c in RUN_COLUMNS if c not in run_columns(runs)] == [
        "arch", "data_fraction", "batch_size_per_gpu", "step_mode", "graph_check"]
    runs[1] = dataclasses.replace(runs[1], step_mode="eager", arch="mine")
    assert {"arch", "step_mode"} <= set(run_columns(runs)) and "graph_check" not in run_columns(runs)
    toolkit = [dataclasses.replace(r, data_source="cifar100") for r in runs[:1]]
    assert run_columns(toolkit) == RUN_COLUMNS


def test_a_run_is_judged_above_the_fold_with_its_summarys_model_facts():
    """Issue 73: run_record folds without judging (runs sits below explain); judged_run attaches the verdict,
    reading the model's work per step from summary.json: with the FLOPs, batch and device it can say the
    share of the device's peak, without them it says why it cannot."""
    from analysis.explain.verdict import judged_run

    records = [_gpu_trace(0, 1200.0, (610.0, 200.0, 50.0), [100.0, 200.0, 300.0]),
               _gpu_trace(1, 1300.0, (620.0, 150.0, 50.0), [90.0, 250.0, 310.0])]
    run = run_record(Path("g2"), records, None)
    assert run.verdict is None
    summary = summary_of(kind="train", config={"train": {"amp": "bf16"}}, ranks=[
        {"rank": 0, "model_flops_per_image": 11.5e9, "batch_size_per_gpu": 128, "device_name": "NVIDIA A100-SXM4-40GB"}])
    bare, told = judged_run(run, records, None).verdict, judged_run(run, records, summary).verdict
    assert bare.bound == told.bound == "compute"  # kernels busy the whole profiled span
    assert "share of peak unknown (no FLOP count)" in bare.line
    assert "of the device's dense peak" in told.line and "unknown" not in told.line


def test_a_runs_config_is_read_as_its_runconfig_and_one_it_cannot_read_is_none():
    """summary.json's config travels as RunConfig (a renamed key fails the type check, not the report): the
    run's arch, data fraction and amp are its fields; a config this toolkit cannot read (a later toolkit's
    section that is no mapping, an arch it does not know) gives no config, not an error."""
    from analysis.runs.fold import config_of, model_facts

    told = summary_of(kind="train", run_dir="r", config={"model": {"arch": "resnet50"}, "data": {"fraction": 0.5},
                                                       "train": {"amp": "bf16"}})
    run = run_record(Path("r"), [], told)
    assert (run.arch, run.data_fraction, model_facts(told).bf16) == ("resnet50", 0.5, True)
    for unreadable in ({"model": {"arch": "resnet9000"}}, {"train": "fast"}):
        summary = summary_of(kind="train", run_dir="r", config=unreadable)
        assert config_of(summary) is None and run_record(Path("r"), [], summary).data_fraction is None
    assert config_of(summary_of(kind="command", run_dir="r")) is None
