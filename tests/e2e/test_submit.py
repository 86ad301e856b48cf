"""hpc.submit without a cluster: validation, the sbatch text (golden file), argument forwarding."""

import os
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_module
from hpc.settings.config import load_cluster
from hpc.launch.slurm import JobRequest, sbatch_text, slurm_parameters
from hpc.submit import TrainJob

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
    profile, shape = GOLDENS[name]
    cluster = load_cluster("perlmutter", [(k, v, "test") for k, v in profile.items()])
    req = JobRequest(time_min=120, name="resnet152", account="m1234_g", **shape)
    folder = Path("/scratch/runs/resnet152/%j")
    return sbatch_text(slurm_parameters(cluster, req, folder=folder), folder, python="python")


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
                 "#SBATCH --cpus-per-task=32", "#SBATCH --signal=USR2@180", "#SBATCH --time=120",
                 "module load pytorch", "export NCCL_NET_GDR_LEVEL=PHB", "export NCCL_NET='AWS Libfabric'",
                 "export HPC_NCCL_FABRIC=stop", "export HPC_GPU_ORDER=3,2,1,0", "--kill-on-bad-exit=1 --cpu-bind=cores"]:
        assert line in text, line


def test_a_partial_node_goes_to_the_shared_qos_with_a_gpu_per_task():
    """NERSC's shared GPU jobs: -q shared, --gpus-per-task 1, 32 cores a task; no fabric settings, no GPU order
    (inside one node, and Slurm hands the task its own GPU)."""
    text = (GOLDEN / "perlmutter_shared_1gpu.sbatch").read_text()
    for line in ["#SBATCH --qos=shared", "#SBATCH --gpus-per-task=1", "#SBATCH --cpus-per-task=32",
                 "#SBATCH --ntasks-per-node=1"]:
        assert line in text, line
    assert "gpus-per-node" not in text and "NCCL_NET" not in text and "HPC_GPU_ORDER" not in text


def test_a_container_job_runs_its_command_in_shifter():
    text = (GOLDEN / "perlmutter_container_preempt.sbatch").read_text()
    for line in ["#SBATCH --image=nersc/pytorch:24.08.01", "#SBATCH --qos=preempt", "#SBATCH --time-min=30",
                 "#SBATCH --comment='resnet152 study'", "#SBATCH --mail-type=END",
                 "--cpu-bind=cores shifter --image=nersc/pytorch:24.08.01 --module=gpu,nccl-plugin python -u -m"]:
        assert line in text, line


def test_dry_run_cli_prints_what_would_be_submitted(tmp_path):
    proc = run_module("hpc.submit", "--nodes", "2", "--gpus", "4", "--time", "120", "--account", "m1234_g",
                      "--name", "resnet152", "--runs-dir", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    expected = golden_text().replace("/scratch/runs", str(tmp_path))
    body = lambda t: [l for l in t.splitlines() if "submitit.core._submit" not in l]
    assert body(proc.stdout) == body(expected)
    assert not any(tmp_path.iterdir())  # nothing submitted, nothing written


def test_sweep_dry_run_makes_one_array_per_shape(tmp_path):
    proc = run_module("hpc.submit", "--sweep", "profiles/study.yaml", "--account", "m1_g", "--max-parallel", "3",
                      "--runs-dir", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 3  # 1, 2 and 4 GPUs
    assert proc.stdout.count("#SBATCH --array=0-11%3") == 3  # 3 fractions x 4 batch sizes each
    assert "#SBATCH --gpus-per-node=4" in proc.stdout and proc.stdout.count("#SBATCH --qos=shared") == 2
    assert proc.stdout.count("#SBATCH --gpus-per-task=1") == 2  # 1 and 2 GPUs: the shared QOS, a GPU a task


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
    (["--export", "NOEQUALS"], ["--export 'NOEQUALS'"]),
    (["--max-parallel", "0"], ["--max-parallel 0"]),
    (["--profile", "nosuch"], ["nosuch.yaml", "cannot read"]),
])
def test_bad_requests_fail_before_submitting(tmp_path, args, needles):
    proc = run_module("hpc.submit", "--runs-dir", str(tmp_path), "--dry-run", *args)
    assert_one_line_error(proc, *needles)
    assert not any(tmp_path.iterdir())


def test_sweep_gpus_above_the_node_are_refused(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("sweep:\n  gpus: [1, 8]\n")
    assert_one_line_error(run_module("hpc.submit", "--sweep", str(sweep), "--dry-run"), str(sweep), "--gpus 8")


def test_no_sbatch_points_to_local(tmp_path):
    env = {"PATH": str(Path(os.__file__).parent)}  # no sbatch on this PATH
    proc = run_module("hpc.submit", "--runs-dir", str(tmp_path), env=env)
    assert_one_line_error(proc, "sbatch not found", "--local")


def test_forwarded_training_options_land_in_the_job():
    from hpc.settings.config import load_run_config
    from hpc.launch.plan import run_layers
    from hpc.launch.submit import build_parser

    args = ["--config", "profiles/smoke.yaml", "--batch-size", "12", "--data-root", "/x y", "--set", "train.seed=5"]
    cfg = run_layers(build_parser().parse_args(args)).run_config()
    assert (cfg.train.batch_size, cfg.data.root, cfg.train.seed, cfg.model.arch) == (12, "/x y", 5, "tiny")
    job = TrainJob(cfg.to_dict(), 3)
    assert job.checkpoint().function is job  # a requeued job runs the same callable again
    assert load_run_config(None).train.batch_size == 128


def test_slurm_parameters_quote_environment():
    cluster = load_cluster("perlmutter")
    req = JobRequest(1, 4, 60, "n", exports={"HPC_TAG": "a b'$(x)`y`;z"})
    setup = slurm_parameters(cluster, req)["setup"]
    assert setup[-1] == "export HPC_TAG='a b'\"'\"'$(x)`y`;z'"


@pytest.mark.parametrize("command", [
    ["hpc.submit", "--dry-run", "--account", "m1_g", "--nodes", "2", "--gpus", "4"],
    ["hpc.submit", "--dry-run", "--account", "m1_g", "--sweep", "profiles/study.yaml"],
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
    params = slurm_parameters(cluster, JobRequest(nodes=2, gpus=4, time_min=120, name="n", account="m1"), 3)
    folder = Path("/scratch/runs/n/%j")
    executor = submitit.SlurmExecutor(folder=folder, python="python")
    executor.update_parameters(**params)
    theirs = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert sbatch_text(params, folder, python="python") == theirs
    executor.parameters["map_count"] = 5  # as submitit sets it for an array (SlurmExecutor._internal_process_submissions)
    assert sbatch_text(params, folder, python="python", map_count=5) == executor._make_submission_file_text(
        executor._submitit_command_str, "uid")
