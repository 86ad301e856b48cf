"""hpc/launch/submission/plan.py: a single job and the study as plans."""

import shlex
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
    fractions = {p.data_fraction for s in plan.specs for p, _ in s.points}
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


def test_local_without_gpus_runs_two_ranks_here_and_says_so(tmp_path):
    """No GPU here (NVML finds none): two CPU ranks, as the quickstart runs, said in one line; once the profile
    default gave 8 ranks on a laptop."""
    from commands import call

    out = call("hpc.submit", ["--local", "--dry-run", "--config", "profiles/quickstart.yaml", "--runs-dir",
                              str(tmp_path)], None)
    assert out.code == 0, out.stderr
    assert "2 task(s) each" in out.stdout
    assert "--local: 2 rank(s) (no --gpus; no GPU here: 2 CPU ranks)" in out.stderr


def test_inside_an_allocation_the_run_is_a_step_of_it(tmp_path):
    """salloc's shell (the test cluster's variables): hpc.submit plans one srun step of the allocation, its
    shape the allocation's; an option only a new job takes is refused naming --new-job, which submits one."""
    from commands import assert_refused, call
    from test_batch import SALLOC

    words = ["--dry-run", "--runs-dir", str(tmp_path), "--", sys.executable, "-c", "pass"]
    out = call("hpc.submit", words, SALLOC)
    assert out.code == 0, out.stderr
    said, each, step = out.stdout.splitlines()
    assert said == "# inside allocation 29: one srun step" and each.endswith("-c pass")
    name = Path(sys.executable).name  # the job's name: its command's (python, python3...)
    assert step.startswith(f"srun '--job-name=hpc:{name}/29.<n>' --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=2 "
                           "--cpus-per-task=1 ")  # named: a stop finds the step by it
    assert step.endswith("-m hpc.rank --run-dir " + shlex.quote(f"{tmp_path}/{name}/29.<n>"))
    assert not any(tmp_path.iterdir())  # a dry run makes nothing
    assert_refused(call("hpc.submit", ["--mem", "10G", *words], SALLOC), "hpc.submit", "--mem 10G",
                   "inside allocation 29", "--new-job")
    new = call("hpc.submit", ["--new-job", "-A", "m1_g", *words], SALLOC)
    assert new.code == 0 and "#SBATCH --gpus-per-node=4" in new.stdout, new.stderr
