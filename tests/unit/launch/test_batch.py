"""The batch shell of a hand-written sbatch script (hpc/launch/batch.py), in-process."""

import contextlib
import io
import os
import re
from pathlib import Path

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
    named = call("hpc.batch", ["--dry-run", "--profile", "local", "--name", "mine", "--", "python", "train.py"],
                 BATCH_SHELL)
    assert named.stdout.splitlines()[1].endswith("--run-dir runs/mine/77")  # --name: the runs directory's folder


# salloc's shell as the test cluster's Slurm 22.05 set it (`salloc -N1 --gpus-per-node=2 -n 2 ... env`), a
# batch script's (ENVIRONMENT=BATCH), a step's, and NERSC's interactive step (use_interactive_step).
SALLOC = {"SLURM_JOB_ID": "29", "SLURM_JOBID": "29", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
          "SLURM_GPUS_PER_NODE": "2", "SLURM_JOB_CPUS_PER_NODE": "2", "SLURM_NTASKS": "2",
          "SLURM_JOB_NODELIST": "nid001", "SLURM_TASKS_PER_NODE": "2"}


@pytest.mark.parametrize("env, found", [
    (SALLOC, ("29", 1, 2, 2)),
    ({**SALLOC, "SLURM_STEP_ID": "4294967290"}, ("29", 1, 2, 2)),  # salloc's interactive step, on the node
    ({**SALLOC, "ENVIRONMENT": "BATCH", "SLURM_PROCID": "0"}, None),  # a batch script submitting a job
    ({**SALLOC, "SLURM_STEP_ID": "0"}, None),  # inside a job step (srun)
    ({}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "8", "SLURM_JOB_CPUS_PER_NODE": "128(x2)"},
     ("7", 2, 4, 128)),  # salloc --gpus 8 over 2 nodes: 4 a node
    ({"SLURM_JOB_ID": "8", "SLURM_NNODES": "1", "SLURM_GPUS_PER_NODE": "a100:4"}, ("8", 1, 4, None)),
    ({"SLURM_JOB_ID": "9"}, ("9", 1, None, None)),  # a CPU allocation: no GPUs said
    # srun sets a step's id under both names (srun(1): SLURM_STEP_ID, and SLURM_STEPID for compatibility)
    ({"SLURM_JOB_ID": "5", "SLURM_STEPID": "0"}, None),
    ({"SLURM_JOB_ID": "5", "SLURM_STEPID": "4294967290"}, ("5", 1, None, None)),
    ({"SLURM_JOB_ID": "6", "SLURM_NNODES": "3", "SLURM_GPUS": "gpu:12"}, ("6", 3, 4, None)),  # typed, per job
    ({"SLURM_JOB_ID": "6", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "5"}, ("6", 2, None, None)),
    ({"SLURM_JOB_ID": "10", "SLURM_GPUS": "2", "SLURM_JOB_NUM_NODES": "4"}, ("10", 4, None, None)),  # < 1 a node
    ({"SLURM_JOB_ID": "11", "ENVIRONMENT": "INTERACTIVE", "SLURM_JOB_CPUS_PER_NODE": "64,32"}, ("11", 1, None, 64)),
    ({"SLURM_JOB_ID": "12", "SLURM_GPUS_PER_NODE": "gpu:a100:2", "SLURM_GPUS": "8"}, ("12", 1, 2, None)),
    ({"SLURM_JOB_ID": "13", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "gpu:a100:8"}, ("13", 2, 4, None)),
])
def test_an_interactive_allocation_is_told_from_a_batch_job_and_a_step(env, found):
    from hpc.launch.batch import allocation_here

    here = allocation_here(env)
    assert (None if here is None else (here.job_id, here.nodes, here.gpus, here.cpus)) == found


