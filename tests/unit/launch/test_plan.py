"""hpc/launch/submission/plan.py: a single job and the study as plans."""

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
