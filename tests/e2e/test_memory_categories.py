"""Peak memory by category (profiler.memory_categories, hpc/training/memcat.py) on the CPU: the same
numbers as torch's own `export_memory_timeline`, categories that match what the model holds, a sum that
is the allocator's peak, and the study's figure stacked by category. (On a GPU the same code reads the
CUDA device's timeline; tests/gpu runs it where a session has one.)"""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hpc.training import memcat
from conftest import GRAPH_STANDIN
from trainrun import summary, train

REPO = Path(__file__).resolve().parents[2]
SMOKE = str(REPO / "profiles" / "smoke.yaml")


def small_training(steps: int = 3) -> tuple[torch.profiler.profile, dict[str, int]]:
    """A convnet trained under the memory profiler's settings; what it holds, counted from its own tensors:
    its parameters', their gradients' and the optimizer's state's bytes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 30 * 30, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                profile_memory=True, with_stack=True) as prof:
        for _ in range(steps):
            x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=False)  # gradients live across steps, as the momentum buffers do
            loss.backward()
            opt.step()
    size = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    held = {"parameters": size(model.parameters()), "gradients": size(p.grad for p in model.parameters()),
            "optimizer_state": size(t for state in opt.state.values() for t in state.values() if torch.is_tensor(t))}
    return prof, held


def test_the_categories_are_torchs_own_timeline_at_its_peak(tmp_path):
    prof, held = small_training()
    param_bytes = held["parameters"]
    ours = memcat.at_peak(prof, torch.device("cpu"))
    with warnings.catch_warnings():  # export_memory_timeline is deprecated; it is the reference here
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(tmp_path / "timeline.json"), "cpu")
    times, sizes = json.loads((tmp_path / "timeline.json").read_text())
    totals = [sum(row) for row in sizes]
    i = totals.index(max(totals))
    assert ours["peak_bytes"] == totals[i] and ours["at_us"] == times[i]
    names = memcat.torch_category_names()
    assert ours["torch_categories"] == {n: v for n, v in zip(names, sizes[i], strict=True) if n != "unused"}
    cats = ours["categories"]
    assert sum(cats.values()) == ours["peak_bytes"]
    # what the model holds at the peak, against what its own tensors count (the model's parameters and their
    # .grad, the optimizer's state tensors: SGD's momentum buffers), each once
    assert {k: cats[k] for k in held} == held
    # the sum is the allocator's peak: the trace's CPU `Total Allocated` counts from the profile's start,
    # so the parameters made before it are added back
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    allocated = max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")
    assert ours["peak_bytes"] == pytest.approx(allocated + param_bytes, rel=0.05)


def test_a_run_records_them_and_the_analysis_stacks_them_by_category(tmp_path):
    run = tmp_path / "run"
    train(1, ["--config", SMOKE, "--data-root", str(tmp_path / "data"), "--run-dir", str(run), "--max-steps", "4",
              "--set", "profiler.wait=0", "--set", "profiler.memory_categories=true"])
    cycle = summary(run)["ranks"][0]["profiler"]["cycles"][0]
    found = cycle["memory_categories"]
    assert sum(found["categories"].values()) == found["peak_bytes"] > 0
    assert found["categories"]["parameters"] > 0 and found["categories"]["activations"] > 0
    assert cycle["memory_categories_s"] > 0  # the categories' walk over the profile, timed: it costs something
    r = subprocess.run([sys.executable, "-m", "analysis", str(run), "--plots", "--out", str(tmp_path / "out"),
                        "--format", "json"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    runs = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert runs[0]["peak_mem_by_category"] == found["categories"]
    assert runs[0]["peak_mem_categorised_bytes"] == found["peak_bytes"]
    assert (tmp_path / "out" / "figures" / "peak_memory_by_category_fraction1.png").stat().st_size > 5000


def test_a_torch_that_cannot_say_records_why_and_the_run_goes_on():
    class NoKineto:  # what a profiler without results gives the memory profiler: an AssertionError
        profiler = None
        record_shapes = profile_memory = with_stack = True

        def _memory_profile(self):
            return torch.profiler.profile._memory_profile(self)

    found = memcat.at_peak(NoKineto(), torch.device("cpu"))  # type: ignore[arg-type]
    assert set(found) == {"error"} and "AssertionError" in found["error"]


def test_graph_replays_in_the_window_say_why_there_are_no_categories(tmp_path):
    """On an H200 a graphed cycle's categories were 36 MB of 'other' against 883 MB allocated
    (results/gpu/README.md): a replay allocates nothing the memory profiler sees. The CPU stand-in of
    graph mode (no GPU here) counts its replays in the window the same way; the cycle says why instead."""
    run = tmp_path / "run"
    train(1, ["--config", SMOKE, "--data-root", str(tmp_path / "data"), "--run-dir", str(run), "--max-steps", "6",
              "--cuda-graph", "true", "--set", "profiler.wait=0", "--set", "profiler.warmup=1",
              "--set", "profiler.active=2", "--set", "profiler.memory_categories=true"],
          GRAPH_STANDIN)
    rank = summary(run)["ranks"][0]
    cycle = rank["profiler"]["cycles"][0]
    assert rank["step_mode"] == "graph" and rank["graph_replays"] == 6
    assert cycle["graph_replays"] == 2  # profiler.active: the recorded steps, each a replay
    assert set(cycle["memory_categories"]) == {"error"}
    assert cycle["memory_categories"]["error"].startswith("2 of the window's steps were CUDA graph replays")