@pytest.mark.parametrize("nodes, gpus, refused", [
    (1, 2, None), (1, 1, None), (1, 3, "--gpus 3: allocation 29 has 2 per node"),
    (2, 2, "--nodes 2: allocation 29 has 1 node(s)"),
])
def test_a_run_in_an_allocation_fits_it_or_says_how(nodes, gpus, refused):
    from hpc.core.errors import UsageError
    from hpc.launch.batch import allocation_here, allocation_step
    from hpc.settings.config import load_cluster

    here = allocation_here(SALLOC)
    if refused:
        with pytest.raises(UsageError, match=re.escape(refused + "; ask salloc for it, or submit a new job: --new-job")):
            allocation_step(here, load_cluster("perlmutter"), nodes, gpus, SALLOC)
    else:
        step = allocation_step(here, load_cluster("perlmutter"), nodes, gpus, SALLOC)
        assert (step.nodes, step.gpus, step.cpus, step.sized) == (nodes, gpus, 2 // gpus, True)


def test_the_allocation_step_names_its_shape_and_takes_the_shells_environment(tmp_path):
    from hpc.launch.batch import Step, step_words
    from hpc.settings.config import load_cluster

    cluster = load_cluster("local")
    words = step_words(cluster, tmp_path, Step("srun", 1, 2, 16, sized=True), {})
    assert words[:5] == ["srun", "--kill-on-bad-exit=1", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=16"]
    batch = step_words(cluster, tmp_path, Step("srun", 2, 4, 8), {"SLURM_EXPORT_ENV": "NONE"})
    assert batch[:3] == ["srun", "--kill-on-bad-exit=1", "--export=ALL"] and "--nodes=2" not in batch
    assert "--export=ALL" not in step_words(cluster, tmp_path, Step("srun", 1, 2, 1), {"SLURM_EXPORT_ENV": "ALL,A=1"})


def test_a_torchrun_step_is_one_agent_a_node_with_the_steps_shape_and_restarts():
    """The batch job's own torchrun step (unsized: the job's nodes, no --nodes); an allocation's without a CPU
    count gives each agent one CPU a worker; HPC_MAX_RESTARTS over the profile's; torchrun's --nnodes is the
    step's, not the job's."""
    from hpc.launch.batch import Step, step_words
    from hpc.settings.config import load_cluster

    cluster = load_cluster("local")
    env = {**BATCH_SHELL, "SLURM_NNODES": "3", "HPC_MAX_RESTARTS": "7"}
    words = step_words(cluster, Path("r"), Step("torchrun", 2, 4, None), env)
    assert not any(w.startswith("--nodes=") for w in words), words
    assert {"--ntasks=2", "--cpus-per-task=4", "--nnodes=2", "--max-restarts=7"} <= set(words), words
    assert " python -m hpc.launch.rank.agent --" in " ".join(words) and words[-4:] == ["-m", "hpc.rank", "--run-dir", "r"]
    assert f"--max-restarts={cluster.max_restarts}" in step_words(cluster, Path("r"), Step("torchrun", 1, 2, 1), {
        **BATCH_SHELL, "SLURM_NNODES": "1"})


@pytest.mark.parametrize("account, refused", [("m1234_g", False), ("m1234", True), (None, False)])
def test_the_batch_shell_stops_a_gpu_job_charged_elsewhere(tmp_path, account, refused):
    from commands import assert_refused, call

    env = {**BATCH_SHELL, **({"SLURM_JOB_ACCOUNT": account} if account else {})}
    out = call("hpc.batch", ["--dry-run", "--profile", "perlmutter", "--", "python", "-m", "hpc.train", "--run-dir",
                             str(tmp_path / "r")], env)
    if refused:
        assert_refused(out, "hpc.batch", "job 77: account 'm1234' (sbatch -A)", "'_g'", "sbatch -A m1234_g")
    else:
        assert out.code == 0, out.stderr


@pytest.mark.parametrize("given, ranks, sized", [
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "2"}, 2, True),  # sbatch --gpus-per-node=2 over the script's 4
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "gpu:2"}, 2, True),  # with a GPU type
    ({"SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_PER_NODE": "4"}, 2, False),  # sbatch --ntasks-per-node=2
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "4"}, 4, False),
    ({"SLURM_NTASKS_PER_NODE": "4"}, 4, False),  # no GPUs asked: a rank a task
])
def test_the_ranks_follow_the_gpus_sbatch_was_given(given, ranks, sized):
    """Issue 87: `sbatch -N 1 --gpus-per-node=2 jobs/resnet152.sbatch` keeps the script's --ntasks-per-node=4;
    the step starts a rank a GPU (srun --ntasks-per-node=2), not 4 ranks on 2 GPUs."""
    from commands import call

    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "-m", "hpc.train", "--run-dir", "r"],
               {**BATCH_SHELL, "SLURM_NNODES": "1", **given})
    assert out.code == 0, out.stderr
    step = out.stdout.splitlines()[-1]
    assert step.startswith("srun ") and (f"--ntasks-per-node={ranks}" in step) is sized, step
    assert ("rank(s) a node, not --ntasks-per-node's" in out.stderr + out.stdout) is sized


