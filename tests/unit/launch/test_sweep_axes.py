"""Axes of any kind (issue 75): a config key of the training or a placeholder a command uses, from sweep.yaml's
sweep.axes or --axis, as a grid or zipped; every point checked before anything is submitted; the index, the
status and the analysis keyed by the swept values. The oracles: the points a user listed, written out by hand."""

import json
from pathlib import Path

import commands
import msgspec
import pytest
import yaml

from hpc.core.errors import ConfigError, UsageError
from hpc.core.rundir import IndexPoint, SweepIndexFile, SweepPaths, point_key, read_index, write_index
from hpc.settings.config import Layers
from hpc.settings.rankcommand import fill_named, words_for

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "tests" / "scripts" / "torchrun_ddp.py")
ONE = "sweep:\n  name: s\n  batch_sizes: [8]\n  gpus: [1]\n  data_fractions: [1]\n"


def points_of(tmp_path, sweep_text, *argv):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(sweep_text)
    plan = commands.plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), *argv])
    return plan, [(p, c) for spec in plan.specs for p, c in spec.points]


def refusal(tmp_path, sweep_text, *argv) -> str:
    with pytest.raises((UsageError, ConfigError)) as e:
        points_of(tmp_path, sweep_text, *argv)
    return str(e.value)


def test_a_scripts_lr_and_seed_from_the_file_and_the_command_line_fill_the_words_after_the_double_dash(tmp_path):
    plan, points = points_of(tmp_path, ONE + "  axes:\n    lr: [0.1, 0.01]\n", "--axis", "seed=1,2", "--",
                             "python", SCRIPT, "--lr", "{lr}", "--out", "w{seed:03d}.pt", "--json", "{}")
    got = sorted((c.words[3], c.words[5], p.values["lr"], p.values["seed"]) for p, c in points)
    assert got == [("0.01", "w001.pt", 0.01, 1), ("0.01", "w002.pt", 0.01, 2),
                   ("0.1", "w001.pt", 0.1, 1), ("0.1", "w002.pt", 0.1, 2)]
    # a brace that names no axis is the command's own (a JSON argument, Python code): left as written
    assert all(words_for(c, Path("/r"), "py")[-1] == "{}" for _, c in points)
    assert plan.sweep_file["command"]["run"][3] == "{lr}"  # recorded as a template: resubmit fills it again
    assert plan.sweep_file["sweep"]["axes"] == {"lr": (0.1, 0.01), "seed": (1, 2)}


def test_zipped_axes_pair_their_values_instead_of_crossing_them(tmp_path):
    _, points = points_of(tmp_path, ONE + "  combine: zip\n  axes:\n    lr: [0.1, 0.2, 0.4]\n    seed: [1, 2, 3]\n",
                          "--", "python", SCRIPT, "{lr}", "{seed}")
    assert sorted(p.values["lr"] for p, _ in points) == [0.1, 0.2, 0.4]
    assert {(p.values["lr"], p.values["seed"]) for p, _ in points} == {(0.1, 1), (0.2, 2), (0.4, 3)}
    said = refusal(tmp_path, ONE + "  combine: zip\n  axes:\n    lr: [0.1, 0.2]\n    seed: [1, 2, 3]\n",
                   "--", "python", SCRIPT, "{lr}", "{seed}")
    assert "combine: zip takes lists of one length" in said


@pytest.mark.parametrize("combine", ["", "  combine: zip\n"])
def test_a_sweep_without_axes_of_its_own_has_its_shapes_points_zipped_or_not(tmp_path, combine):
    """Issue 90: `combine: zip` with no axes gave no point at all (zip of nothing), and the job array was empty."""
    text = "sweep:\n  name: s\n  batch_sizes: [8, 16]\n  gpus: [1]\n  data_fractions: [1]\n" + combine
    _, points = points_of(tmp_path, text, "--", "python", SCRIPT, "--batch-size", "{batch}")
    assert sorted(p.batch_size for p, _ in points) == [8, 16] and all(not p.values for p, _ in points)


