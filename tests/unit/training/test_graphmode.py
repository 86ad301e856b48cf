"""train.cuda_graph: auto | true | false, resolved before the process group exists (hpc/training/graph/graphmode.py),
on literal configs and NCCL versions: no GPU is needed to decide, only to capture (tests/gpu/test_gpu.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.core.errors import ConfigError, UsageError
from hpc.settings.config import load_run_config
from hpc.training.graph.graphmode import CUDA_GRAPH, MIN_NCCL, capture_in_use, decide_graph_mode, graph_obstacle

NCCL = (2, 28, 9)  # the GPU machine's


def config(*pairs):
    return load_run_config(None, [(key, value, "--set") for key, value in pairs])


def test_default_is_auto_and_graphs_a_cuda_run_with_ddp_over_nccl():
    cfg = config()
    assert cfg.train.cuda_graph == "auto"
    got = decide_graph_mode(cfg, use_cuda=True, nccl=NCCL)
    assert got.on and got.line == "step mode: graph (train.cuda_graph = auto; DDP captured with NCCL 2.28.9)"


@pytest.mark.parametrize(
    ("pairs", "use_cuda", "nccl", "why"),
    [
        ((), False, None, "no CUDA device in use"),
        ((), True, (2, 9, 5), "NCCL 2.9.5 (capturing DDP needs >= 2.9.6)"),
        ((), True, None, "no NCCL (capturing DDP needs >= 2.9.6)"),
        ((("train.grad_accum_steps", 2),), True, NCCL, "train.grad_accum_steps = 2"),
        ((("model.compile", True),), True, NCCL, "model.compile = true"),
        ((("data.loader", "dataloader"),), True, NCCL, "data.loader = 'dataloader' (needs 'device')"),
    ],
)
def test_each_obstacle_makes_auto_eager_with_its_reason_and_true_an_error(pairs, use_cuda, nccl, why):
    auto = decide_graph_mode(config(*pairs), use_cuda, nccl)
    assert not auto.on
    assert auto.line == f"step mode: eager; train.cuda_graph = auto, and a graph does not work with {why}"
    with pytest.raises(UsageError) as err:
        decide_graph_mode(config(*pairs, ("train.cuda_graph", True)), use_cuda, nccl)
    assert str(err.value) == f"train.cuda_graph = true does not work with {why}"


def test_false_is_eager_whatever_the_machine_and_true_graphs_where_it_can():
    assert decide_graph_mode(config(("train.cuda_graph", False)), True, NCCL).line == (
        "step mode: eager (train.cuda_graph = false)"
    )
    on = decide_graph_mode(config(("train.cuda_graph", True)), True, MIN_NCCL)
    assert on.on and "train.cuda_graph = true" in on.line and "NCCL 2.9.6" in on.line


@given(
    accum=st.integers(1, 4),
    compile_=st.booleans(),
    loader=st.sampled_from(["device", "dataloader"]),
    cuda=st.booleans(),
    nccl=st.none() | st.tuples(st.integers(1, 3), st.integers(0, 30), st.integers(0, 20)),
)
def test_auto_graphs_exactly_when_nothing_stands_in_the_way(accum, compile_, loader, cuda, nccl):
    cfg = config(("train.grad_accum_steps", accum), ("model.compile", compile_), ("data.loader", loader))
    expected = cuda and nccl is not None and nccl >= MIN_NCCL and accum == 1 and not compile_ and loader == "device"
    assert decide_graph_mode(cfg, cuda, nccl).on is expected
    assert (graph_obstacle(cfg, cuda, nccl) is None) is expected


@pytest.mark.parametrize("value", ["yes", 1, 0.5, [True]])
def test_a_bad_cuda_graph_value_is_named_with_its_source(value):
    with pytest.raises(ConfigError) as err:
        config(("train.cuda_graph", value))
    assert "train.cuda_graph" in str(err.value) and "--set" in str(err.value)


def test_the_flag_reads_true_false_and_auto(tmp_path):
    from hpc.settings.flags import FLAGS

    read = FLAGS["cuda_graph"][1]
    assert (read("true"), read("False"), read("auto"), read("on")) == (True, False, "auto", "on")
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  cuda_graph: sometimes\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(str(path))
    line = str(err.value)
    assert "\n" not in line and all(
        part in line for part in (str(path), "train.cuda_graph", "sometimes", "must be one of auto, true, false")
    )


def test_another_capture_takes_the_graph_path_only_without_cuda_and_only_where_a_graph_could_run():
    """HPC_GRAPH_CAPTURE (the tests' CPU stand-in): the graph check's CPU tests take the graph path with no
    GPU; on a GPU the real capture runs whatever was named, and every other obstacle still stands."""
    from graphstandin import CAPTURE

    stand_in = decide_graph_mode(config(), use_cuda=False, nccl=None, capture=CAPTURE)
    assert stand_in.on and stand_in.capture is CAPTURE and not stand_in.captures and CAPTURE.name in stand_in.line
    real = decide_graph_mode(config(), use_cuda=True, nccl=NCCL, capture=CAPTURE)
    assert real.on and real.captures and real.capture is CUDA_GRAPH
    assert not decide_graph_mode(config(("train.grad_accum_steps", 2)), False, None, capture=CAPTURE).on
    assert not decide_graph_mode(config(("train.cuda_graph", False)), False, None, capture=CAPTURE).on
    assert not decide_graph_mode(config(), use_cuda=False, nccl=None).on  # CUDA's own, on a CPU: eager


def test_the_stand_in_comes_through_one_seam_and_a_bad_name_is_one_line():
    """Issue 73: the stand-in is the tests' (tests/standins/graphstandin.py), named in HPC_GRAPH_CAPTURE;
    no product module names it. Unset: CUDA's. A name that is no Capture is one line."""
    import graphstandin

    assert capture_in_use({}) is CUDA_GRAPH and capture_in_use({"HPC_GRAPH_CAPTURE": ""}) is CUDA_GRAPH
    assert capture_in_use({"HPC_GRAPH_CAPTURE": "graphstandin:CAPTURE"}) is graphstandin.CAPTURE
    for bad, said in (("nosuchmodule:CAPTURE", "No module named 'nosuchmodule'"), ("graphstandin", "names no Capture"),
                      ("graphstandin:StandInStep", "names no Capture"), ("graphstandin:NOPE", "has no attribute")):
        with pytest.raises(UsageError) as e:
            capture_in_use({"HPC_GRAPH_CAPTURE": bad})
        assert "\n" not in str(e.value) and f"HPC_GRAPH_CAPTURE={bad!r}" in str(e.value) and said in str(e.value)