@pytest.mark.parametrize("argv, shape", [
    (["--dry-run"], (1, 2)),  # the allocation's shape stands in for what is not given
    (["--gpus", "1"], (1, 1)),  # issue 90's mutant: the user's --gpus overridden by the allocation's
    (["-N", "1", "--gpus-per-node", "1"], (1, 1)),
])
def test_inside_an_allocation_what_the_user_gives_is_kept_and_the_rest_is_the_allocations(argv, shape):
    from hpc.launch.submission.submit import parse_options

    request = parse_options(argv, environ=SALLOC)
    assert request.allocation is not None and (request.nodes, request.gpus) == shape


def test_a_commands_config_names_its_metrics_place_on_the_batch_and_allocation_roads(tmp_path):
    """command.metrics through --config where a job's batch shell or an allocation makes the task (hpc.batch,
    hpc.rank), as hpc.submit's plan does: kept a template for {run_dir}; a point's field there has no value."""
    from hpc.core.errors import UsageError
    from hpc.launch.rank.rankcli import command_task

    config = tmp_path / "c.yaml"
    config.write_text("command:\n  metrics: 'out/{run_dir}/m.csv'\n  hang_timeout_s: 90\n")
    task = command_task(["python", "t.py"], str(config), False, [], 30)
    assert (task.metrics, task.hang_timeout_s, task.stop_grace_s) == ("out/{run_dir}/m.csv", 90, 30)
    assert command_task(["python", "t.py"], None, False, [], 30).metrics is None
    config.write_text("command:\n  metrics: 'out/{batch}'\n")
    with pytest.raises(UsageError) as e:
        command_task(["python", "t.py"], str(config), False, [], 30)
    assert str(e.value).startswith(f"--config {config}: command.metrics: 'out/{{batch}}': no value for {{batch}}")
    with pytest.raises(UsageError) as e:  # from --set, with no --config: named so, never `--config None`
        command_task(["python", "t.py"], None, False, ["command.metrics=m/{batch}"], 30)
    assert str(e.value).startswith("--set command.metrics=m/{batch}: command.metrics: 'm/{batch}': no value for")


@pytest.mark.parametrize("env, cpus", [
    ({**SALLOC, "SLURM_CPUS_PER_TASK": "3"}, 3),  # salloc -c 3: each task's, as asked
    ({k: v for k, v in SALLOC.items() if k != "SLURM_JOB_CPUS_PER_NODE"}, None),  # not said: Slurm's own
    ({**SALLOC, "SLURM_JOB_CPUS_PER_NODE": "1"}, None),  # fewer CPUs than GPUs: none to share out
])
def test_an_allocations_cpus_a_task_are_what_it_was_given(env, cpus):
    from hpc.launch.batch import allocation_here, allocation_step
    from hpc.settings.config import load_cluster

    cluster = load_cluster("perlmutter")
    step = allocation_step(allocation_here(env), cluster, 1, 2, env)
    assert (step.cpus, step.launcher) == (cpus, cluster.launcher)


