"""`python -m analysis compare A B` on real traces: two of the same model, two world sizes of the same
model, a CPU run against itself (every difference zero), a trace against a copy of itself whose
convolution kernels were renamed (time moved between classes, which the comparison must name), and
sweep points chosen by their axes. Traces: ../shared/traces (skipped, saying so, where absent)."""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.measure.kernels import classify_kernel
from analysis.pipeline import analyze_trace
from conftest import assert_one_line_error
from test_analysis import cpu_run  # noqa: F401  (the fixture: a 2-rank CPU run with traces)

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
needs_traces = pytest.mark.traces


def compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis", "compare", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def compared(*args: str) -> dict:
    r = compare(*args, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def rows(result: dict, section: str) -> dict[str, dict]:
    return {r["name"]: r for r in result[section]}


@needs_traces
def test_two_traces_of_one_model_per_step_with_the_largest_term_named():
    control, test = TRACES / "more/hta_trace_diff/control.json.gz", TRACES / "more/hta_trace_diff/test.json.gz"
    result = compared(str(control), str(test))
    a, b = analyze_trace(control), analyze_trace(test)
    terms = result["terms_us"]
    # the terms of a step add up to the device timeline's span per step, on each side
    assert sum(t["a"] for t in terms) == pytest.approx(a.temporal_breakdown_us["span_us"] / a.steps, rel=1e-9)
    assert sum(t["b"] for t in terms) == pytest.approx(b.temporal_breakdown_us["span_us"] / b.steps, rel=1e-9)
    summary = rows(result, "summary")
    assert summary["kernel_calls"]["a"] == pytest.approx(a.kernel_calls / a.steps)  # per step, not per trace
    assert summary["step_time_us"]["delta"] == pytest.approx(b.step_time_us_mean - a.step_time_us_mean)
    top = max(terms, key=lambda t: abs(t["delta"]))
    why = result["explanation"]
    assert why["term"] == top["name"] and why["delta_us"] == pytest.approx(top["delta"])
    total = sum(t["delta"] for t in terms)
    assert why["share_pct"] == pytest.approx(100 * top["delta"] / total)
    assert f"most of it is {top['name']}" in why["sentence"]
    text = compare(str(control), str(test))
    assert text.returncode == 0 and text.stdout.splitlines()[0] == why["sentence"]
    assert "kernels by change" in text.stdout and "collectives" in text.stdout


@needs_traces
def test_one_and_two_ranks_of_resnet50_ddp_differ_by_communication():
    one = TRACES / "more/hta_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # world size 1
    two = TRACES / "hta_single/nccl_data.json.gz"  # rank 0 of 2
    result = compared(str(one), str(two))
    coll = {c["kind"]: c for c in result["collectives"]}
    assert coll and all(c["calls_a"] is None and c["calls_b"] > 0 for c in coll.values())
    comm = rows(result, "kernel_time_by_class_us")["communication"]
    assert comm["a"] == 0 and comm["b"] > 0
    assert rows(result, "terms_us")["communication (exposed)"]["delta"] > 0


def test_a_cpu_run_against_itself_differs_in_nothing(cpu_run):  # noqa: F811
    result = compared(str(cpu_run), str(cpu_run))
    assert result["explanation"]["term"] is None and "no difference" in result["explanation"]["sentence"]
    for section in ("summary", "terms_us"):
        assert result[section] and all(r["delta"] == 0 for r in result[section])
    assert all(r["delta_us"] == 0 for r in result["top_operators"])
    assert result["terms_us"][0]["name"].startswith("cpu: ")  # a CPU run: operators' self time
    assert result["a"]["files"] == result["b"]["files"] and len(result["a"]["files"]) == 2  # rank 0's 2 cycles


@needs_traces
def test_time_moved_between_classes_is_named(tmp_path):
    """The same trace with its convolution kernels renamed as elementwise ones: the step is as long as
    before, and the comparison must name the two classes the time moved between, by the right amount."""
    original = TRACES / "hta_single/nccl_data.json.gz"
    trace = json.loads(gzip.decompress(original.read_bytes()))
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel" and classify_kernel(e["name"]) == "convolution":
            e["name"] = "vectorized_elementwise_kernel_mutant_" + str(len(e["name"]))
    mutant = tmp_path / "mutant.json.gz"
    mutant.write_bytes(gzip.compress(json.dumps(trace).encode()))
    result = compared(str(original), str(mutant))
    terms = result["terms_us"]
    assert {terms[0]["name"], terms[1]["name"]} == {"convolution", "elementwise"}
    conv = rows(result, "kernel_time_by_class_us")["convolution"]
    assert conv["b"] == 0 and conv["a"] > 0
    assert rows(result, "kernel_time_by_class_us")["elementwise"]["delta"] == pytest.approx(conv["a"], rel=1e-9)
    assert abs(sum(t["delta"] for t in terms)) < 1e-6 * sum(abs(t["delta"]) for t in terms)  # moved, not added
    why = result["explanation"]
    assert why["term"] in ("convolution", "elementwise") and "against" in why["sentence"]


def make_sweep(sweep: Path) -> None:
    """A sweep of two points, 1 and 2 GPUs at batch 512: ResNet-50 DDP traces of world size 1 and 2."""
    points = []
    for gpus, src in ((1, "more/hta_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
                      (2, "hta_single/nccl_data.json.gz")):
        (sweep / f"p{gpus}" / "traces").mkdir(parents=True)
        shutil.copy(TRACES / src, sweep / f"p{gpus}" / "traces" / "rank0.pt.trace.json.gz")
        points.append({"run_dir": f"p{gpus}", "data_fraction": 1.0, "batch_size": 512, "gpus": gpus, "nodes": 1})
    (sweep / "index.json").write_text(json.dumps({"points": points}))


@needs_traces
def test_sweep_points_by_their_axes_and_bad_points_in_one_line(tmp_path):
    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    by_point = compared(str(sweep), "--point", "batch=512,gpus=1", "--point", "batch=512,gpus=2")
    by_file = compared(str(sweep / "p1" / "traces" / "rank0.pt.trace.json.gz"),
                       str(sweep / "p2" / "traces" / "rank0.pt.trace.json.gz"))
    assert by_point["terms_us"] == by_file["terms_us"] and by_point["a"]["label"] == "batch=512,gpus=1"
    assert_one_line_error(compare(str(sweep), "--point", "batch=512,gpus=4", "--point", "gpus=1"),
                          "batch=512,gpus=4", "no point")
    assert_one_line_error(compare(str(sweep), "--point", "batch=512", "--point", "gpus=1"), "2 points")
    assert_one_line_error(compare(str(sweep), "--point", "bacth=512", "--point", "gpus=1"), "bacth=512")
    assert_one_line_error(compare(str(sweep)), "1 path(s) and 0 --point")


@needs_traces
def test_the_report_explains_the_gpu_series_and_sets_two_sweeps_side_by_side(tmp_path):
    make_sweep(tmp_path / "eager")
    make_sweep(tmp_path / "graph")
    expected = compared(str(tmp_path / "eager"), "--point", "gpus=1", "--point", "gpus=2")["explanation"]
    r = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "eager"), str(tmp_path / "graph"),
                        "--report", "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Why the step changes with the GPU count" in page and "fraction 1, batch 512: 1 -&gt; 2 GPUs" in page
    assert f"most of it is {expected['term']}".replace("'", "&#x27;") in page
    assert "eager (a) against graph (b), point by point" in page and page.count("no difference") == 2
    assert "eager (a) against graph (b), point by point:" in r.stdout
    assert_one_line_error(
        subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "eager"), str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=REPO),
        "is not a sweep directory")