def test_a_command_that_never_uses_batch_runs_once_a_point_not_once_a_default_batch_size(tmp_path):
    """The study's default batch sizes are several; a command without {batch} runs each lr once."""
    from hpc.settings.schema import SweepConfig

    assert len(SweepConfig().batch_sizes) > 1  # else this test proves nothing
    _, points = points_of(tmp_path, "sweep:\n  name: s\n  gpus: [1]\n  data_fractions: [1]\n  axes:\n"
                          "    lr: [0.1, 0.2]\n", "--", "python", SCRIPT, "--lr", "{lr}")
    assert sorted(p.values["lr"] for p, _ in points) == [0.1, 0.2]


def test_the_trainings_config_keys_are_its_axes_and_each_point_runs_its_values(tmp_path):
    _, points = points_of(tmp_path, ONE + "  axes:\n    train.lr: [0.1, 0.01]\n    model.arch: [tiny, resnet18]\n")
    runs = sorted((c.config["train"]["lr"], c.config["model"]["arch"]) for _, c in points)
    assert runs == [(0.01, "resnet18"), (0.01, "tiny"), (0.1, "resnet18"), (0.1, "tiny")]
    assert all(set(p.values) == {"train.lr", "model.arch"} for p, _ in points)


@pytest.mark.parametrize("axes, argv, needle", [
    ("train.lrr: [0.1]", [], "sweep point train.lrr=0.1: unknown key train.lrr"),
    ("train.lr: [fast]", [], "sweep point train.lr=fast: train.lr = 'fast': expected a number"),
    ("model.arch: [resnet9]", [], "model.arch = 'resnet9': unknown arch"),
    ("lr: [0.1]", [], "sweep.axes.lr: a placeholder fills a command's words; the toolkit's training sweeps its"),
    ("batch: [8, 16]", [], "batch: swept by the study's own list: sweep.batch_sizes"),
    ("train.batch_size: [8]", [], "train.batch_size: swept by the study's own list: sweep.batch_sizes"),
    ("cluster.qos: [debug]", [], "a config key is SECTION.KEY with a section of data, model, train, profiler"),
    ("lr: []", [], "lr: needs at least one value"),
    ("lr: [0.1, 0.1]", [], "a value is listed twice"),
    ("lr: [[0.1]]", [], "each value must be a number, a string or true/false"),
    ("seed: [1, 2]", ["--", "python", SCRIPT, "{lr}"], "sweep.axes.seed: the command never uses {seed}"),
    ("train.lr: [0.1]", ["--", "python", SCRIPT], "sweep.axes.train.lr: a command reads no run config; sweep its"),
])
def test_a_bad_axis_is_one_line_before_anything_is_submitted(tmp_path, axes, argv, needle):
    said = refusal(tmp_path, ONE + f"  axes:\n    {axes}\n", *argv)
    assert needle in said and "\n" not in said
    assert not list(tmp_path.glob("s/sweep-*"))  # nothing written


@pytest.mark.parametrize("text", ["seed", "seed=", "=1,2"])
def test_a_malformed_axis_flag_is_one_line(tmp_path, text):
    said = refusal(tmp_path, ONE, "--axis", text, "--", "python", SCRIPT, "{seed}")
    assert said == f"--axis {text!r}: expected KEY=V1,V2 (e.g. --axis train.lr=0.1,0.01 or --axis seed=1,2,3)"


def test_the_bound_on_points_is_refused_just_over_it_and_named_with_how_to_raise_it(tmp_path):
    grid = ONE + "  max_points: 6\n  axes:\n    lr: [1, 2, 3]\n"
    _, points = points_of(tmp_path, grid, "--axis", "seed=1,2", "--", "python", SCRIPT, "{lr}", "{seed}")
    assert len(points) == 6  # at the bound
    said = refusal(tmp_path, grid, "--axis", "seed=1,2,3", "--", "python", SCRIPT, "{lr}", "{seed}")
    assert "9 points (1 of the study's lists x 9 of sweep.axes) is more than sweep.max_points = 6; set " in said
    just_over = refusal(tmp_path, grid.replace("max_points: 6", "max_points: 5"), "--axis", "seed=1,2", "--",
                        "python", SCRIPT, "{lr}", "{seed}")
    assert "6 points (1 of the study's lists x 6 of sweep.axes) is more than sweep.max_points = 5" in just_over
    assert "sweep.max_points = 1000" in refusal(tmp_path, ONE, "--axis", "seed=" + ",".join(map(str, range(1001))),
                                                "--", "python", SCRIPT, "{seed}")


