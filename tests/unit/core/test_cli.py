"""hpc/core/cli.py and the run directory's readers: one-line usage errors, values cut, names checked."""

import json

import pytest

from hpc.core.cli import Parser, check_name, one_line, shown
from hpc.core.errors import UsageError
from hpc.core.rundir import read_index, read_sweep_index
from hpc.core.summary import read_summary


def test_summary_and_index_readers(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"world_size": 2, "ranks": [{"rank": 0}, {"rank": "x"}]}))
    assert [r["rank"] for r in read_summary(tmp_path / "summary.json")["ranks"]] == [0]
    (tmp_path / "index.json").write_text(json.dumps({"points": [
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "a"},
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "/etc"}]}))
    assert [p["run_dir"] for p in read_index(tmp_path / "index.json")] == ["a"]
    assert read_sweep_index(tmp_path / "index.json").replicas is None  # a header that names no replica axis


@pytest.mark.parametrize(("sweep", "replicas"), [({"replicas": "train.seed"}, "train.seed"), ({"replicas": 3}, None),
                                                 ("not a mapping", None), (None, None)])
def test_the_index_is_read_once_for_its_points_and_its_replica_axis(tmp_path, sweep, replicas):
    point = {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "a", "values": {"train.seed": 1}}
    (tmp_path / "index.json").write_text(json.dumps({"sweep": sweep, "points": [point]}))
    index = read_sweep_index(tmp_path / "index.json")
    assert index.replicas == replicas and [p["run_dir"] for p in index.points] == ["a"]


def test_parser_errors_are_one_line_usage_errors():
    parser = Parser(prog="x")
    parser.add_argument("--n", type=int)
    parser.add_argument("--name")
    with pytest.raises(UsageError, match=r"command line: argument --n: invalid int value: 'a'"):
        parser.parse_args(["--n", "a"])
    with pytest.raises(UsageError, match=r"--name '': must not be empty"):
        parser.parse_args(["--name", ""])
    assert parser.parse_args(["--n", "3"]).n == 3


def test_values_and_messages_are_cut():
    bomb = ["x"] * 10
    for _ in range(8):
        bomb = [bomb] * 10
    assert len(shown(bomb)) <= 120 and len(shown("y" * 10**6)) <= 120
    assert one_line("a\nb\tc") == "a b c" and len(one_line("z" * 10**5)) <= 600


@pytest.mark.parametrize("name", ["", "a/b", "..", "-x", "a\nb", "n" * 201])
def test_check_name_refuses(name):
    with pytest.raises(UsageError):
        check_name(name, "--name")


def test_check_name_accepts_a_hostile_but_valid_name():
    check_name("we ird'\"$(touch x);`y`", "--name")