@pytest.mark.parametrize("env, multinode, whole_node", [
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "8"}, True, True),  # 2 x 4: the fabric's settings, the GPU order
    ({"SLURM_NNODES": "1", "SLURM_NTASKS": "4"}, False, True),
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "4"}, True, False),  # 2 a node: a partial node sees its own GPUs
    ({"SLURM_NTASKS": "4"}, False, True),  # no SLURM_NNODES: one node
    ({}, False, False),  # one task
])
def test_the_job_takes_the_profiles_environment_for_its_shape_under_its_own(env, multinode, whole_node):
    """Perlmutter's profile: NCCL over the Slingshot fabric only across nodes, the GPU order only on a whole node
    (profiles/perlmutter.yaml); a variable the job already has wins over the profile's."""
    from hpc.launch.batch import job_environment
    from hpc.settings.config import load_cluster

    made = job_environment(load_cluster("perlmutter"), {**env, "OMP_NUM_THREADS": "1"})
    assert ("NCCL_NET" in made, made.get("HPC_GPU_ORDER") == "3,2,1,0") == (multinode, whole_node), made
    assert made["OMP_NUM_THREADS"] == "1" and all(made[k] == v for k, v in env.items())


BATCH_HELP = Path(__file__).parents[2] / "golden" / "batch-help.txt"


def test_the_batch_shells_help_is_pinned_by_a_golden_file():
    """`python -m hpc.batch --help`, what a hand-written sbatch script's author reads; UPDATE_GOLDEN=1
    rewrites it."""
    from commands import entry, environment

    out = io.StringIO()
    with environment({"COLUMNS": "120"}), contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        entry("hpc.batch")(["--help"])
    if os.environ.get("UPDATE_GOLDEN"):
        BATCH_HELP.write_text(out.getvalue())
    assert out.getvalue() == BATCH_HELP.read_text(), "hpc.batch --help changed; rerun with UPDATE_GOLDEN=1 if meant"


def test_the_batch_shell_without_a_command_says_how_to_give_one():
    from commands import assert_refused, call

    out = call("hpc.batch", ["--profile", "local"], BATCH_SHELL)
    assert (out.code, out.stderr) == (
        2, "hpc.batch: error: command line: --: no command after it (e.g. -- python train.py --epochs 3)\n")
    assert_refused(call("hpc.batch", ["--profile", "local", "--"], BATCH_SHELL), "hpc.batch", "no command after it")
    out = call("hpc.batch", [], BATCH_SHELL)  # nothing at all: the usage, and where the help is
    assert out.code == 2 and "no arguments given (see python -m hpc.batch --help)" in out.stderr, out.stderr


def test_a_command_inside_the_profiles_image_is_looked_for_there_not_here(tmp_path, monkeypatch):
    """profiles/perlmutter.yaml with its commented `image:` set: a program this machine lacks may be the image's
    (shifter runs each task there); without an image it is refused here, in one line."""
    from commands import call

    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "container.yaml"
    text = (Path(__file__).parents[3] / "profiles" / "perlmutter.yaml").read_text()
    profile.write_text(text.replace("# image: nersc/pytorch:24.08.01", "image: nersc/pytorch:24.08.01"))
    words = ["--dry-run", "--", "only-in-the-image", "x"]
    out = call("hpc.batch", ["--profile", str(profile), *words], BATCH_SHELL)
    assert out.code == 0 and "shifter --image=nersc/pytorch:24.08.01" in out.stdout, out.stderr
    out = call("hpc.batch", ["--profile", "perlmutter", *words], BATCH_SHELL)
    assert out.code == 2 and "'only-in-the-image': not found on PATH" in out.stderr, out.stderr