def test_a_profiler_key_is_an_axis_of_a_command_and_reaches_each_points_hook(tmp_path):
    _, points = points_of(tmp_path, ONE + "  axes:\n    profiler.active: [2, 5]\n", "--", "python", SCRIPT)
    assert sorted(c.profiler["active"] for _, c in points) == [2, 5]


def test_a_sweep_with_axes_planned_again_from_its_recorded_file_is_the_same(tmp_path):
    """What `hpc.study resubmit` does: plan again from sweep.yaml as recorded, the words after -- with it."""
    first, points = points_of(tmp_path, ONE, "--axis", "lr=0.1,0.01", "--", "python", SCRIPT, "--lr", "{lr}")
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(json.loads(json.dumps(first.sweep_file))))
    again = commands.plan_of(tmp_path, ["--dry-run", "--sweep", str(saved)])
    replanned = [(p, msgspec.to_builtins(c)) for spec in again.specs for p, c in spec.points]
    assert replanned == [(p, msgspec.to_builtins(c)) for p, c in points]


def test_fill_named_fills_only_the_names_it_is_given():
    values = {"lr": 0.001, "seed": 7}
    assert fill_named("--lr={lr:.0e}/{seed}", values, "x") == "--lr=1e-03/7"
    assert fill_named("{'a': {lr}} {other} {} {{lr}}", values, "x") == "{'a': 0.001} {other} {} {0.001}"
    assert fill_named("{seed}", {}, "x") == "{seed}"
    with pytest.raises(UsageError) as e:
        fill_named("{seed:q}", values, "sweep point")
    assert str(e.value).startswith("sweep point: '{seed:q}': Unknown format code 'q'")


def test_points_that_differ_only_in_their_values_are_two_points_of_the_index(tmp_path):
    sweep = SweepPaths(tmp_path)
    study = {"data_fraction": 1.0, "batch_size": 8, "gpus": 1, "nodes": 1}
    a, b = {**study, "values": {"lr": 0.1}}, {**study, "values": {"lr": 0.01}}
    assert point_key(a) != point_key(b) and point_key(a) == point_key({**study, "values": {"lr": 0.1}})
    def submitted(point, job):
        return msgspec.convert({**point, "job_id": job, "run_dir": job}, IndexPoint)

    write_index(sweep, SweepIndexFile(), [submitted(a, "1_0"), submitted(b, "1_1")])
    write_index(sweep, SweepIndexFile(), [submitted(b, "2_0")])  # b resubmitted
    write_index(sweep, SweepIndexFile(), [submitted(a, "1_0")])  # the same job again: no history of itself
    rows = read_index(sweep.index)
    assert [(r.values["lr"], r.job_id, r.history) for r in rows] == [(0.1, "1_0", []), (0.01, "2_0", ["1_1"])]
    assert [r.key for r in rows] == [point_key(a), point_key(b)]
    warned: list[str] = []
    sweep.index.write_text(json.dumps({"points": [{**study, "run_dir": "x", "values": {"lr": [1]}}]}))
    assert read_index(sweep.index, warned.append) == [] and "values" in warned[0]


def test_a_sweep_file_axis_reads_as_the_values_it_lists():
    layers = Layers().set("sweep.axes", {"train.lr": [0.1, "1/100"], "flag": [True, False]}, "s.yaml")
    assert layers.build("sweep").axes == {"train.lr": (0.1, "1/100"), "flag": (True, False)}


