"""hpc.submit without a cluster: validation, the sbatch text (golden file), argument forwarding."""

import difflib
import subprocess
import os
import shlex
import pickle
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_module
from hpc.settings.config import load_cluster
from hpc.launch.submission.sbatchflags import Exports, JobOptions
from hpc.launch.batch import Step, step_preview
from hpc.launch.submission.slurm import JobRequest, batch_python, sbatch_text, slurm_parameters

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


# Perlmutter's three kinds of job, each pinned: 2 whole nodes (the fabric's settings, the GPU order, the
# CPU binding), one GPU of a shared node, and a preemptible variable-time job in NERSC's container.
GOLDENS = {
    "perlmutter_2x4.sbatch": ({}, dict(nodes=2, gpus=4)),
    "perlmutter_shared_1gpu.sbatch": ({}, dict(nodes=1, gpus=1)),
    "perlmutter_container_preempt.sbatch": (
        {"cluster.image": "nersc/pytorch:24.08.01", "cluster.qos": "preempt", "cluster.time_min_min": 30,
         "cluster.comment": "resnet152 study"},
        dict(nodes=1, gpus=4, sbatch={"mail-type": "END"}),
    ),
}


def golden_text(name: str = "perlmutter_2x4.sbatch") -> str:
    """The job as a dry run prints it: the step its batch shell runs (hpc/launch/batch.py), then the script
    submitit hands to sbatch; both with `python` for the interpreters."""
    profile, shape = GOLDENS[name]
    cluster = load_cluster("perlmutter", [(k, v, "test") for k, v in profile.items()])
    shape = dict(shape)
    extra = shape.pop("sbatch", {})
    req = JobRequest(time_min=120, name="resnet152", options=JobOptions(account="m1234_g", extra=extra), **shape)
    folder = Path("/scratch/runs/resnet152/%j")
    python = "python"  # the rank's: this one's path (a dry run names it whole), or the image's own
    step = step_preview(cluster, folder, Step(cluster.launcher, req.nodes, req.gpus, None, python=python), None)
    return f"# the job's batch shell runs one step: {step}\n" + sbatch_text(slurm_parameters(cluster, req), folder,
                                                                            python="python")


@pytest.mark.parametrize("name", list(GOLDENS))
def test_sbatch_text_is_pinned_by_golden_file(name):
    path = GOLDEN / name
    text = golden_text(name)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "sbatch text changed; rerun with UPDATE_GOLDEN=1 if intended"


def test_golden_has_the_perlmutter_shape():
    text = (GOLDEN / "perlmutter_2x4.sbatch").read_text()
    for line in ["#SBATCH --constraint=gpu", "#SBATCH --qos=regular", "#SBATCH --account=m1234_g",
                 "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=32", "#SBATCH --signal=B:USR2@180", "#SBATCH --time=120",
                 "module load pytorch", "export NCCL_NET_GDR_LEVEL=PHB", "export NCCL_NET='AWS Libfabric'",
                 "export HPC_NCCL_FABRIC=stop", "export HPC_GPU_ORDER=3,2,1,0", "--kill-on-bad-exit=1 --cpu-bind=cores"]:
        assert line in text, line


def test_a_partial_node_goes_to_the_shared_qos_with_its_gpus():
    """NERSC's shared GPU jobs: -q shared, 32 cores a task, the job's GPUs on the node (every task sees them
    and takes cuda:LOCAL_RANK, as for a user's script: one policy, issue 50); no fabric settings, no GPU
    order (inside one node)."""
    text = (GOLDEN / "perlmutter_shared_1gpu.sbatch").read_text()
    for line in ["#SBATCH --qos=shared", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=32",
                 "#SBATCH --ntasks-per-node=1"]:
        assert line in text, line
    assert "gpus-per-task" not in text and "NCCL_NET" not in text and "HPC_GPU_ORDER" not in text


