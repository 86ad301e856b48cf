"""hpc/core/cli.py and the run directory's readers: one-line usage errors, values cut, names checked."""

import json

import pytest

from hpc.core.cli import Parser, check_name, one_line, shown
from hpc.core.errors import UsageError
from hpc.core.rundir import (
    INDEX_SCHEMA,
    IndexPoint,
    SweepIndexFile,
    SweepPaths,
    read_index,
    read_sweep_index,
    write_index,
)
from hpc.core.summary import read_summary


def test_summary_and_index_readers(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"world_size": 2, "ranks": [{"rank": 0}, {"rank": "x"}]}))
    warned: list[str] = []
    assert read_summary(tmp_path / "summary.json", warned.append) is None  # decoded whole, or refused in a line
    assert len(warned) == 1 and "ranks[1].rank 'x': Expected `int`, got `str`" in warned[0]
    (tmp_path / "summary.json").write_text(json.dumps({"world_size": 2, "ranks": [{"rank": 0}, {"rank": 1}]}))
    assert [r.rank for r in read_summary(tmp_path / "summary.json").ranks] == [0, 1]
    (tmp_path / "index.json").write_text(json.dumps({"points": [
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "a"},
        {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "/etc"}]}))
    assert [p.run_dir for p in read_index(tmp_path / "index.json")] == ["a"]
    assert read_sweep_index(tmp_path / "index.json").replicas is None  # a header that names no replica axis


@pytest.mark.parametrize(("sweep", "replicas"), [({"replicas": "train.seed"}, "train.seed"), ({"replicas": 3}, None),
                                                 ("not a mapping", None), (None, None)])
def test_the_index_is_read_once_for_its_points_and_its_replica_axis(tmp_path, sweep, replicas):
    point = {"data_fraction": 1, "batch_size": 8, "gpus": 1, "run_dir": "a", "values": {"train.seed": 1}}
    (tmp_path / "index.json").write_text(json.dumps({"sweep": sweep, "points": [point]}))
    index = read_sweep_index(tmp_path / "index.json")
    assert index.replicas == replicas and [p.run_dir for p in index.points] == ["a"]


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


@pytest.mark.parametrize(("schema", "read"), [(None, True), (1, True), (2, False), ("1", False), (True, False)])
def test_an_index_of_another_layout_is_refused_in_one_line(tmp_path, schema, read):
    point = {"data_fraction": 0.5, "batch_size": 8, "gpus": 2, "run_dir": "a", "job_id": 7, "node_share": 0.5}
    header = {} if schema is None else {"schema": schema}  # none: written before the field was added
    (tmp_path / "index.json").write_text(json.dumps({**header, "points": [point]}))
    warned: list[str] = []
    points = read_index(tmp_path / "index.json", warned.append)
    if read:
        assert [(p.run_dir, p.data_fraction, p.nodes, p.job, p.node_share) for p in points] == [("a", 0.5, 1, "7", 0.5)]
        assert warned == []
    else:
        assert points == [] and len(warned) == 1 and f"schema {schema!r}" in warned[0] and "reads schema 1" in warned[0]


def test_the_index_written_says_its_layout(tmp_path):
    point = IndexPoint(data_fraction=1, batch_size=8, gpus=1, job_id="3", run_dir="3")
    write_index(SweepPaths(tmp_path), SweepIndexFile(cluster="x", schema=7), [point])
    written = json.loads((tmp_path / "index.json").read_text())
    assert (written["schema"], written["cluster"]) == (INDEX_SCHEMA, "x") and INDEX_SCHEMA == 1
    assert [p.job for p in read_index(tmp_path / "index.json")] == ["3"]


@pytest.mark.parametrize(("body", "said"), [
    ({"step": 4, "stop_at": 8}, None),  # written before the field: the first layout
    ({"step": 4, "stop_at": 8, "schema": 1, "sha256": "ab", "epoch": 1}, None),
    ({"step": 4, "stop_at": 8, "schema": 2}, "schema 2, and this toolkit reads schema 1"),
    ({"step": -1, "stop_at": 8}, "step '-1': Expected `int` >= 0"),
    ({"step": 4}, "missing required field `stop_at`"),
    ([4, 8], "Expected `object`, got `array`"),
])
def test_the_checkpoints_info_is_decoded_or_refused_in_one_line(tmp_path, body, said):
    from hpc.core.rundir import CheckpointInfo, RunPaths, read_checkpoint_info, write_checkpoint_info

    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    paths.checkpoint_info.write_text(json.dumps(body))
    warned: list[str] = []
    info = read_checkpoint_info(paths, warned.append)
    if said is None:
        assert info is not None and (info.step, info.stop_at, info.complete) == (4, 8, None) and warned == []
        write_checkpoint_info(paths, CheckpointInfo(step=6, stop_at=8, complete=False, size=10, written_unix=1.5))
        written = json.loads(paths.checkpoint_info.read_text())
        assert (written["schema"], written["bytes"], written["time"]) == (1, 10, 1.5)  # the file's own names
        assert read_checkpoint_info(paths) == CheckpointInfo(step=6, stop_at=8, complete=False, size=10, written_unix=1.5)
    else:
        assert info is None and len(warned) == 1 and said in warned[0], warned


def test_study_json_lists_each_analysis_job_and_begins_again_over_one_it_cannot_read(tmp_path):
    from hpc.core.rundir import record_analysis_job

    sweep = SweepPaths(tmp_path)
    record_analysis_job(sweep, "5")
    record_analysis_job(sweep, "6")
    assert json.loads(sweep.study.read_text()) == {"analysis_jobs": ["5", "6"], "schema": 1}
    for unreadable in ('{"analysis_jobs": "5"}', '{"analysis_jobs": ["5"], "schema": 2}', '{"analysis'):
        sweep.study.write_text(unreadable)
        record_analysis_job(sweep, "7")
        assert json.loads(sweep.study.read_text())["analysis_jobs"] == ["7"]
