"""analysis/explain/verdict.py on literal evidence: each class decided by its own share against its threshold, the
secondary class, the cases where the evidence does not decide, the sweep note and the human units.
The real traces are judged in tests/e2e/test_verdicts.py."""

import dataclasses
import json
import re
from pathlib import Path

import msgspec
import pytest
from recordedruns import slow_rank_of
from hypothesis import given
from hypothesis import strategies as st

from analysis.explain import verdict as v
from analysis.records import ModelFacts, RunRow, Spread
from analysis.report.units import human_column
from analysis.runs.fold import step_mode
from hpc.core.summary import RunRecord

SPAN = 100_000.0  # µs
ROOT = Path(__file__).resolve().parents[3]


def gpu(compute=0.0, comm=0.0, memory=0.0, host=0.0, kernel=0.0, other=0.0, **more) -> v.Evidence:
    """Evidence for one device span: shares of SPAN busy, the rest idle, its gaps split host/kernel/other;
    the toolkit's own training's unless `script` says otherwise."""
    more = {"script": False, **more}
    idle = SPAN * (1 - compute - comm - memory)
    gaps = host + kernel + other or 1.0
    return v.Evidence(span_us=SPAN, computation_us=SPAN * compute, communication_us=SPAN * comm,
                      memory_us=SPAN * memory, idle_us=idle, host_wait_us=idle * host / gaps,
                      kernel_wait_us=idle * kernel / gaps, other_wait_us=idle * other / gaps, **more)


