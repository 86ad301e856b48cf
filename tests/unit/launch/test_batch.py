"""The batch shell of a hand-written sbatch script (hpc/launch/batch.py), in-process."""

import os

import pytest

BATCH_SHELL = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
               "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_CPUS_PER_TASK": "8", "PATH": os.environ["PATH"]}


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "node"])
def test_the_batch_shell_runs_one_step_of_runners(tmp_path, launcher):
    """What jobs/resnet152.sbatch runs after `module load`: the training's own --run-dir is the run's, and
    its step is one srun of runners (one a task), or of torchrun over runners (one a node)."""
    from commands import call

    env = {**BATCH_SHELL, "HPC_LAUNCHER": launcher}
    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "-m", "hpc.train", "--run-dir",
                             str(tmp_path / "r"), "--epochs", "1"], env)
    assert out.code == 0, out.stderr
    said, step = out.stdout.splitlines()
    assert said == f"# each rank runs: python -m hpc.train --run-dir {tmp_path / 'r'} --epochs 1"
    runner = f"-m hpc.rank --run-dir {tmp_path / 'r'}"
    if launcher == "srun":
        assert step.startswith("srun --kill-on-bad-exit=1 ") and step.endswith(f"python {runner}")
        assert "--ntasks" not in step
    elif launcher == "node":  # one runner a node, its CPUs for the one process that uses every GPU
        assert "--ntasks-per-node=1 --ntasks=2 --cpus-per-task=16" in step and step.endswith(f"python {runner}")
        assert "torch.distributed.run" not in step
    else:  # 2 nodes: one task each, its CPUs for both workers, torchrun's rendezvous at the first node
        assert "--ntasks-per-node=1 --ntasks=2 --cpus-per-task=16" in step and "--nproc-per-node=2" in step
        assert "--rdzv-endpoint=nid001:" in step and step.endswith(runner)
    assert not (tmp_path / "r").exists()  # a dry run writes nothing


def test_the_batch_shell_names_a_commands_run_after_its_script(tmp_path, monkeypatch):
    from commands import call

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "train.py"], BATCH_SHELL)
    assert out.code == 0, out.stderr
    assert out.stdout.splitlines()[1].endswith("python -m hpc.rank --run-dir runs/train/77")  # no $SCRATCH here
    scratch = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "train.py"],
                   {**BATCH_SHELL, "SCRATCH": "/s"})
    assert scratch.stdout.splitlines()[1].endswith("--run-dir /s/hpc-resnet-study/runs/train/77")