def test_a_resubmission_plans_exactly_the_points_of_the_values_it_is_given(tmp_path):
    """`hpc.study resubmit --failed`: the failed points' keys (their values among them) and nothing else."""
    from hpc.launch.submission.plan import make_plan
    from hpc.launch.submission.submit import STUDY_RUN, parse_options

    first, points = points_of(tmp_path, ONE, "--axis", "lr=0.1,0.01", "--axis", "seed=1,2", "--",
                              "python", SCRIPT, "--lr", "{lr}", "--seed", "{seed}")
    saved = tmp_path / "sweep-x" / "sweep.yaml"
    saved.parent.mkdir()
    saved.write_text(yaml.safe_dump(json.loads(json.dumps(first.sweep_file))))
    failed = {"data_fraction": 1.0, "batch_size": 8, "gpus": 1, "nodes": 1, "values": {"lr": 0.01, "seed": 2}}
    args = parse_options([str(saved), "--runs-dir", str(tmp_path), "--dry-run"], STUDY_RUN)
    again = make_plan(args, None, into=(saved.parent, {point_key(json.loads(json.dumps(failed)))}))
    ((point, command),) = [pc for spec in again.specs for pc in spec.points]
    assert msgspec.to_builtins(point) == failed and command.words[2:] == ("--lr", "0.01", "--seed", "2")


def test_a_sweep_without_axes_has_points_without_values_and_an_axis_value_may_hold_an_equals_sign(tmp_path):
    _, points = points_of(tmp_path, ONE, "--", "python", SCRIPT)
    assert [msgspec.to_builtins(p) for p, _ in points] == [{"data_fraction": 1.0, "batch_size": 8, "gpus": 1, "nodes": 1}]
    _, points = points_of(tmp_path, ONE, "--axis", "opt=a=1,b=2", "--", "python", SCRIPT, "--set", "{opt}")
    assert sorted(c.words[-1] for _, c in points) == ["a=1", "b=2"]


def test_a_commands_axis_refusals_say_the_way_in_full(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    said = refusal(tmp_path, ONE + "  axes:\n    train.lr: [0.1]\n", "--", "python", SCRIPT)
    assert said == (f"{sweep}: sweep.axes.train.lr: a command reads no run config; sweep its own arguments with a "
                    "placeholder (axes: {lr: [...]} and --lr {lr} in its words), or a profiler key")
    said = refusal(tmp_path, ONE + "  axes:\n    seed: [1]\n", "--", "python", SCRIPT)
    assert said == f"{sweep}: sweep.axes.seed: the command never uses {{seed}}: every point would run the same command"
    # and every axis is looked at, not only the first: a used one first, then one never used
    said = refusal(tmp_path, ONE + "  axes:\n    lr: [1]\n    seed: [1]\n", "--", "python", SCRIPT, "{lr}")
    assert "sweep.axes.seed: the command never uses {seed}" in said


def test_the_trainings_task_is_the_documented_command_with_its_point_config_and_codes(tmp_path, monkeypatch):
    """Each point of the toolkit's training runs `python -m hpc.train --config RUN/submitted.yaml --run-dir RUN`
    (docs/own-script.md, as jobs/resnet152.sbatch runs it), from where it was submitted, requeued on 3 and 5,
    its point and run config recorded."""
    monkeypatch.chdir(tmp_path)
    plan, points = points_of(tmp_path, ONE + "  axes:\n    train.lr: [0.1, 0.01]\n", "--set",
                             "command.hang_timeout_s=120")
    for p, c in points:
        assert words_for(c, Path("/r/7"), "py") == ["py", "-m", "hpc.train", "--config", "/r/7/submitted.yaml",
                                                   "--run-dir", "/r/7"]
        assert (c.cwd, c.name, c.requeue_codes, c.hang_timeout_s) == (str(tmp_path), "resnet152", (3, 5), 120)
        assert c.point == p and c.config["train"]["lr"] == p.values["train.lr"]
    assert plan.specs[0].folder.parts[-3] == "s"  # the sweep's name names its runs' folder