def figures(text: str) -> set[float]:
    """The numbers a sentence quotes (1,500 read as 1500): a verdict is checked by its numbers, worked out in
    the test, not by its wording (one golden sentence per verdict kind, in the imbalance and sweep tests)."""
    return {float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


def as_pct(share: float) -> float:
    """A share as the verdict quotes it: a percentage to one decimal."""
    return round(100 * share, 1)


def test_idle_gaps_waiting_for_the_host_are_host_launch_with_graph_mode_as_remedy():
    got = v.judge(gpu(compute=0.1, host=0.9, other=0.1, kernels_per_step=1500))
    assert (got.bound, got.secondary) == (v.HOST_LAUNCH, None)
    assert "train.cuda_graph: true" in got.remedy and "1,500 kernels a step" in got.evidence
    idle, host_of_gaps = 1 - 0.1, 0.9 / (0.9 + 0.1)  # worked out from the evidence, not read off the tool
    assert got.line.startswith("host-launch: ") and got.shares[v.HOST_LAUNCH] == pytest.approx(idle * host_of_gaps)
    assert figures(got.evidence) >= {as_pct(idle), as_pct(host_of_gaps), round(1 / (1 - idle), 1), 1500.0}


@pytest.mark.parametrize("evidence, words", [
    (dict(compute=0.1, host=0.9, other=0.1), "torch.compile with mode='reduce-overhead'"),
    (dict(compute=0.3, comm=0.5, host=1.0, ranks=8, nodes=2), "bucket_cap_mb in DistributedDataParallel(...)"),
    (dict(compute=0.35, memory=0.45, host=1.0), "pin_memory=True and .to(device, non_blocking=True)"),
])
def test_your_own_scripts_remedy_names_what_its_author_can_change(evidence, words):
    """A script run through `hpc.submit -- COMMAND` has no train.* or data.* keys: its remedy says what to
    change in the script; the class and the evidence are the same as for the toolkit's own run."""
    own, script = v.judge(gpu(**evidence)), v.judge(gpu(**evidence, script=True))
    assert (script.bound, script.evidence) == (own.bound, own.evidence)
    assert words in script.remedy and not any(key in script.remedy for key in ("train.", "data.", "ddp_bucket"))
    data = v.judge(dataclasses.replace(gpu(compute=0.2, host=1.0, script=True), dataloader_us=40.0, step_us=100.0))
    assert data.bound == v.DATA and "DataLoader num_workers" in data.remedy


def test_a_graphed_run_that_waits_on_the_host_is_not_told_to_use_graph_mode():
    got = v.judge(gpu(compute=0.1, host=1.0, graphed=True))
    assert got.bound == v.HOST_LAUNCH and "cuda_graph" not in got.remedy and "already a CUDA graph" in got.remedy


def test_a_trace_whose_kernels_came_from_a_graph_is_judged_graphed_without_its_summary():
    from analysis.records import TraceRecord

    rec = TraceRecord(file="t.json", kernel_calls=10, graph_kernel_calls=9)
    assert v.trace_evidence(rec).graphed and not v.trace_evidence(dataclasses.replace(rec, graph_kernel_calls=0)).graphed


def test_idle_gaps_with_the_next_kernel_already_queued_do_not_decide():
    got = v.judge(gpu(compute=0.15, comm=0.15, host=0.2, other=0.8))
    assert got.bound == v.UNKNOWN and got.remedy is None
    queued = 0.8 / (0.2 + 0.8)  # the gaps whose next kernel was already launched
    assert "next kernel already launched" in got.evidence and as_pct(queued) in figures(got.evidence)


def test_exposed_communication_names_its_bandwidth_against_the_link():
    got = v.judge(gpu(compute=0.3, comm=0.5, host=1.0, busbw_GBps=2.6, ranks=8, nodes=2))
    assert (got.bound, got.secondary) == (v.COMMUNICATION, v.HOST_LAUNCH)  # host wait 20%: second, not first
    assert figures(got.evidence) >= {as_pct(0.5), 2.6} and "GB/s against ~" in got.evidence
    assert "network" in got.evidence and "ddp_bucket_cap_mb" in got.remedy
    one_node = v.judge(gpu(compute=0.3, comm=0.5, busbw_GBps=50.0, nodes=1))
    assert "NVLink" in one_node.evidence


def test_memory_copies_no_kernel_covers():
    got = v.judge(gpu(compute=0.35, memory=0.45, host=1.0))
    assert got.bound == v.MEMORY and as_pct(0.45) in figures(got.evidence) and "data.loader: device" in got.remedy


def test_data_loading_is_the_cause_of_the_host_wait_not_a_second_verdict():
    e = dataclasses.replace(gpu(compute=0.2, host=1.0), dataloader_us=40.0, step_us=100.0)
    got = v.judge(e)
    assert (got.bound, got.secondary) == (v.DATA, None)  # the 80% host wait is not named beside it
    assert got.shares[v.HOST_LAUNCH] == pytest.approx(0.8)
    assert "num_workers" in got.remedy


def test_a_straggler_rank_is_named():
    e = dataclasses.replace(gpu(compute=0.15, comm=0.15, kernel=1.0), ranks=4, step_mean_us=100.0, step_max_us=130.0,
                            straggler_rank=3, straggler_share=0.75, slowest_step="rank 3 on nid002")
    got = v.judge(e)
    assert got.bound == v.IMBALANCE and "rank 3 launched collectives last 75.0%" in got.evidence
    assert got.evidence.startswith("rank 3 on nid002: its profiled step takes 0.13 ms against a mean of 0.10 ms over "
                                   "ranks: the others wait 23.1% of every step"), got.evidence
    assert v.judge(dataclasses.replace(e, ranks=1)).bound != v.IMBALANCE  # one rank has no imbalance
    # an imbalance whose slowest rank is not known is not given (issue 51: it names the rank, or is not said)
    assert v.judge(dataclasses.replace(e, slowest_step=None)).bound != v.IMBALANCE


def test_compute_bound_gives_the_share_of_peak_where_flops_are_known():
    got = v.judge(gpu(compute=0.9, host=1.0, achieved_tflops=98.9, peak_tflops=494.0))
    assert (got.bound, got.secondary, got.remedy) == (v.COMPUTE, None, None)
    assert "dense peak" in got.evidence and figures(got.evidence) >= {98.9, as_pct(98.9 / 494.0)}
    assert "share of peak unknown" in v.judge(gpu(compute=0.9)).evidence


def test_compute_is_never_the_secondary_and_a_secondary_needs_its_share():
    got = v.judge(gpu(compute=0.55, comm=0.25, host=1.0))  # host-launch 0.2 beside communication 0.25
    assert (got.bound, got.secondary) == (v.COMMUNICATION, v.HOST_LAUNCH)
    small = v.judge(gpu(compute=0.7, comm=0.22, host=1.0))  # idle 8%: host-launch under SECONDARY_SHARE
    assert (small.bound, small.secondary) == (v.COMPUTE, v.COMMUNICATION)


def test_a_cpu_run_has_no_device_verdict():
    got = v.judge(v.Evidence(dataloader_us=5.0, step_us=100.0))
    assert got.bound == v.UNKNOWN and "a CPU run" in got.evidence and "5.0% of the steps" in got.evidence


@pytest.mark.parametrize("script", [True, False, None])
def test_a_cpu_run_bound_by_its_dataloader_speaks_of_the_cpu_and_its_owners_levers(script):
    """No device timeline: no GPU in the words nor in the remedy; a script gets its own DataLoader's levers,
    the toolkit's training its data.num_workers, traces of an unknown owner both."""
    got = v.judge(v.Evidence(dataloader_us=40.0, step_us=100.0, script=script))
    assert got.bound == v.DATA and "GPU" not in got.evidence + got.remedy and "waiting for its batch" in got.evidence
    assert ("DataLoader num_workers" in got.remedy) is (script is not False)
    assert ("data.num_workers" in got.remedy) is (script is not True)
    assert "data.loader" not in got.remedy


def readme_thresholds() -> dict[str, int]:
    """Each class's threshold in per mille, read from the README's table ("Verdicts"): the oracle is the rule
    as the user reads it, not the code's THRESHOLDS."""
    rows = re.findall(r"^\| `([a-z-]+)` \|.*\| (\d+)% \|[^|]*\|$", (ROOT / "README.md").read_text(), flags=re.M)
    return {cls: int(pct) * 10 for cls, pct in rows}


def alone(cls: str, permille: int) -> v.Evidence:
    """Evidence in whole µs of a 1000 µs span where `cls` has the share permille / 1000 (exactly the float
    of that fraction) and every other class stays under its threshold."""
    busy = {"span_us": 1000.0, "computation_us": 500.0, "kernel_wait_us": 1.0, "script": False}
    if cls == v.COMPUTE:
        return v.Evidence(**{**busy, "computation_us": float(permille)})
    if cls in (v.COMMUNICATION, v.MEMORY):
        return v.Evidence(**busy, **{"communication_us" if cls == v.COMMUNICATION else "memory_us": float(permille)})
    if cls == v.HOST_LAUNCH:  # idle = the share, all of its gaps host wait
        return v.Evidence(span_us=1000.0, computation_us=700.0 - permille, communication_us=150.0,
                          memory_us=150.0, idle_us=float(permille), host_wait_us=1.0, script=False)
    if cls == v.DATA:
        return v.Evidence(**busy, dataloader_us=float(permille), step_us=1000.0)
    assert cls == v.IMBALANCE  # the slowest rank's step over the mean: (max - mean) / max
    return v.Evidence(**busy, ranks=2, step_max_us=1000.0, step_mean_us=1000.0 - permille,
                      slowest_step="rank 1 on nid001")


@pytest.mark.parametrize("cls", v.CLASSES)
def test_each_threshold_is_the_edge(cls):
    """Just under its threshold a class is not the verdict (nothing is); at it and just over it, it is
    ("a class is a candidate when its share reaches its threshold")."""
    t = readme_thresholds()[cls]
    for permille, named in ((t - 1, False), (t, True), (t + 1, True)):
        got = v.judge(alone(cls, permille))
        assert got.shares[cls] == permille / 1000
        assert got.bound == (cls if named else v.UNKNOWN), (permille, got.line)


@pytest.mark.parametrize("comm, second", [(99, None), (100, v.COMMUNICATION), (101, v.COMMUNICATION)])
def test_a_second_class_needs_a_tenth_of_the_time(comm, second):
    """analysis/README.md: a second class is named beside the first at 10% or more, under its own threshold."""
    got = v.judge(v.Evidence(span_us=1000.0, computation_us=700.0, communication_us=float(comm),
                             kernel_wait_us=1.0, script=False))
    assert (got.bound, got.secondary) == (v.COMPUTE, second), got.line


@pytest.mark.parametrize("host, named", [(499, False), (500, True), (501, True)])
def test_host_launch_needs_half_the_gaps_to_be_host_wait(host, named):
    """analysis/README.md: host-launch needs at least half the idle gaps to be host wait. Idle is 70% of the
    span, so its share (0.7 x the host part) is over its 30% threshold throughout: only the gaps decide."""
    e = v.Evidence(span_us=1000.0, computation_us=300.0, idle_us=700.0, host_wait_us=float(host),
                   kernel_wait_us=1000.0 - host, script=False)
    got = v.judge(e)
    assert got.shares[v.HOST_LAUNCH] >= 0.3
    assert got.bound == (v.HOST_LAUNCH if named else v.UNKNOWN), got.line


evidence = st.builds(
    gpu, compute=st.floats(0, 0.33), comm=st.floats(0, 0.33), memory=st.floats(0, 0.33),
    host=st.floats(0, 1), kernel=st.floats(0, 1), other=st.floats(0, 1),
    dataloader_us=st.none() | st.floats(0, 100), step_us=st.none() | st.floats(1, 100))


@given(evidence)
def test_any_evidence_gets_one_line_and_a_bound_that_reached_its_threshold(e):
    got = v.judge(e)
    assert "\n" not in got.line and got.line.startswith(got.bound)
    assert all(0.0 <= s <= 1.0 for s in got.shares.values())
    if got.bound != v.UNKNOWN:
        assert got.shares[got.bound] >= v.THRESHOLDS[got.bound]
        assert got.secondary is None or (got.secondary != got.bound and got.shares[got.secondary] >= v.SECONDARY_SHARE)
    else:
        assert got.remedy is None


@pytest.mark.parametrize("summary, mode", [
    ({"ranks": [{"rank": 0, "step_mode": "graph"}]}, "graph"),
    ({"ranks": [{"rank": 0}], "config": {"train": {"cuda_graph": True}}}, "graph"),  # a summary from before the fact
    ({"ranks": [{"rank": 0}], "config": {"train": {"cuda_graph": False}}}, "eager"),
    ({"ranks": [{"rank": 0}], "config": {"train": {"cuda_graph": "yes"}}}, None),  # neither says
    (None, None),
])
def test_the_step_mode_comes_from_the_summary(summary, mode):
    assert step_mode(None if summary is None else msgspec.convert(summary, RunRecord)) == mode


def _point(**loss) -> RunRow:
    return RunRow(run_dir="r", ranks=4, gpus=4, nodes=1, scaling_efficiency=0.71, allreduce_busbw_GBps=40.0,
                     loss_us={**loss, "total": sum(loss.values())})


def test_the_sweep_note_names_the_largest_loss_term():
    note = v.scaling_note(_point(computation=200.0, communication=4100.0, idle=900.0, imbalance=0.0))
    assert note == ("efficiency 0.71: the step is 5.20 ms longer than on 1 GPU, most of it exposed communication "
                    "(4.10 ms); all-reduce bus bandwidth 40.0 GB/s against ~" + note.split("against ~")[1])
    idle = v.scaling_note(_point(computation=200.0, communication=100.0, idle=900.0))
    assert "most of it the GPU idle" in idle and "GB/s" not in idle
    one = RunRow(run_dir="r", ranks=1, gpus=1, nodes=1, scaling_efficiency=1.0)
    assert v.scaling_note(one) is None  # a 1-GPU point has nothing to explain
    cpu = dataclasses.replace(_point(), loss_us=None, scaling_efficiency=0.28)
    assert v.scaling_note(cpu).startswith("efficiency 0.28: ") and "no device timeline" in v.scaling_note(cpu)
    assert v.scaling_note(dataclasses.replace(cpu, scaling_efficiency=1.05)).endswith("no loss to explain")
    assert "suspect the 1-GPU point" in v.scaling_note(dataclasses.replace(cpu, scaling_efficiency=2.33))


@pytest.mark.parametrize("name, values, header, shown", [
    ("cpu_time_us", [1_581_196], "cpu_time (s)", "1.58"),
    ("cuda_time_us", [21_340.0], "cuda_time (ms)", "21.3"),
    ("peak_cpu_mem_bytes", [1_133_641_728], "peak_cpu_mem (GiB)", "1.06"),
    ("peak_gpu_mem_bytes", [52_428_800], "peak_gpu_mem (MiB)", "50.0"),
    ("step_time_us_mean", [250_000.0], "step_time_mean (ms)", "250"),
    ("scaling_efficiency", [0.712], "scaling_efficiency (%)", "71.2"),
    ("allreduce_busbw_GBps", [2.6], "allreduce_busbw (GB/s)", "2.60"),
    ("images_per_s", [1234.5], "images_per_s", "1,234"),
    ("kernel_calls", [123456], "kernel_calls", "123,456"),
    ("data_fraction", [0.5], "data_fraction", "0.5"),
])
def test_human_units_put_the_unit_in_the_header(name, values, header, shown):
    got_header, show = human_column(name, values)
    assert (got_header, show(values[0]), show(None)) == (header, shown, "-")


def test_status_takes_a_points_verdict_from_the_report_and_reads_traces_only_for_the_rest(tmp_path):
    from hpc.core.rundir import SweepPaths
    from hpc.launch.status import reported_verdicts, verdict_of

    sweep = SweepPaths(tmp_path)
    sweep.analysis.mkdir()
    sweep.runs_json.write_text(json.dumps([
        {"run_dir": "/elsewhere/sweep/193_0", "verdict": {"bound": "host-launch", "secondary": "communication"}},
        {"run_dir": "/elsewhere/sweep/193_1", "verdict": {"bound": "compute", "secondary": None}},
        {"run_dir": 7, "verdict": {"bound": "compute"}}, "junk", {"run_dir": "x", "verdict": "compute"},
    ]))
    reported = reported_verdicts(sweep)
    assert reported == {"193_0": "host-launch (then communication)", "193_1": "compute"}  # by name: sweeps move
    assert verdict_of(tmp_path / "193_0", reported) == "host-launch (then communication)"  # no trace read
    assert verdict_of(tmp_path / "198", reported) is None  # not in the report, and no traces of its own
    sweep.runs_json.write_text("{not json")
    assert reported_verdicts(sweep) == {}


# --- the straggler's wait, and why none is named (README: imbalance) -----------------------------------------

def ranks_evidence(step_share: float, slow_rank: dict | None) -> v.Evidence:
    """Two ranks, compute 50% (under its threshold), the slowest's whole step `step_share` over the mean."""
    return v.Evidence(span_us=1000.0, computation_us=500.0, kernel_wait_us=1.0, script=False, ranks=2,
                      step_max_us=1000.0, step_mean_us=1000.0 * (1 - step_share), slowest_step="rank 1 on nid001",
                      slow_rank=slow_rank)


@pytest.mark.parametrize("holds, wait, share", [
    (True, 0.30, 0.30),  # a straggler that holds: its wait is the share where it is the larger
    (True, 0.04, 0.05),  # the whole steps' share is the larger: it stays
    (False, 0.30, 0.05),  # a wait whose straggler does not hold is not the share
])
def test_imbalance_is_the_larger_of_the_steps_and_a_proven_stragglers_wait(holds, wait, share):
    got = v.shares(ranks_evidence(0.05, slow_rank_of(holds=holds, wait_share=wait)))
    assert got[v.IMBALANCE] == pytest.approx(share)


def _run(mean=None, worst=None, not_named=None, slow=None, **more) -> RunRow:
    return RunRow(run_dir="r", ranks=2, step_time_us_mean=Spread(mean, worst), slowest_step_not_named=not_named,
                     slow_rank=slow, **more)


@pytest.mark.parametrize("permille, said", [(99, False), (100, True), (101, True)])
def test_no_straggler_named_is_said_where_a_mean_would_have_named_one(permille, said):
    """At the imbalance threshold or more (README: 10%), a share whose straggler the steps do not prove
    says why; under it, nothing is said (no rank would have been named)."""
    t = readme_thresholds()[v.IMBALANCE]
    assert t == 100
    own = _run(slow=slow_rank_of(holds=False, wait_share=permille / 1000, why_not="3 of 12 steps"))
    assert v.unproven_imbalance(own) == ("own work: 3 of 12 steps" if said else None)
    held = _run(slow=slow_rank_of(holds=True, wait_share=0.5, why_not="n/a"))
    assert v.unproven_imbalance(held) is None
    steps = _run(mean=1000.0 - permille, worst=1000.0, not_named="profiled steps: 3 measured by every rank")
    assert v.unproven_imbalance(steps) == ("profiled steps: 3 measured by every rank" if said else None)
    both = _run(mean=800.0, worst=1000.0, not_named="b", slow=slow_rank_of(holds=False, wait_share=0.2, why_not="a"))
    assert v.unproven_imbalance(both) == "own work: a; b"
    assert v.unproven_imbalance(_run(mean=800.0, worst=1000.0)) is None  # nothing said why: nothing to add


# --- a sweep point against its 1-GPU point (analysis/README.md) -------------------------------------------

@pytest.mark.parametrize("gpus, nodes, noted", [(1, 1, False), (2, 1, True), (1, 2, True), (None, None, False)])
def test_only_a_point_of_several_gpus_gets_a_scaling_note(gpus, nodes, noted):
    run = RunRow(run_dir="r", gpus=gpus, nodes=nodes, scaling_efficiency=0.5)
    assert (v.scaling_note(run) is not None) is noted


@pytest.mark.parametrize("efficiency, loss, doubt", [
    (0.99, True, False), (1.0, False, False), (1.2, False, False), (1.21, False, True),
])
def test_an_efficiency_at_linear_has_no_loss_and_above_1_2_doubts_the_1_gpu_point(efficiency, loss, doubt):
    """analysis/README.md: at or above linear there is no loss to explain; above 1.2 the 1-GPU point is
    suspect."""
    run = dataclasses.replace(_point(computation=100.0, communication=50.0, idle=0.0), scaling_efficiency=efficiency)
    note = v.scaling_note(run)
    assert figures(note.split(":")[0]) == {round(efficiency, 2)}
    assert ("no loss to explain" not in note) is loss and ("suspect the 1-GPU point" in note) is doubt
    assert ("most of it more kernel time (0.10 ms)" in note) is loss


@pytest.mark.parametrize("nodes, link", [(1, 200.0), (2, 20.0)])
def test_a_loss_mostly_communication_names_the_bandwidth_against_its_link(nodes, link):
    run = dataclasses.replace(_point(computation=10.0, communication=300.0), nodes=nodes, allreduce_busbw_GBps=12.5)
    note = v.scaling_note(run)
    assert "exposed communication" in note and figures(note) >= {12.5, link, 0.31, 0.30}
    assert ("NVLink" in note) is (nodes == 1) and ("network" in note) is (nodes > 1)
    assert "GB/s" not in v.scaling_note(dataclasses.replace(run, allreduce_busbw_GBps=None))


def test_a_loss_that_sums_to_nothing_says_the_step_is_no_longer():
    note = v.scaling_note(_point(computation=0.0, communication=0.0))
    assert note == "efficiency 0.71: the step is no longer than on 1 GPU"


# --- the golden sentences: one per verdict kind, whole (every other test reads the numbers) -------------------

GOLDEN = {
    v.HOST_LAUNCH: (gpu(compute=0.1, host=0.9, other=0.1, kernels_per_step=1500),
                    "host-launch: the GPU was idle 90.0% of the profiled span, 90.0% of its gaps waiting for the "
                    "host to launch the next kernel (kernels ran 10.0% of the span, 1,500 kernels a step); back to "
                    "back the device work would take 1/10.0 of the span; remedy: graph mode (train.cuda_graph: true, "
                    "or auto, the default outside the study's eager profile; DDP included) replays the whole step "
                    "as one launch; a larger per-GPU batch gives each launch more work"),
    v.COMMUNICATION: (gpu(compute=0.3, comm=0.5, host=1.0, busbw_GBps=2.6, ranks=8, nodes=2),
                      "communication (then host-launch): collectives not hidden by compute took 50.0% of the span; "
                      "all-reduce bus bandwidth 2.6 GB/s against ~20 GB/s the network should carry; remedy: a "
                      "larger train.ddp_bucket_cap_mb (fewer, larger all-reduces that overlap backward), or fewer "
                      "nodes for the same GPUs (the inter-node link is the slow one)"),
    v.MEMORY: (gpu(compute=0.35, memory=0.45, host=1.0),
               "memory-copies (then host-launch): memory copies and sets no kernel covered took 45.0% of the span; "
               "remedy: data.loader: device moves no batch over PCIe each step"),
    v.DATA: (dataclasses.replace(gpu(compute=0.2, host=1.0), dataloader_us=40.0, step_us=100.0),
             "data-loading: the DataLoader took 40.0% of the profiled steps, the GPU waiting for batches; remedy: "
             "data.loader: device (the whole uint8 set on the GPU, augmented there), or more data.num_workers"),
    "data-loading on a CPU": (v.Evidence(dataloader_us=40.0, step_us=100.0, script=True),
                              "data-loading: the DataLoader took 40.0% of the profiled steps, each step waiting for "
                              "its batch; remedy: more DataLoader num_workers with persistent_workers=True (each "
                              "worker a core of its own; on a CPU run they share the ranks' cores)"),
    v.COMPUTE: (gpu(compute=0.9, host=1.0, achieved_tflops=98.9, peak_tflops=494.0),
                "compute: kernels kept the GPU busy 90.0% of the span (healthy), 98.9 TFLOP/s = 20.0% of the "
                "device's dense peak"),
    v.IMBALANCE: (dataclasses.replace(gpu(compute=0.15, comm=0.15, kernel=1.0), ranks=4, step_mean_us=100.0,
                                      step_max_us=130.0, straggler_rank=3, straggler_share=0.75,
                                      slowest_step="rank 3 on nid002"),
                  "imbalance (then communication): rank 3 on nid002: its profiled step takes 0.13 ms against a "
                  "mean of 0.10 ms over ranks: the others wait 23.1% of every step; rank 3 launched collectives "
                  "last 75.0% of the time"),
    v.UNKNOWN: (gpu(compute=0.15, comm=0.15, host=0.2, other=0.8),
                "unknown: the GPU was idle 70.0% of the span, but 80.0% of its gaps came with the next kernel "
                "already launched (waiting on another stream or rank): the trace does not say on what"),
    "unknown on a CPU": (v.Evidence(dataloader_us=10.0, step_us=100.0),
                         "unknown: no device activity in the trace (a CPU run): the GPU classes cannot be judged; "
                         "the DataLoader took 10.0% of the steps"),
}


@pytest.mark.parametrize("kind", list(GOLDEN))
def test_each_verdict_kinds_one_golden_sentence(kind):
    """The whole line a user reads, once per kind: its wording is reviewed here, its numbers everywhere else."""
    evidence, line = GOLDEN[kind]
    assert v.judge(evidence).line == line


def test_the_slow_ranks_golden_sentence():
    from analysis.runs.ranks import slow_rank_words

    s = {"rank": 13, "node": "nid004", "own_s": 0.31, "median_own_s": 0.0124, "node_others_own_s": 0.0125,
         "slow_node": False, "ranks_measured": 32, "steps_above": 57, "steps_compared": 60}
    assert slow_rank_words(slow_rank_of(**s)) == (
        "rank 13 on nid004: own work (before the gradient sync) 310.0 ms a step against the other 31 ranks' median "
        "of 12.4 ms (25.0x), above the others in 57 of 60 steps; its node's other ranks 12.5 ms: a slow rank, not a "
        "slow node")
    alone = slow_rank_words(slow_rank_of(**{**s, "node_others_own_s": None, "median_own_s": 0.0, "steps_above": None}))
    assert alone.endswith("median of 0.0 ms; no other rank on its node")
    assert slow_rank_words(slow_rank_of(**{**s, "slow_node": True})).endswith(": a slow node, not a slow rank")


# --- the evidence a run and a trace give the rules ------------------------------------------------------------

def _trace(k: float, **more):
    from analysis.records import TraceRecord

    return TraceRecord(file=f"t{k}.json", steps=2, step_time_us=[100.0 * k, 100.0 * k], dataloader_us=10.0 * k,
                       dataloader_step_us=[5.0 * k, 5.0 * k], kernel_calls_in_steps=int(40 * k),
                       temporal_breakdown_us={"span_us": 1000.0 * k, "computation_us": 500.0 * k,
                                              "communication_us": 100.0 * k, "memory_us": 50.0 * k,
                                              "idle_us": 350.0 * k},
                       idle_breakdown_us={"host_wait_us": 200.0 * k, "kernel_wait_us": 100.0 * k, "other_us": 50.0 * k},
                       **more)


def test_a_runs_evidence_sums_its_ranks_traces_and_takes_the_rest_from_its_record():
    """Two ranks' traces (the second twice the first) and the run's record: each field worked out here."""
    from analysis.records import Spread

    a, b = _trace(1.0), _trace(2.0, device_name="NVIDIA H100 80GB HBM3", graph_kernel_calls=3)
    run = RunRow(run_dir="r", ranks=2, nodes=3, allreduce_busbw_GBps=7.5, step_time_us_mean=Spread(2e5, 3e5),
                    kernel_calls_per_step=Spread(60.0, 80.0), slowest_step="rank 1 on nid002", straggler_rank=1,
                    straggler_share=0.8)
    model = ModelFacts(flops_per_image=1e9, batch_size_per_gpu=64, bf16=True, script=True)
    e = v.run_evidence([a, b], run, model)
    assert (e.span_us, e.computation_us, e.communication_us, e.memory_us, e.idle_us) == (3000.0, 1500.0, 300.0,
                                                                                       150.0, 1050.0)
    assert (e.host_wait_us, e.kernel_wait_us, e.other_wait_us) == (600.0, 300.0, 150.0)
    assert (e.dataloader_us, e.step_us, e.data_step_shares) == (30.0, 600.0, [0.05] * 4)
    assert (e.kernels_per_step, e.ranks, e.nodes, e.busbw_GBps) == (60.0, 2, 3, 7.5)
    assert (e.step_mean_us, e.step_max_us, e.slowest_step, e.straggler_rank, e.straggler_share) == (
        2e5, 3e5, "rank 1 on nid002", 1, 0.8)
    # forward + backward: 3 x FLOPs x batch per step of 0.2 s; the H100's bf16 peak
    assert e.achieved_tflops == pytest.approx(3 * 1e9 * 64 / 0.2 / 1e12) and e.peak_tflops == 989.0
    assert e.graphed is True and e.script is True  # a kernel replayed from a graph in rank 1's trace
    plain = v.run_evidence([a], RunRow(run_dir="r"), ModelFacts())
    assert (plain.ranks, plain.nodes, plain.achieved_tflops, plain.peak_tflops, plain.graphed, plain.script) == (
        1, 1, None, None, False, None)
    assert v.run_evidence([b], run, msgspec.structs.replace(model, bf16=False)).peak_tflops == 494.0  # tf32's
    named = v.run_evidence([a], run, msgspec.structs.replace(model, device_name="NVIDIA A100-SXM4-40GB"))
    assert named.peak_tflops == 312.0  # no device in the traces: the summary's
    assert v.run_evidence([a], run, msgspec.structs.replace(model, graphed=True)).graphed is True
    assert v.run_evidence([a], run).achieved_tflops is None  # no summary: nothing known of the model


def test_a_traces_evidence_is_its_own():
    from analysis.records import TraceRecord

    rec = _trace(1.0, world_size=4, graph_kernel_calls=0, kernel_calls_per_step=20.0,
                 collectives=[{"kind": "broadcast", "busbw_GBps": 1.0}, {"kind": "all_reduce", "busbw_GBps": 9.0}])
    e = v.trace_evidence(rec)
    assert (e.span_us, e.idle_us, e.host_wait_us, e.other_wait_us) == (1000.0, 350.0, 200.0, 50.0)
    assert (e.dataloader_us, e.step_us, e.kernels_per_step, e.ranks, e.busbw_GBps, e.graphed) == (
        10.0, 200.0, 20.0, 4, 9.0, False)
    cpu = v.trace_evidence(TraceRecord(file="c.json", cpu_span_us=750.0, dataloader_us=75.0))
    assert (cpu.step_us, cpu.ranks, cpu.busbw_GBps, cpu.span_us) == (750.0, 1, None, None)  # no steps: the CPU span
    assert v.shares(cpu)[v.DATA] == 0.1


def test_the_words_of_each_branch_carry_their_numbers():
    """The branches the golden sentences leave: a proven straggler's own-work line, an imbalance with no rank
    that launched last, a host-launch with no busy device time, no class reached (the largest part named),
    nothing measured at all, and an idle span whose gaps are not measured."""
    from analysis.runs.ranks import slow_rank_words

    s = slow_rank_of(rank=1, node="nid001", own_s=0.02, median_own_s=0.01, node_others_own_s=None,
         slow_node=False, ranks_measured=2, steps_above=12, steps_compared=12, holds=True,
         wait_share=0.3)
    proven = v.judge(ranks_evidence(0.05, s))
    assert proven.bound == v.IMBALANCE
    assert proven.evidence == f"{slow_rank_words(s)}; the others wait for it 30.0% of every step"
    bare = v.judge(ranks_evidence(0.2, None))
    assert bare.evidence.endswith("the others wait 20.0% of every step") and "launched collectives" not in bare.evidence
    assert figures(bare.evidence) >= {1.0, 0.8}  # 1000 µs against a mean of 800 µs, in ms
    idle = v.judge(v.Evidence(span_us=1000.0, computation_us=0.0, idle_us=1000.0, host_wait_us=1.0, script=False))
    assert idle.bound == v.HOST_LAUNCH and "back to back" not in idle.evidence and "kernels a step" not in idle.evidence
    small = v.judge(v.Evidence(span_us=1000.0, computation_us=500.0, communication_us=150.0, kernel_wait_us=1.0))
    assert small.evidence == "no class reaches its threshold; the largest part, compute, is 50.0%"
    assert v.undecided(v.Evidence(span_us=1000.0), {}) == "no class reaches its threshold"
    unmeasured = v.undecided(v.Evidence(span_us=1000.0, idle_us=500.0), {})
    assert unmeasured == "the GPU was idle 50.0% of the span, but ? of its gaps came with the next kernel already " \
                         "launched (waiting on another stream or rank): the trace does not say on what"
    assert v.undecided(v.Evidence(), {}) == "no device activity in the trace (a CPU run): the GPU classes cannot be " \
                                           "judged"
    assert v._pct(None) == "?" and v._pct(0.1234) == "12.3%"
