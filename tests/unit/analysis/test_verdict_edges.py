"""analysis/explain/verdict.py at the edges its sentences and shares turn on: each expected sentence or
number worked out here from the evidence built (shares of a 100 ms span, binary-exact where a threshold is
met exactly). The golden sentence of each verdict kind is in test_verdict.py."""

import pytest
from recordedruns import slow_rank_of

from analysis.explain import verdict as v
from analysis.records import ModelFacts, RunRow, Spread, TraceRecord
from test_verdict import SPAN, gpu


def test_a_straggler_measured_by_own_work_counts_where_no_mean_does():
    e = v.Evidence(slow_rank=slow_rank_of(holds=True, wait_share=0.3))  # one trace: no mean over ranks
    assert v.shares(e)[v.IMBALANCE] == 0.3
    assert v.IMBALANCE not in v.shares(v.Evidence(slow_rank=slow_rank_of(holds=False, wait_share=0.3)))


def test_data_loading_at_its_threshold_takes_host_launch_off():
    """The host is late because it loads data: one cause. DataLoader 25 of 100 (exactly its threshold)."""
    e = gpu(compute=0.1, host=1.0, dataloader_us=25.0, step_us=100.0)
    assert v.shares(e)[v.DATA] == v.THRESHOLDS[v.DATA] == 0.25
    assert v.HOST_LAUNCH not in v.eligible(e, v.shares(e))
    under = gpu(compute=0.1, host=1.0, dataloader_us=24.0, step_us=100.0)
    assert v.HOST_LAUNCH in v.eligible(under, v.shares(under))


def test_every_reason_a_class_is_not_named_is_said():
    e = gpu(compute=0.1, host=1.0, dataloader_us=50.0, step_us=100.0, data_step_shares=[1.0, 0.0, 0.0, 0.0],
            imbalance_unproven="rank 1 was above the others in 3 of 12 steps")
    got = v.judge(e)  # data loading reached on the sum, by one slow fetch of four: not named
    assert got.evidence.endswith(
        "; no straggler named: rank 1 was above the others in 3 of 12 steps"
        "; no data-loading named: the DataLoader took 25% of a step or more in 1 of 4 profiled steps "
        "(a class: half of them or more), the sum's share is a few slow fetches")


def test_only_data_loading_is_judged_step_by_step():
    """Compute at 70% of the span: named, whatever the DataLoader's steps say of data loading."""
    got = v.judge(gpu(compute=0.7, host=1.0, data_step_shares=[0.9, 0.0, 0.0, 0.0]))
    assert got.bound == v.COMPUTE


@pytest.mark.parametrize("steps, loading, shares", [
    ([0.0, 100.0], [0.0, 30.0], [0.3]),  # a step of no time has no share
    ([1.0], [0.5], [0.5]),  # a step of 1 us has one
    ([100.0, 100.0, 100.0], [10.0, 20.0], [0.1, 0.2]),  # a cut-off trace: the steps both lists have
])
def test_each_steps_dataloader_share(steps, loading, shares):
    rec = TraceRecord(file="t", step_time_us=steps, dataloader_step_us=loading)
    assert v._data_step_shares([rec]) == shares


def test_host_launch_words_and_the_ceiling_of_back_to_back_work():
    e = gpu(compute=0.25, host=1.0)  # idle 75%: back to back, the work is a quarter of the span
    assert v.describe(v.HOST_LAUNCH, e, v.shares(e)) == (
        "the GPU was idle 75.0% of the profiled span, 100.0% of its gaps waiting for the host to launch the next "
        "kernel (kernels ran 25.0% of the span); back to back the device work would take 1/4.0 of the span")
    all_idle = gpu(host=1.0)
    assert v.describe(v.HOST_LAUNCH, all_idle, v.shares(all_idle)).endswith("(kernels ran 0.0% of the span)")


def test_a_straggler_by_mean_step_times_in_milliseconds():
    e = v.Evidence(ranks=4, step_mean_us=10_000.0, step_max_us=12_500.0, slowest_step="rank 3 on nid002",
                   straggler_rank=3, straggler_share=0.75)
    assert v.describe(v.IMBALANCE, e, v.shares(e)) == (
        "rank 3 on nid002: its profiled step takes 12.50 ms against a mean of 10.00 ms over ranks: the others "
        "wait 20.0% of every step; rank 3 launched collectives last 75.0% of the time")


def test_compute_words_with_and_without_the_flop_count():
    e = gpu(compute=0.8, achieved_tflops=100.0, peak_tflops=400.0)
    assert v.describe(v.COMPUTE, e, v.shares(e)) == (
        "kernels kept the GPU busy 80.0% of the span (healthy), 100.0 TFLOP/s = 25.0% of the device's dense peak")
    peak_only = gpu(compute=0.8, peak_tflops=400.0)
    assert v.describe(v.COMPUTE, peak_only, v.shares(peak_only)) == (
        "kernels kept the GPU busy 80.0% of the span (healthy), the share of peak unknown (no FLOP count)")


def test_communication_words_name_the_link():
    e = gpu(compute=0.3, comm=0.5, host=1.0)
    assert v.describe(v.COMMUNICATION, e, v.shares(e)) == "collectives not hidden by compute took 50.0% of the span"
    one_node = gpu(compute=0.3, comm=0.5, host=1.0, busbw_GBps=80.0)
    assert v.describe(v.COMMUNICATION, one_node, v.shares(one_node)).endswith(
        f"; all-reduce bus bandwidth 80.0 GB/s against ~{v.PERLMUTTER_BUSBW_GBS['intra_node']:.0f} GB/s "
        "the NVLink should carry")


