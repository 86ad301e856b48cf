"""Replicas of a point (sweep.replicas: a seed) folded into a mean and a spread, and whether a difference between
two points is beyond that run-to-run noise (analysis/explain/replicas.py, issue 75). The oracle is the rule as
the report states it, applied by hand to numbers written out here."""

import dataclasses
import statistics

import pytest

from analysis.explain.replicas import MIN_REPLICAS, judge, noise_lines, replica_rows
from analysis.records import RunRow, Spread
from analysis.runs.sweep import swept_words
from hpc.core.errors import ConfigError
from hpc.settings.config import Layers


def row(lr, seed, images_per_s, step_ms=10.0, batch=8):
    return RunRow(run_dir=f"{lr}-{seed}", data_fraction=1.0, batch_size_per_gpu=batch, gpus=1, nodes=1,
                  images_per_s=images_per_s, step_time_us_mean=Spread(mean=step_ms * 1e3, max=step_ms * 1e3),
                  **swept_words({"lr": lr, "seed": seed}, "seed"))


def test_a_points_words_name_its_series_without_its_replica():
    assert swept_words({"lr": 0.1, "seed": 2}, "seed") == {"values": {"lr": 0.1, "seed": 2}, "swept": "lr=0.1, seed=2",
                                                            "series": "lr=0.1", "replica": "seed=2"}
    assert swept_words({"lr": 0.1}, None) == {"values": {"lr": 0.1}, "swept": "lr=0.1", "series": "lr=0.1",
                                              "replica": None}
    assert swept_words({}, None) == {"values": None, "swept": None, "series": None, "replica": None}


@pytest.mark.parametrize("a, b, said", [
    ([10, 11, 12], [13, 14, 15], "beyond"),  # apart, 3 each
    ([10, 11, 13], [13, 14, 15], "within"),  # touching at 13: overlap
    ([10, 11], [13, 14, 15], "too few"),  # apart, but 2 on one side
    ([10, 11, 12, 12.5], [9, 9.5, 9.9], "beyond"),
    ([10], [10], "within"),
])
def test_the_noise_rule_at_its_edges(a, b, said):
    assert judge(a, b) == judge(b, a) == said


def test_the_minimum_is_three_replicas():
    assert MIN_REPLICAS == 3  # the report's sentence says 3: the rule and its words must move together


def test_each_point_is_its_replicas_mean_and_spread_and_two_series_are_judged_apart_or_not():
    fast = [row(0.1, s, v, step_ms=m) for s, v, m in ((1, 100.0, 10.0), (2, 102.0, 10.5), (3, 104.0, 11.0))]
    slow = [row(0.01, s, v, step_ms=m) for s, v, m in ((1, 90.0, 10.2), (2, 91.0, 10.9), (3, 92.0, 11.4))]
    table = {r["series"]: r for r in replica_rows([*fast, *slow])}
    assert table["lr=0.1"]["replicas"] == 3 and table["lr=0.1"]["images_per_s_mean"] == pytest.approx(102.0)
    assert table["lr=0.1"]["images_per_s_sd"] == pytest.approx(statistics.stdev([100.0, 102.0, 104.0]))
    assert table["lr=0.01"]["step_time_ms_mean"] == pytest.approx((10.2 + 10.9 + 11.4) / 3)
    lines = noise_lines([*fast, *slow])
    assert len(lines) == 2 and all(line.startswith("fraction 1, batch 8, 1 rank(s): lr=0.01 against lr=0.1: ")
                                   for line in lines)
    images, steps = lines
    assert "images/s 91 +- 1 (3 replicas) against 102 +- 2 (3 replicas): beyond the run-to-run noise" in images
    assert "step time (ms) 10.83 +- 0.60 (3 replicas) against 10.50 +- 0.50 (3 replicas): within" in steps


def test_a_sweep_without_replicas_has_no_replica_table():
    plain = [RunRow(run_dir=str(i), data_fraction=1.0, batch_size_per_gpu=8, gpus=1, images_per_s=float(i),
                    swept=f"lr={i}", series=f"lr={i}") for i in (1, 2)]
    assert replica_rows(plain) == [] and noise_lines(plain) == []


def test_the_replica_axis_must_be_one_of_the_axes():
    layers = Layers().set("sweep.axes", {"lr": [1, 2], "seed": [1, 2]}, "s.yaml").set("sweep.replicas", "sed", "s.yaml")
    with pytest.raises(ConfigError) as e:
        layers.build("sweep")
    assert str(e.value) == "s.yaml: sweep.replicas = 'sed': must name one of sweep.axes"
    assert layers.set("sweep.replicas", "seed", "s.yaml").build("sweep").replicas == "seed"


