"""`analysis compare SWEEP --point ...` chooses a point by the study's axes and by the sweep's own (issue 75)."""

import json

import pytest

from analysis.compare import point_dir
from hpc.core.errors import UsageError


@pytest.fixture
def sweep(tmp_path):
    study = {"data_fraction": 1.0, "batch_size": 8, "gpus": 1, "nodes": 1}
    points = [{**study, "run_dir": f"p{i}", "values": {"lr": lr, "seed": seed, "graph": graph}}
              for i, (lr, seed, graph) in enumerate([(0.1, 1, True), (0.1, 2, True), (0.01, 1, False)])]
    (tmp_path / "index.json").write_text(json.dumps({"points": points}))
    return tmp_path


@pytest.mark.parametrize("spec, run", [
    ("lr=0.1,seed=2", "p1"), ("lr=0.10,seed=1", "p0"), ("batch=8,lr=0.01", "p2"), ("graph=false", "p2"),
    ("seed=2", "p1"),
])
def test_a_point_by_its_swept_values(sweep, spec, run):
    assert point_dir(sweep, spec) == sweep / run


@pytest.mark.parametrize("spec, said", [
    ("lr=0.1", "2 points (add an axis)"), ("lr=0.5", "no point"), ("graph=1", "no point"),
    ("lrr=0.1", "'lrr=0.1' is not AXIS=VALUE with an axis of ['batch', 'batch_size', 'data_fraction', 'fraction', "
                "'gpus', 'graph', 'lr', 'nodes', 'seed']"),
])
def test_a_point_that_is_not_one_is_one_line(sweep, spec, said):
    with pytest.raises(UsageError) as e:
        point_dir(sweep, spec)
    assert said in str(e.value)