@needs_traces
def test_the_benchmarks_big_trace_is_the_same_run_laid_end_to_end(tmp_path):
    """analysis/bench/bigtrace.py (the benchmark's million-event trace): N copies read as N times the steps,
    kernels and device time of one, every correlation id unique, the copies one after another."""
    from analysis.bench.bigtrace import build

    source = TRACES / "hta_single/nccl_data.json.gz"
    size = build(source, 3, tmp_path / "three.json")
    one, three = analyze_trace(source), analyze_trace(tmp_path / "three.json")
    events = json.loads((tmp_path / "three.json").read_text())["traceEvents"]
    assert size["events"] == len(events) and three.events == len(events)
    assert three.steps == 3 * one.steps and three.kernel_calls == 3 * one.kernel_calls
    assert three.cuda_time_us == pytest.approx(3 * one.cuda_time_us)
    assert sorted(three.step_numbers) == sorted(n + k * 1000 for n in one.step_numbers for k in range(3))
    kernels = [e["args"]["correlation"] for e in events if e.get("cat") == "kernel"]
    assert len(set(kernels)) == len(kernels) == three.kernel_calls
    assert three.cpu_span_us > 3 * one.cpu_span_us  # one after another, a millisecond apart
    assert {type(e["ts"]) for e in events if "ts" in e} == {float}  # nccl_data writes its times as decimals

    integer_times = TRACES / "hta/trace_filter_2rank/sampled_rank-0.json.gz"  # a source whose times are integers
    build(integer_times, 2, tmp_path / "two.json")
    two = json.loads((tmp_path / "two.json").read_text())["traceEvents"]
    assert {type(e["ts"]) for e in two if "ts" in e} == {int}  # shifted, still written as integers