def test_a_sweeps_figures_are_drawn_against_each_swept_key_but_its_replicas(tmp_path):
    from analysis.report.figures import plot_sweep, swept_keys

    def point(lr, arch, seed):
        return RunRow(run_dir=f"{lr}-{arch}-{seed}", data_fraction=1.0, batch_size_per_gpu=8, gpus=1, nodes=1,
                      images_per_s=100.0 * lr + seed, step_time_us_mean=Spread(mean=1e4, max=1e4 + seed),
                      **swept_words({"train.lr": lr, "model.arch": arch, "seed": seed, "one": "x"}, "seed"))

    rows = [point(lr, arch, seed) for lr in (0.1, 0.01) for arch in ("tiny", "resnet18") for seed in (1, 2, 3)]
    assert swept_keys(rows) == ["train.lr", "model.arch"]  # not the replicas (seed), not a key of one value
    written = {p.name for p in plot_sweep(rows, tmp_path)}
    assert {"by_train_lr_step_time.png", "by_train_lr_images_per_s.png", "by_model_arch_step_time.png",
            "by_model_arch_images_per_s.png"} <= written
    assert not any(name.startswith(("by_seed", "by_one")) for name in written)


def test_a_run_without_a_batch_size_is_left_off_the_figures_against_batch_size(tmp_path):
    """A run whose summary has no batch size (a damaged record, an OOM record without one) has no place
    on a batch-size axis: its neighbours' figure is drawn without it, and no TypeError (None against an
    int in sorting the axis, seen before 2026-11-30)."""
    from analysis.report.figures import plot_sweep

    def run(name, batch, outcome="done"):
        return RunRow(run_dir=name, data_fraction=0.1, batch_size_per_gpu=batch, gpus=1, nodes=1, outcome=outcome,
                      cpu_time_us_per_epoch=Spread(mean=5e6, max=5e6))

    written = {p.name for p in plot_sweep([run("a", None), run("b", 32), run("c", 64), run("d", None, "oom")], tmp_path)}
    assert "fig01_cpu_runtime_fraction0.1.png" in written, written
    assert not {p.name for p in plot_sweep([run("a", None)], tmp_path / "alone")}


def test_a_point_of_two_replicas_or_one_is_said_so_and_a_measure_a_script_lacks_is_left_out():
    """Scripts report no images/s: the step time is still judged. Two replicas a side are too few to tell;
    one has no spread to show. The study point names its nodes where it has several."""
    def script(lr, seed, step_ms, nodes=2):
        return dataclasses.replace(row(lr, seed, None, step_ms=step_ms), nodes=nodes)

    two = [script(0.1, 1, 10.0), script(0.1, 2, 10.2), script(0.01, 1, 20.0), script(0.01, 2, 20.5)]
    (line,) = noise_lines(two)
    assert line == ("fraction 1, batch 8, 1 rank(s) x 2 nodes: lr=0.01 against lr=0.1: step time (ms) 20.25 +- 0.35 "
                    "(2 replicas) against 10.10 +- 0.14 (2 replicas): not to be told from noise: fewer than 3 "
                    "replicas a point")
    (one,) = noise_lines([script(0.1, 1, 10.0, nodes=1), script(0.01, 1, 20.0, nodes=1)])
    assert "step time (ms) 20.00 (1 replicas) against 10.00 (1 replicas): within" not in one  # apart, and 1 each
    assert one.endswith("20.00 (1 replicas) against 10.00 (1 replicas): not to be told from noise: fewer than 3 "
                        "replicas a point") and one.startswith("fraction 1, batch 8, 1 rank(s): ")
    table = replica_rows([script(0.1, 1, 10.0), script(0.1, 2, 12.0)])
    assert table == [{"point": "fraction 1, batch 8, 1 rank(s) x 2 nodes", "series": "lr=0.1", "replicas": 2,
                      "step_time_ms_mean": 11.0, "step_time_ms_sd": pytest.approx(statistics.stdev([10.0, 12.0]))}]
    seeds_only = RunRow(run_dir="s", data_fraction=1.0, batch_size_per_gpu=8, gpus=1, images_per_s=1.0,
                        **swept_words({"seed": 1}, "seed"))
    ((only,),) = [replica_rows([seeds_only])]
    assert (only["series"], only["images_per_s_sd"]) == ("-", None) and noise_lines([seeds_only]) == []


def test_a_measure_only_one_side_has_is_not_judged_and_a_row_without_nodes_is_on_one():
    a = [dataclasses.replace(row(0.1, s, 100.0 + s), nodes=None) for s in (1, 2, 3)]
    b = [dataclasses.replace(row(0.01, s, None), nodes=None) for s in (1, 2, 3)]  # no images/s on this side
    lines = noise_lines([*a, *b])
    assert len(lines) == 1 and lines[0].startswith("fraction 1, batch 8, 1 rank(s): lr=0.01 against lr=0.1: step ")
