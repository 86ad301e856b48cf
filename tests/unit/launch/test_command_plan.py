"""The plan of a user's command line and of a command sweep (hpc/launch/submission/points.py, plan.py)."""

import os
from pathlib import Path

import msgspec

import commands
import pytest

from hpc.core.errors import UsageError
from hpc.settings.rankcommand import words_for
from hpc.launch.submission.points import split_command

REPO = Path(__file__).resolve().parents[3]


SCRIPT = str(REPO / "tests" / "scripts" / "torchrun_ddp.py")


def plan_of(tmp_path, argv):
    return commands.plan_of(tmp_path, argv)


def test_split_command_keeps_the_words_after_the_first_double_dash():
    assert split_command(["--nodes", "2", "--", "python", "t.py", "--", "x"]) == (["--nodes", "2"],
                                                                                  ["python", "t.py", "--", "x"])
    assert split_command(["--dry-run"]) == (["--dry-run"], None)


def test_a_command_plan_keeps_the_words_verbatim(tmp_path):
    words = ["python", SCRIPT, "--name", "a b; $HOME *", "{batch}"]
    plan = plan_of(tmp_path, ["--dry-run", "--gpus", "2", "--", *words])
    (spec,) = plan.specs
    ((point, command),) = spec.points
    assert point is None and words_for(command, Path("/r"), "py") == words
    assert spec.folder == tmp_path / "torchrun_ddp" / "%j" and command.cwd == os.getcwd()
    assert command.profiler["enabled"] and command.stop_grace_s == 120  # perlmutter's


@pytest.mark.parametrize("argv, needle", [
    (["--batch-size", "8", "--", "python", SCRIPT], "--batch-size: a flag of the toolkit's own training"),
    (["--set", "train.lr=1", "--", "python", SCRIPT], "section 'train' is not used here"),
    (["--", "python", "nope.py"], "'nope.py': no such script"),
    (["--"], "no command"),
])
def test_a_bad_command_line_is_one_line(tmp_path, argv, needle):
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", *argv])
    assert needle in str(e.value)


