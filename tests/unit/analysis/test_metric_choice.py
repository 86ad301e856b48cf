"""The best point by the script's own metric, against the spread between its replicas (issue 88;
analysis/explain/metric.py's METRIC_RULE): the margin at, just under and just over the largest difference
between two replicas of a point, one replica a point, max against min, and nothing logged."""

import pytest

from analysis.explain.metric import best_line, chosen, metric_rows, missing_line
from analysis.records import MetricSummary, RunRow


def row(lr, seed, final, name="val_loss", wanted=None, mode=None, best=None):
    said = MetricSummary(final=final, last_step=10, lowest=min(final, best or final), highest=max(final, best or final),
                         points=3, source="tb")
    return RunRow(run_dir=f"r{lr}{seed}", swept=f"lr={lr}, seed={seed}", series=f"lr={lr}", replica=f"seed={seed}",
                  values={"lr": lr, "seed": seed}, metrics={name: said} if name else None, metric_wanted=wanted,
                  metric_mode=mode, data_fraction=1.0, batch_size_per_gpu=128, gpus=1, nodes=1)


# Values a float holds exactly (sums of powers of two), so that "at the edge" is exact.
@pytest.mark.parametrize("second, said", [
    (1.75 - 2**-20, "within the noise"),  # a margin just under the 0.5 between lr=0.1's seeds
    (1.75, "within the noise"),  # at it: not larger
    (1.75 + 2**-20, "beyond the noise"),  # just over
])
def test_the_margin_is_beyond_the_noise_only_when_larger_than_the_largest_replica_range(second, said):
    rows = [row(0.1, 1, 1.0), row(0.1, 2, 1.5), row(0.01, 1, second), row(0.01, 2, second)]
    choice = chosen(rows)
    line = best_line(rows, choice)
    assert line.startswith("best val_loss: lr=0.1, 1.25 (final, mean of 2 replicas); ") and said in line, line
    assert "than the second, lr=0.01" in line and "differ by up to 0.5" in line


def test_one_replica_a_point_says_the_noise_is_not_measured_and_max_picks_the_highest():
    rows = [row(0.1, 1, 0.7, name="val_acc"), row(0.01, 1, 0.9, name="val_acc")]
    choice = chosen(rows)
    assert (choice.name, choice.mode) == ("val_acc", "max")
    line = best_line(rows, choice)
    assert line.startswith("best val_acc: lr=0.01, 0.9 (final); 0.2 higher than the second, lr=0.1 (0.7)"), line
    assert "the noise is not measured" in line


def test_the_table_is_each_points_final_and_best_over_its_replicas_without_settings_it_never_varied():
    rows = [row(0.1, 1, 1.2, best=1.1), row(0.1, 2, 1.4, best=1.0), row(0.01, 1, 2.0)]
    table = metric_rows(rows, chosen(rows))
    assert [(t["point"], t["replicas"], round(t["final"], 6), round(t["best"], 6)) for t in table] == [
        ("lr=0.1", 2, 1.3, 1.05), ("lr=0.01", 1, 2.0, 2.0)]
    assert table[1]["final_sd"] is None and best_line(rows[:2], chosen(rows)) is None  # one point: no best


def test_a_sweep_set_to_a_metric_no_run_logged_says_so_and_so_does_one_with_none():
    rows = [row(0.1, 1, 1.0, wanted="bleu"), row(0.01, 1, 2.0, wanted="bleu")]
    assert chosen(rows) is None
    assert missing_line(rows, None) == "no run logged bleu (sweep.metric); found: val_loss"
    bare = [row(0.1, 1, 1.0, name=None)]
    assert missing_line(bare, chosen(bare)).startswith("no run logged a metric the report can read")
    partly = [row(0.1, 1, 1.0), row(0.01, 1, 2.0, name=None)]
    assert missing_line(partly, chosen(partly)) == "1 of 2 point(s) logged no val_loss"


@pytest.mark.parametrize("ys, from_0", [
    ([0.6729, 0.6723], True),  # issue 88's memory figure: 0.1% apart, drawn as a gap
    ([100.0, 95.0], True),  # 5% apart: at the edge, still from 0
    ([100.0, 94.9], False),  # just over: the difference is the figure's subject
    ([-1.0, -1.01], False),  # not a quantity from 0
])
def test_values_within_five_percent_of_their_largest_are_drawn_from_zero(ys, from_0):
    from analysis.report.figures import from_zero, pyplot

    fig, ax = pyplot().subplots()
    ax.plot([1, 2], ys)
    before = ax.get_ylim()
    from_zero(ax, ys)
    assert (ax.get_ylim()[0] == 0) == from_0 and (ax.get_ylim() != before) == from_0
    pyplot().close(fig)


def test_a_sentence_every_point_says_is_said_once_on_the_page_and_one_most_say_is_kept_per_point():
    from analysis.report.html import said_once

    same = "CPU ranks: no GPU to judge"
    lines = [("lr=0.1", same), ("lr=0.1, scaling", "x"), ("lr=0.01", same), ("lr=0.2", same)]
    assert said_once(lines, 3) == [("every point (3)", same), ("lr=0.1, scaling", "x")]
    assert said_once(lines, 4) == lines  # one point says it not: each says its own
    assert said_once(lines[:1], 1) == lines[:1]