def test_undecided_at_the_idle_threshold_and_the_largest_part_by_its_share():
    e = v.Evidence(span_us=100.0, idle_us=30.0, host_wait_us=0.0, kernel_wait_us=30.0, computation_us=70.0)
    assert 30.0 / 100.0 == v.THRESHOLDS[v.HOST_LAUNCH]  # idle at host-launch's threshold, its gaps not the host's
    assert v.undecided(e, v.shares(e)).startswith("the GPU was idle 30.0% of the span, but 100.0% of its gaps")
    quiet = gpu(compute=0.5, memory=0.1, kernel=1.0)  # idle 40%: not the host's; compute under its 60%
    assert v.undecided(quiet, {v.COMPUTE: 0.5, v.MEMORY: 0.1}) .startswith("the GPU was idle 40.0%")
    assert v.undecided(v.Evidence(span_us=SPAN, idle_us=0.0), {v.COMPUTE: 0.5, v.MEMORY: 0.1}) == (
        "no class reaches its threshold; the largest part, compute, is 50.0%")


def test_the_idle_breakdown_is_read_from_the_traces_idle_breakdown():
    rec = TraceRecord(file="t", temporal_breakdown_us={"span_us": 100.0, "idle_us": 60.0, "computation_us": 40.0,
                                                           "communication_us": 0.0, "memory_us": 0.0},
                      idle_breakdown_us={"host_wait_us": 30.0, "kernel_wait_us": 20.0, "other_us": 10.0})
    e = v.trace_evidence(rec)
    assert (e.span_us, e.idle_us, e.host_wait_us, e.kernel_wait_us, e.other_wait_us) == (100.0, 60.0, 30.0, 20.0, 10.0)
    assert v.trace_evidence(TraceRecord(file="t")).step_us is None  # no steps, no CPU span: nothing to judge by


def run(**kw) -> RunRow:
    return RunRow(run_dir="r", **kw)


def test_a_runs_evidence_carries_its_straggler_and_its_flops():
    slow = slow_rank_of(holds=False, wait_share=0.2, why_not="rank 1 was above the others in 5 of 12 steps")
    r = run(ranks=2, step_time_us_mean=Spread(100_000.0, 100_000.0), slow_rank=slow)
    e = v.run_evidence([], r, ModelFacts(flops_per_image=1e9, batch_size_per_gpu=100, device_name="NVIDIA A100"))
    assert e.achieved_tflops == 3.0  # 3 x 1e9 x 100 images / 0.1 s = 3e12 FLOP/s
    assert e.peak_tflops == v.DEVICE_PEAK_TFLOPS["A100"]["tf32"]
    assert e.slow_rank == slow and e.imbalance_unproven == f"own work: {slow.why_not}"
    for model in (ModelFacts(batch_size_per_gpu=100, device_name="NVIDIA A100"), ModelFacts(flops_per_image=1e9)):
        unknown = v.run_evidence([], r, model)
        assert unknown.achieved_tflops is None and unknown.peak_tflops is None
    no_step = v.run_evidence([], run(ranks=2), ModelFacts(flops_per_image=1e9, batch_size_per_gpu=100))
    assert no_step.achieved_tflops is None


def test_an_unproven_straggler_needs_its_share_at_the_threshold():
    words = "rank 1 was above the others in 5 of 12 steps"
    for share, said in ((None, None), (0.09, None), (0.1, f"own work: {words}")):
        assert v.unproven_imbalance(run(slow_rank=slow_rank_of(holds=False, wait_share=share, why_not=words))) == said


@pytest.mark.parametrize("kw, note", [
    (dict(scaling_efficiency=1.3), "efficiency 1.30: at or above linear, no loss to explain; this far above, "
                                   "suspect the 1-GPU point (shared cores, a cold start) before a real gain"),
    (dict(scaling_efficiency=0.8), "efficiency 0.80: below linear, but the traces have no device timeline to "
                                   "split the loss by (a CPU run)"),
    (dict(scaling_efficiency=0.8, loss_us={"total": 0.5, "computation": 0.5}),
     "efficiency 0.80: the step is 0.00 ms longer than on 1 GPU, most of it more kernel time (0.00 ms)"),
    (dict(scaling_efficiency=0.8, loss_us={"total": 12000.0, "idle": 10000.0, "communication": 500.0}),
     "efficiency 0.80: the step is 12.00 ms longer than on 1 GPU, most of it the GPU idle (waiting on the host, "
     "data or other ranks) (10.00 ms)"),
    (dict(scaling_efficiency=0.8, loss_us={"total": 2500.0, "communication": 2000.0}, allreduce_busbw_GBps=50.0),
     "efficiency 0.80: the step is 2.50 ms longer than on 1 GPU, most of it exposed communication (2.00 ms); "
     f"all-reduce bus bandwidth 50.0 GB/s against ~{v.PERLMUTTER_BUSBW_GBS['intra_node']:.0f} GB/s the NVLink "
     "should carry"),
])
def test_a_sweep_points_note(kw, note):
    assert v.scaling_note(run(gpus=2, **kw)) == note