def test_a_single_jobs_config_may_add_words_but_not_a_points_field(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("command:\n  args: [--out, '{run_dir}/w.pt']\n  env: {SEED: '7'}\nprofiler: {active: 2}\n")
    ((_, command),) = plan_of(tmp_path, ["--dry-run", "--config", str(config), "--", "python", SCRIPT]).specs[0].points
    assert words_for(command, Path("/r"), "py") == ["python", SCRIPT, "--out", "/r/w.pt"] and command.env == {"SEED": "7"}
    config.write_text("command:\n  args: [--batch-size, '{batch}']\n")
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", "--config", str(config), "--", "python", SCRIPT])
    assert str(e.value).startswith(f"--config {config}: command: '{{batch}}': no value for {{batch}}")


def test_a_command_sweep_fills_each_point_and_skips_axes_it_never_uses(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: s\n  batch_sizes: [8, 16]\n  gpus: [1, 2]\n"
                     "command:\n  args: [--batch-size, '{batch}', --out, '{run_dir}/w.pt']\n  env: {N: '{ranks}'}\n")
    plan = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    points = [(p, c) for spec in plan.specs for p, c in spec.points]
    # data_fractions defaults to three values, but no word uses {fraction}: one each, not three copies
    assert sorted((p.batch_size, p.gpus) for p, _ in points) == [(8, 1), (8, 2), (16, 1), (16, 2)]
    for p, c in points:
        assert c.words[2:] == ("--batch-size", str(p.batch_size), "--out", "{run_dir}/w.pt")
        # and the batch the start-up hook's out-of-memory record names (the words use {batch})
        assert c.env == {"N": str(p.gpus), "HPC_POINT_BATCH": str(p.batch_size)} and c.point == p
        assert words_for(c, Path("/r/7"), "py")[-1] == "/r/7/w.pt"
    sweep.write_text("sweep:\n  data_fractions: [1, 0.5]\ncommand:\n  args: ['{batch}']\n")
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    assert "sweep.data_fractions has 2 values but the command never uses {fraction}" in str(e.value)


def test_a_command_sweep_planned_again_from_its_sweep_file_is_the_same(tmp_path):
    """`hpc.study resubmit` plans the points again from sweep.yaml alone, from any directory."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: s\n  batch_sizes: [8, 16]\n  gpus: [1]\ncommand:\n  args: ['{batch}']\n"
                     "  env: {OUT: '{run_dir}'}\nprofiler: {active: 2}\n")
    first = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(first.sweep_file))
    cwd = os.getcwd()
    os.chdir("/")
    try:
        again = plan_of(tmp_path, ["--dry-run", "--sweep", str(saved)])
    finally:
        os.chdir(cwd)
    points = lambda plan: [(p, msgspec.to_builtins(c)) for spec in plan.specs for p, c in spec.points]  # noqa: E731
    assert points(again) == points(first) and points(first)[0][1]["profiler"]["active"] == 2


def test_a_dry_run_says_what_each_rank_runs(tmp_path):
    from commands import call

    out = call("hpc.submit", ["--dry-run", "--nodes", "2", "--runs-dir", str(tmp_path), "--", "python", SCRIPT, "a b"])
    assert out.code == 0, out.stderr
    assert f"# each rank runs: python {SCRIPT} 'a b'" in out.stdout and "#SBATCH --signal=B:USR2@180" in out.stdout
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_command_metrics_names_each_points_own_place_and_the_report_reads_it(tmp_path):
    """A script that logs outside its run directory (command.metrics, issue 88): each point's place filled
    with its values as the runner's task.json records it, and its records read from there; a place that
    names {python} is refused in one line."""
    from analysis.read.metrics import logged_metrics
    from hpc.core.rundir import RunPaths
    from hpc.launch.rank.runner import write_task

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: s\n  gpus: [1]\n  axes: {lr: [0.1, 0.01]}\n"
                     f"command:\n  cwd: {tmp_path}\n  args: [--lr, '{{lr}}']\n  metrics: 'logs/lr{{lr}}/{{run_dir}}.csv'\n")
    points = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT]).specs[0].points
    for i, (point, command) in enumerate(points):
        lr = point.values["lr"]
        run = tmp_path / "runs" / str(i)
        write_task(RunPaths(run), command)
        place = Path(tmp_path, f"logs/lr{lr}/{run}.csv")  # the oracle: the place as the user wrote it
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(f"step,val_loss\n10,{lr * 3}\n20,{lr * 2}\n")
        found = logged_metrics(run)
        assert found["val_loss"].values == (lr * 3, lr * 2) and found["val_loss"].source == str(place)
    sweep.write_text("sweep:\n  name: s\n  gpus: [1]\n  axes: {lr: [0.1]}\ncommand:\n  metrics: '{python}/m.csv'\n")
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT, "--lr", "{lr}"])
    assert "command.metrics: '{python}/m.csv': {python} is no place" in str(e.value)


NO_FILE = "cannot read config file (No such file or directory)"
KNOWN = "(known: {batch}, {fraction}, {gpus}, {nodes}, {ranks}, {run_dir}, {python})"
POINT = "sweep point {'batch': 8, 'fraction': 1.0, 'gpus': 1, 'nodes': 1, 'ranks': 1}"
GRID = "sweep: {name: sw, gpus: [1], batch_sizes: [8]}\n"


@pytest.mark.parametrize("config, sweep, argv, said", [  # None: no such flag; "": a path to no file; C, S: the paths
    ("train: {lr: 1}\n", None, ["--", "python", SCRIPT], "C: section 'train' is not used here (expected profiler, command)"),
    (None, GRID + "train: {lr: 1}\ncommand: {args: ['{batch}']}\n", ["--", "python", SCRIPT],
     "S: section 'train' is not used here (expected profiler, command, sweep)"),
    ("", None, ["--", "python", SCRIPT], f"--config C: {NO_FILE}"),
    ("", None, [], f"--config C: {NO_FILE}"),  # the toolkit's training reads it the same way
    (None, "", ["--", "python", SCRIPT], f"--sweep S: {NO_FILE}"),
    (None, None, ["--set", "profiler.active=0", "--", "python", SCRIPT],
     "--set profiler.active=0: profiler.active = 0: must be > 0"),
    (None, GRID, ["--axis", "profiler.active=0,1", "--", "python", SCRIPT, "{batch}"],
     "sweep point profiler.active=0: profiler.active = 0: must be > 0"),
    ("command: {args: [x]}\n", None, [],
     "command.args: a key of a user's command; the toolkit's training takes only command.hang_timeout_s of that section"),
    (None, None, ["--"], "command line: no command: give it after -- (e.g. -- python train.py)"),
    (None, GRID + "command: {args: ['{batch}']}\n", [],
     "command line: no command: give it after -- (e.g. -- python train.py); or command.run in S"),
    (None, GRID + "command: {args: ['{nope}']}\n", ["--", "python", SCRIPT, "{batch}"],
     f"{POINT}: command.args: '{{nope}}': no value for {{nope}} {KNOWN}"),
    (None, GRID + "command: {env: {K: '{nope}'}}\n", ["--", "python", SCRIPT, "{batch}"],
     f"{POINT}: command.env.K: '{{nope}}': no value for {{nope}} {KNOWN}"),
    (None, GRID, ["--", "python", SCRIPT, "{batch:zz}"],
     f"{POINT}: the command: '{{batch:zz}}': Unknown format code 'z' for object of type 'int'"),
    ("command: {metrics: '{batch}'}\n", None, ["--", "python", SCRIPT],
     f"--config C: command.metrics: '{{batch}}': no value for {{batch}} {KNOWN}"),
    # the words came from --set, not from a --config that was never given (it said `--config None`)
    (None, None, ["--set", "command.metrics=m/{batch}", "--", "python", SCRIPT],
     f"--set command.metrics=m/{{batch}}: command.metrics: 'm/{{batch}}': no value for {{batch}} {KNOWN}"),
    ("command: {env: {K: x}}\n", None, ["--set", "command.args=['{batch}']", "--", "python", SCRIPT],
     f"--set command.args=['{{batch}}']: command: '{{batch}}': no value for {{batch}} {KNOWN}"),
    (None, None, ["--batch-size", "8", "--", "python", SCRIPT], "command line: --batch-size: a flag of the toolkit's "
     "own training (hpc.train); your command takes its own arguments after --"),
])
def test_a_plans_refusal_is_one_whole_line_naming_where_the_setting_came_from(tmp_path, config, sweep, argv, said):
    """Each refusal of the plan, checked whole: which file, flag or point gave the value, and what is known."""
    c, s = tmp_path / "c.yaml", tmp_path / "s.yaml"
    own = []
    for flag, path, text in (("--config", c, config), ("--sweep", s, sweep)):
        if text is not None:
            if text:
                path.write_text(text)
            own += [flag, str(path)]
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", *own, *argv])
    assert str(e.value) == said.replace("C:", f"{c}:").replace(" C ", f" {c} ").replace("S:", f"{s}:").replace(
        " S", f" {s}")


def test_a_commands_plan_takes_the_clusters_settings_no_profile_and_the_sweeps_name(tmp_path):
    plan = plan_of(tmp_path, ["--dry-run", "--set", "cluster.time_limit_min=5", "--no-profile", "--", "python", SCRIPT])
    ((_, command),) = plan.specs[0].points
    assert plan.cluster.time_limit_min == 5 and command.profiler["enabled"] is False
    ((_, command),) = plan_of(tmp_path, ["--dry-run", "--", "python", SCRIPT]).specs[0].points
    assert command.profiler["enabled"] is True
    # a container image's program is looked for there, not here
    plan_of(tmp_path, ["--dry-run", "--set", "cluster.image=docker:x", "--", "no-such-program-here", "x"])
    sweep = tmp_path / "s.yaml"
    sweep.write_text("sweep: {name: sw, gpus: [1], batch_sizes: [8]}\n")
    (spec,) = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT, "{batch}"]).specs
    assert spec.folder.parent.parent == tmp_path / "sw" and spec.points[0][1].name == "torchrun_ddp"
    ((_, training),) = plan_of(tmp_path, ["--dry-run", "--config", str(REPO / "profiles" / "smoke.yaml")]).specs[0].points
    assert training.stop_grace_s == 120  # perlmutter's


def test_a_sweep_file_that_cannot_be_read_is_named_by_its_flag(tmp_path):
    from hpc.launch.submission.points import is_command_sweep

    with pytest.raises(UsageError) as e:
        is_command_sweep(str(tmp_path / "s.yaml"))
    assert str(e.value) == f"--sweep {tmp_path / 's.yaml'}: {NO_FILE}"
    (tmp_path / "s.yaml").write_text(GRID + "command: {args: ['{batch}']}\n")
    assert is_command_sweep(str(tmp_path / "s.yaml")) and not is_command_sweep(None)