def test_a_container_job_runs_its_command_in_shifter():
    text = (GOLDEN / "perlmutter_container_preempt.sbatch").read_text()
    for line in ["#SBATCH --image=nersc/pytorch:24.08.01", "#SBATCH --qos=preempt", "#SBATCH --time-min=30",
                 "#SBATCH --comment='resnet152 study'", "#SBATCH --mail-type=END",
                 "--cpu-bind=cores shifter --image=nersc/pytorch:24.08.01 --module=gpu,nccl-plugin python -m hpc.rank"]:
        assert line in text, line


def test_dry_run_cli_prints_what_would_be_submitted(tmp_path):
    proc = run_module("hpc.submit", "--nodes", "2", "--gpus", "4", "--time", "120", "--account", "m1234_g",
                      "--name", "resnet152", "--runs-dir", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    expected = golden_text().replace("/scratch/runs", str(tmp_path))
    # the ranks and the batch shell run the submitter's own interpreter (the golden file says `python`)
    expected = expected.replace(" python -m hpc.rank", f" {shlex.quote(sys.executable)} -m hpc.rank")
    expected = expected.replace("exec python -u", f"exec {shlex.quote(sys.executable)} -u")
    body = lambda t: t.splitlines()
    run_dir = f"{tmp_path}/resnet152/%j"
    assert proc.stdout.splitlines()[0] == (f"# each rank runs: {sys.executable} -m hpc.train --config "
                                           f"{run_dir}/submitted.yaml --run-dir {run_dir}")
    assert body(proc.stdout)[1:] == body(expected)
    assert not any(tmp_path.iterdir())  # nothing submitted, nothing written


def test_sweep_dry_run_makes_one_array_per_shape(tmp_path):
    proc = run_module("hpc.study", "run", "profiles/study.yaml", "--account", "m1_g", "--max-parallel", "3",
                      "--runs-dir", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    arrays, analysis = proc.stdout.split("# then the analysis job", 1)
    assert arrays.count("#!/bin/bash") == 3 and analysis.count("#!/bin/bash") == 1  # 1, 2 and 4 GPUs; the report's
    assert arrays.count("#SBATCH --array=0-11%3") == 3  # 3 fractions x 4 batch sizes each
    assert "#SBATCH --gpus-per-node=4" in arrays and arrays.count("#SBATCH --qos=shared") == 2
    assert arrays.count("#SBATCH --gpus-per-node=1") == arrays.count("#SBATCH --gpus-per-node=2") == 1
    assert "gpus-per-task" not in arrays  # 1 and 2 GPUs: the shared QOS, the job's GPUs seen by every task
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_the_training_and_a_command_differ_only_in_what_each_rank_runs(tmp_path):
    """One road (issue 50): the dry runs of the toolkit's training and of a user's command, as a user types
    them, print the same sbatch script; only the line saying what each rank runs differs."""
    common = ["--dry-run", "--nodes", "2", "--gpus", "4", "--account", "m1234_g", "--name", "job", "--runs-dir",
              str(tmp_path)]
    train = run_module("hpc.submit", *common)
    own = run_module("hpc.submit", *common, "--", "python", "tests/scripts/torchrun_ddp.py", "--epochs", "1")
    assert train.returncode == own.returncode == 0, train.stderr + own.stderr
    changed = [line for line in difflib.ndiff(train.stdout.splitlines(), own.stdout.splitlines()) if line[:2] in ("- ", "+ ")]
    assert [line[:2] for line in changed] == ["- ", "+ "], changed
    assert changed[0].startswith("- # each rank runs: ") and " -m hpc.train --config " in changed[0]
    assert changed[1] == "+ # each rank runs: python tests/scripts/torchrun_ddp.py --epochs 1"
    assert "#SBATCH --signal=B:USR2@180" in train.stdout and train.stdout.count("#!/bin/bash") == 1


def test_study_dry_run_adds_a_cpu_analysis_job_after_the_arrays(tmp_path):
    proc = run_module("hpc.study", "run", "profiles/study.yaml", "--account", "m1_g", "--runs-dir", str(tmp_path),
                      "--set", "sweep.nodes=[1, 2]", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    scripts = proc.stdout.split("#!/bin/bash")[1:]
    assert len(scripts) == 3 * 2 + 1  # an array per (nodes, GPUs) shape, then the analysis job
    analysis = scripts[-1]
    assert "#SBATCH --dependency='afterany:<array ids>'" in analysis
    assert "#SBATCH --constraint=cpu" in analysis and "#SBATCH --qos=shared" in analysis and "gpus" not in analysis
    assert sum("#SBATCH --nodes=2" in s for s in scripts) == 3 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args,needles", [
    (["--gpus", "5"], ["--gpus 5", "4 GPUs per node"]),
    (["--nodes", "0"], ["--nodes 0"]),
    (["--time", "5000"], ["--time 5000", "at most 2880"]),
    (["--batch-size", "-2"], ["--batch-size", "train.batch_size = -2"]),
    (["--arch", "alexnet"], ["model.arch = 'alexnet'"]),
    (["--name", "a/b"], ["--name 'a/b'"]),
    (["--name", "a\nb"], ["--name"]),
    (["--export", "NOEQUALS"], ["--export NOEQUALS", "not set here"]),
    (["--max-parallel", "0"], ["--max-parallel 0"]),
    (["--profile", "nosuch"], ["--profile 'nosuch': no packaged profile", "local, perlmutter"]),
    (["--profile", "nosuch.yaml"], ["nosuch.yaml", "cannot read"]),
])
def test_bad_requests_fail_before_submitting(tmp_path, args, needles):
    proc = run_module("hpc.submit", "--runs-dir", str(tmp_path), "--dry-run", *args)
    assert_one_line_error(proc, *needles)
    assert not any(tmp_path.iterdir())


def test_sweep_gpus_above_the_node_are_refused(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("sweep:\n  gpus: [1, 8]\n")
    assert_one_line_error(run_module("hpc.study", "run", str(sweep), "--dry-run"), str(sweep), "--gpus 8")


def test_no_sbatch_points_to_local(tmp_path):
    env = {"PATH": str(Path(os.__file__).parent)}  # no sbatch on this PATH
    proc = run_module("hpc.submit", "--runs-dir", str(tmp_path), env=env)
    assert_one_line_error(proc, "sbatch not found", "--local")


def test_forwarded_training_options_land_in_the_job(tmp_path):
    from hpc.launch.submission.job import TaskJob
    from hpc.launch.submission.plan import make_plan
    from hpc.launch.submission.submit import parse_options
    from hpc.settings.config import load_run_config, run_config_from_dict

    args = ["--config", "profiles/smoke.yaml", "--batch-size", "12", "--data-root", "/x y", "--set", "train.seed=5",
            "--dry-run", "--runs-dir", str(tmp_path)]
    ((_, task),) = make_plan(parse_options(args), None).specs[0].points
    cfg = run_config_from_dict(task.config, "the task")
    assert (cfg.train.batch_size, cfg.data.root, cfg.train.seed, cfg.model.arch) == (12, "/x y", 5, "tiny")
    assert task.words[1:3] == ("-m", "hpc.train") and task.requeue_codes == (3, 5)
    job = TaskJob(task)
    # a requeued job runs its submitted pickle again (the batch shell requeues; no in-step checkpoint() for
    # submitit's own handler to call, issue 60): the same task
    assert not hasattr(job, "checkpoint") and pickle.loads(pickle.dumps(job)).task == task  # the same task
    assert load_run_config(None).train.batch_size == 128


def test_slurm_parameters_quote_environment():
    cluster = load_cluster("perlmutter")
    req = JobRequest(1, 4, 60, "n", JobOptions(exports=Exports(values={"HPC_TAG": "a b'$(x)`y`;z"})))
    setup = slurm_parameters(cluster, req)["setup"]
    assert setup[-2] == "export HPC_TAG='a b'\"'\"'$(x)`y`;z'" and setup[-1].startswith("# ")  # then a comment


@pytest.mark.parametrize("command", [
    ["hpc.submit", "--dry-run", "--account", "m1_g", "--nodes", "2", "--gpus", "4"],
    ["hpc.study", "run", "profiles/study.yaml", "--account", "m1_g", "--dry-run"],
])
def test_a_dry_run_needs_no_scheduler(command, tmp_path):
    """On a laptop (no srun, no sbatch on PATH) a dry run prints the scripts (it used to end in submitit's
    'Could not detect srun' traceback)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": str(bin_dir)}  # nothing of Slurm's here
    proc = run_module(*command, "--runs-dir", str(tmp_path / "runs"), env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.count("#!/bin/bash") >= 1 and "#SBATCH --account=m1" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_the_pure_sbatch_text_is_what_submitit_submits(slurm_cluster):
    """Where submitit can make an executor (srun is here), its script for the same parameters is ours."""
    import submitit

    cluster = load_cluster("perlmutter")
    params = slurm_parameters(cluster, JobRequest(nodes=2, gpus=4, time_min=120, name="n", options=JobOptions(account="m1")), 3)
    folder = Path("/scratch/runs/n/%j")
    executor = submitit.SlurmExecutor(folder=folder, python=batch_python("python"))  # as hpc.submit makes it
    executor.update_parameters(**params)
    theirs = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert sbatch_text(params, folder, python="python") == theirs
    executor.parameters["map_count"] = 5  # as submitit sets it for an array (SlurmExecutor._internal_process_submissions)
    assert sbatch_text(params, folder, python="python", map_count=5) == executor._make_submission_file_text(
        executor._submitit_command_str, "uid")


def launch_path(run) -> list[str]:
    """The launcher modules a call enters, in order (a module entered again after another counts again):
    every function call whose code lives in hpc/launch, profiled with sys.setprofile."""
    path: list[str] = []

    def entered(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("hpc.launch") and (not path or path[-1] != module):
            path.append(module)

    sys.setprofile(entered)
    try:
        run()
    finally:
        sys.setprofile(None)
    return path


@pytest.mark.slurm
@pytest.mark.parametrize("kind", ["training", "command", "sweep"])
def test_a_submission_reads_top_to_bottom(slurm_cluster, tmp_path, kind):
    """Issue 50: followed from `execute` (the plan made), a submission to Slurm enters at most 5 of the
    launcher's modules and never comes back to one it left; the plan (its parameters and sbatch text)
    is made once, before it. The jobs run on the local cluster afterwards; they are cancelled here."""
    from hpc.launch.submission.submit import STUDY_RUN, execute, plan_for

    what = {"training": ["--config", "profiles/smoke.yaml"], "command": ["--", sys.executable, "-c", "pass"],
            "sweep": ["profiles/study-smoke.yaml"]}[kind]
    prog = STUDY_RUN if kind == "sweep" else "python -m hpc.submit"  # the study's plan is the sweep's one road
    _, plan = plan_for([*what[:1 if kind == "sweep" else 0], "--runs-dir", str(tmp_path), "--account", "m1234_g",
                        "--time", "5", *what[1 if kind == "sweep" else 0:]], prog)
    made = launch_path(lambda: execute(plan, wait=False))
    ids = [p.name for p in tmp_path.rglob("*_submitted.pkl")]
    subprocess.run(["scancel", *{name.split("_")[0] for name in ids}], check=False)
    assert ids and len(set(made)) == len(made) <= 5, made
    assert made[0] == "hpc.launch.submission.submit"


def test_a_local_submission_reads_top_to_bottom(tmp_path, capsys):
    """The same for a run here: submitted, then followed to its printed result (submit -> follow), the
    follower reading the run's records through the core, not back through the launcher."""
    from hpc.launch.submission.submit import execute, plan_for

    _, plan = plan_for(["--local", "--gpus", "1", "--runs-dir", str(tmp_path), "--no-profile", "--",
                        sys.executable, "-c", "print('hello from the task')"])
    code = None

    def run():
        nonlocal code
        code = execute(plan, wait=False)

    made = launch_path(run)
    out = capsys.readouterr().out
    assert code == 0 and "hello from the task" in out and "job " in out and ": done" in out, out
    assert made == ["hpc.launch.submission.submit", "hpc.launch.submission.follow"], made
