"""tests/gpu/study_targets.py on literal rows: which rows pair up (same point, same launcher), the ratios
worked out by hand, and each target met, missed or not set as issue 54 states them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from study_targets import comparisons, markdown  # noqa: E402


def row(side, fraction, batch, whole, epochs, launcher="torchrun", rc=0):
    return {"side": side, "launcher": launcher, "fraction": fraction, "batch": batch, "whole_s": whole,
            "epoch_s": epochs, "rc": rc}


ROWS = [
    row("script", "1/2", 128, 40.0, [12.0, 11.0, 10.0]),
    row("toolkit", "1/2", 128, 16.0, [6.0, 2.5, 2.0]),  # whole 0.4 <= 0.5 met; last 10/2 = 5 >= 5 met
    row("toolkit", "1/2", 128, 14.0, [5.0, 2.5, 2.5], launcher="submit"),  # no script under submit: unpaired
    row("script", "1/2", 1024, 20.0, [3.0, 3.0, 3.0]),
    row("toolkit", "1/2", 1024, 22.0, [4.0, 1.5, 1.2]),  # whole 1.1 > 1 missed; last 2.5 < 3 missed
    row("script", "1/10", 2048, 15.0, [1.0, 0.6, 0.6]),
    row("toolkit", "1/10", 2048, 12.0, [3.0, 0.3, 0.3], rc=1),  # failed: nothing to compare
    row("script", "1", 512, 30.0, [5.0]),
    row("toolkit", "1", 512, 24.0, [4.0]),  # no target at 512
]


def test_pairs_ratios_and_targets_as_the_issue_states_them():
    got = {(c["fraction"], c["batch"]): c for c in comparisons(ROWS)}
    assert sorted(got) == [("1", 512), ("1/10", 2048), ("1/2", 128), ("1/2", 1024)]
    c = got[("1/2", 128)]
    assert c["whole_ratio"] == pytest.approx(0.4) and c["last_epoch_speedup"] == pytest.approx(5.0)
    assert (c["whole_ratio_max"], c["whole_met"], c["last_epoch_speedup_min"], c["last_epoch_met"]) == (0.5, True, 5.0, True)
    c = got[("1/2", 1024)]
    assert c["whole_ratio"] == pytest.approx(1.1) and c["last_epoch_speedup"] == pytest.approx(2.5)
    assert (c["whole_ratio_max"], c["whole_met"], c["last_epoch_speedup_min"], c["last_epoch_met"]) == (1.0, False, 3.0, False)
    c = got[("1/10", 2048)]
    assert c["whole_ratio"] is None and c["whole_met"] is None and c["whole_ratio_max"] == 1.0
    assert c["last_epoch_speedup_min"] is None and c["last_epoch_met"] is None  # no last-epoch target at 2048
    c = got[("1", 512)]
    assert c["whole_ratio"] == pytest.approx(0.8) and c["whole_ratio_max"] is None and c["whole_met"] is None


def test_the_table_states_every_row_and_each_target():
    doc = {"device": "NVIDIA H100", "torch": "2.11", "epochs": 3, "workers": 8, "mode": "auto", "rows": ROWS,
           "comparisons": comparisons(ROWS)}
    text = markdown(doc)
    assert text.count("\n| 1") == len(ROWS) + 4  # a line per row, then per comparison
    assert "| 1/2 | 128 | torchrun | 0.40 <= 0.5: **met** | 5.00 >= 5: **met** |" in text
    assert "| 1/2 | 1024 | torchrun | 1.10 <= 1: **missed** | 2.50 >= 3: **missed** |" in text
    assert "| 1/10 | 2048 | torchrun | - <= 1: not measured | - (no target) |" in text
    assert "| 1/10 | 2048 | toolkit | torchrun | 12.0 | - | 3.00, 0.30, 0.30 | 1 |" in text
