"""hpc/launch/submission/plan.py: a single job and the study as plans."""

import sys
from pathlib import Path

import commands

from hpc.launch.submission.submit import print_plan

REPO = Path(__file__).resolve().parents[3]


def plan_for(*argv, tmp_path):
    return commands.plan_of(tmp_path / "runs", argv)


def test_a_single_job_is_a_plan_of_one_point(tmp_path):
    plan = plan_for("--dry-run", "--account", "m1_g", "--nodes", "2", "--gpus", "4", tmp_path=tmp_path)
    (spec,) = plan.specs
    assert not spec.array and len(spec.points) == 1 and spec.points[0][0] is None
    assert (spec.request.nodes, spec.request.gpus, spec.request.name) == (2, 4, "resnet152")
    assert not (tmp_path / "runs").exists()  # planning writes nothing


def test_the_study_is_three_arrays_of_twelve(tmp_path, capsys):
    plan = plan_for("--dry-run", "--account", "m1_g", "--sweep", str(REPO / "profiles" / "study.yaml"), tmp_path=tmp_path)
    assert [(s.request.gpus, len(s.points), s.array) for s in plan.specs] == [(1, 12, True), (2, 12, True), (4, 12, True)]
    fractions = {p["data_fraction"] for s in plan.specs for p, _ in s.points}
    assert fractions == {1.0, 0.5, 0.1}
    assert {task.config["train"]["batch_size"] for s in plan.specs for _, task in s.points} == {128, 512, 1024, 2048}
    print_plan(plan)
    out = capsys.readouterr().out
    assert out.count("#SBATCH --array=0-11") == 3 and not (tmp_path / "runs").exists()


def test_the_trainings_task_takes_the_one_hang_bound_a_commands_does(tmp_path):
    """One liveness watch, one key: command.hang_timeout_s reaches the runner's watch for the toolkit's
    training as for a user's command; unset, both learn their bounds; the section's other keys are a
    command's and refused for the training, in one line."""
    import pytest

    from hpc.core.errors import UsageError

    def bound(*argv):
        (spec,) = plan_for("--dry-run", "--local", "--gpus", "1", *argv, tmp_path=tmp_path).specs
        return spec.points[0][1].hang_timeout_s

    assert bound() is None and bound("--set", "command.hang_timeout_s=90") == 90
    assert bound("--set", "command.hang_timeout_s=90", "--", sys.executable, "-c", "pass") == 90
    with pytest.raises(UsageError, match=r"^command\.cwd: a key of a user's command"):
        bound("--set", "command.cwd=/")
