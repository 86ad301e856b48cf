"""Perlmutter as NERSC users run it (issue 29), on the local two-node cluster where it can stand in: a
partial node on the shared QOS (enforced by the cluster's slurmdbd, in a `shared` partition),
the time limit's warning (`scancel -b --signal=USR2`: what the job's --signal=B:USR2@180 sends), a real time
limit, NERSC's container (a stand-in `shifter` on PATH that records its arguments and runs the
command, without `scontrol` inside, as in a container), and the NCCL network check on two nodes with
NCCL's lines replayed (CPU ranks run gloo, which has no NCCL). The sbatch texts themselves are pinned by
golden files (tests/e2e/test_submit.py); the rules by tests/unit/launch/test_site.py."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import has_lines, wait_until
from test_slurm_jobs import warn
from trainrun import same_weights, weights

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
SMOKE = str(REPO / "profiles" / "smoke.yaml")


def profile(tmp_path: Path, **cluster) -> Path:
    """Perlmutter's profile with some keys changed, as a user's copy would be. One thread a rank, not the
    profile's 8 (a node's 64 cores): two ranks of 8 threads on this machine's 2 cores spun, 48 core-s for what
    takes 9 with one (measured with tests/proccpu.py)."""
    data = yaml.safe_load((REPO / "profiles" / "perlmutter.yaml").read_text())
    data["cluster"].update(runs_dir=None, env={"OMP_NUM_THREADS": "1"}, **cluster)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def environment(tmp_path: Path, **extra) -> dict:
    return dict(os.environ, PATH=f"{tmp_path / 'bin'}:{Path(PY).parent}:{os.environ['PATH']}", OMP_NUM_THREADS="1",
                **extra)


def stand_in(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / "bin").mkdir(exist_ok=True)
    path = tmp_path / "bin" / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def job_state(job: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_done(job: str, timeout: float = 600) -> dict:
    """The job's final state; a requeued job's ~2 minute hold is cut short (a few seconds after it starts:
    see tests/e2e/test_slurm_jobs.py)."""
    deadline, held = time.time() + timeout, None
    while time.time() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.strip()
        if not q:
            return job_state(job)
        if "BeginTime" in q:
            held = held or time.time()
            if time.time() - held >= 3:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
        time.sleep(1)
    raise AssertionError(f"job {job} still queued after {timeout} s")


def wait_lines(path: Path, lines: int, timeout: float = 180) -> None:
    wait_until(lambda: has_lines(path, lines), f"{lines} lines in {path}", timeout)


def sbatch(env: dict, tmp_path: Path, *args: str) -> str:
    r = subprocess.run(["sbatch", "--parsable", "--export=ALL", "-o", str(tmp_path / "out-%j.txt"), *args],
                       capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def submit(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpc.submit", *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)


@pytest.mark.usefixtures("slurm_cluster")
def test_a_partial_node_runs_on_the_shared_qos_and_says_where_it_sat(data_root, tmp_path):
    site = profile(tmp_path, shared_partition="shared")
    r = submit(environment(tmp_path), "--profile", str(site), "--nodes", "1", "--gpus", "1", "--account", "m1_g",
               "--config", SMOKE, "--data-root", str(data_root), "--runs-dir", str(tmp_path / "runs"),
               "--max-steps", "4", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    (job,) = re.findall(r"^job (\S+): run dir", r.stdout, flags=re.M)
    state = job_state(job)
    assert state["Partition"] == "shared" and state["QOS"] == "shared", state
    summary = json.loads((tmp_path / "runs" / "tiny" / job / "summary.json").read_text())
    rank = summary["ranks"][0]
    assert rank["slurm"]["job_partition"] == "shared" and rank["affinity"]["ncores"] >= 1
    assert re.fullmatch(r"[0-9,-]+", rank["affinity"]["cores"]) and rank["affinity"]["gpu"] is None  # CPU ranks
    log = (tmp_path / "runs" / "tiny" / job / f"{job}_0_log.out").read_text()
    assert f"rank 0 on {rank['hostname']}: cores {rank['affinity']['cores']}" in log


@pytest.mark.usefixtures("slurm_cluster")
def test_the_warning_requeues_the_script_and_resumes_to_the_same_weights(data_root, tmp_path, straight_smoke_2x4):
    """jobs/resnet152.sbatch's warning (its --signal=B:USR2@180: SIGUSR2 to the batch shell alone, as `scancel
    -b` sends it): the batch shell passes SIGTERM on to the ranks, which checkpoint at the end of their step
    and exit 3; it requeues the job, which resumes from the checkpoint to the weights of a run nothing
    stopped (straight_smoke_2x4)."""
    env = environment(tmp_path)
    train = ["--config", SMOKE, "--data-root", str(data_root), "--epochs", "4", "--no-profile",
             "--set", "train.log_every_steps=1", "--set", "train.checkpoint_every_steps=8"]
    preempted = sbatch(env, tmp_path, "-N", "1", "--ntasks-per-node=2", "jobs/resnet152.sbatch", *train,
                       "--run-dir", str(tmp_path / "preempted"))
    wait_lines(tmp_path / "preempted" / "metrics.jsonl", 12)
    warn(preempted)
    final = wait_done(preempted)
    assert final["JobState"] == "COMPLETED" and int(final["Restarts"]) == 1, final
    log = (tmp_path / f"out-{preempted}.txt").read_text()
    assert "Slurm's warning (SIGUSR2): the ranks are told to save and stop (SIGTERM)" in log
    assert "checkpoint (signal SIGTERM)" in log and "requeueing job" in log and "resuming from" in log
    assert same_weights(straight_smoke_2x4, weights(tmp_path / "preempted"))


@pytest.mark.usefixtures("slurm_cluster")
def test_a_real_time_limit_warns_checkpoints_and_stops(data_root, tmp_path):
    """-t 1 with --signal=B:USR2@40: Slurm's own warning 20 s in, to the batch shell; with no requeue left the job
    ends, exit 3 (FAILED: an afterok job would wait)."""
    env = environment(tmp_path, HPC_MAX_REQUEUES="0")
    job = sbatch(env, tmp_path, "-t", "1", "--signal=B:USR2@40", "-N", "1", "--ntasks-per-node=2",
                 "jobs/resnet152.sbatch", "--config", SMOKE, "--data-root", str(data_root), "--epochs", "500",
                 "--no-profile", "--run-dir", str(tmp_path / "run"))
    final = wait_done(job, 180)
    assert final["JobState"] == "FAILED" and final["ExitCode"] == "3:0", final
    log = (tmp_path / f"out-{job}.txt").read_text()
    info = json.loads((tmp_path / "run" / "checkpoints" / "last.json").read_text())
    # a warning that lands on a step already saved (an epoch's end) says so in the same words
    assert "checkpoint (signal SIGTERM)" in log and "stopped by signal, checkpoint written" in log, log[-2000:]
    assert "stopped after 0 requeues" in log and info["step"] > 0


@pytest.mark.usefixtures("slurm_cluster")
def test_the_container_runs_every_task_and_the_batch_shell_requeues_for_it(data_root, tmp_path):
    """A profile with an image: each task runs under `shifter --image=... --module=gpu,nccl-plugin`. Inside,
    as in a real container, there is no scontrol: on the warning the ranks only leave their mark, and the
    batch shell (outside, the one place a job is requeued) requeues the job; it resumes and completes."""
    log = tmp_path / "shifter.log"
    stand_in(tmp_path, "shifter", f'echo "$@" >> {log}\nwhile [ $# -gt 0 ]; do case "$1" in --*) shift;; '
             f'*) break;; esac; done\nPATH="{tmp_path / "inside"}:$PATH" exec "$@"')
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "scontrol").write_text("#!/bin/sh\necho \"scontrol: command not found\" >&2\nexit 127\n")
    (tmp_path / "inside" / "scontrol").chmod(0o755)
    # NERSC's sbatch knows --image through shifter's SPANK plugin; this one does not: a stand-in sbatch
    # records the script's image line and hands the real sbatch the script without it.
    images = tmp_path / "images.log"
    real = shutil.which("sbatch")
    stand_in(tmp_path, "sbatch", f'grep "^#SBATCH --image" "$1" >> {images}\n'  # submitit runs `sbatch SCRIPT`
             f'grep -v "^#SBATCH --image" "$1" > {tmp_path / "plain.sh"}\nexec {real} {tmp_path / "plain.sh"}')
    site = profile(tmp_path, image="nersc/pytorch:24.08.01")
    env = environment(tmp_path)
    r = submit(env, "--profile", str(site), "--nodes", "1", "--gpus", "2", "--account", "m1_g", "--config", SMOKE,
               "--data-root", str(data_root), "--runs-dir", str(tmp_path / "runs"), "--epochs", "4", "--no-profile",
               "--set", "train.log_every_steps=1", "--export", f"ALL,PATH={env['PATH']}")
    assert r.returncode == 0, r.stderr
    (job,) = re.findall(r"^job (\S+): run dir", r.stdout, flags=re.M)
    run_dir = tmp_path / "runs" / "tiny" / job
    wait_lines(run_dir / "metrics.jsonl", 5)
    warn(job)
    final = wait_done(job)
    assert final["JobState"] == "COMPLETED" and int(final["Restarts"]) == 1, final
    assert images.read_text() == "#SBATCH --image=nersc/pytorch:24.08.01\n"  # once: the requeue keeps it
    calls = log.read_text().splitlines()
    assert calls and all(c.startswith("--image=nersc/pytorch:24.08.01 --module=gpu,nccl-plugin python -m hpc.rank "
                                      f"--run-dir {run_dir}") for c in calls)
    text = (run_dir / f"{job}_0_log.err").read_text()
    assert "scontrol requeue" not in text  # nothing requeues inside the step
    assert "requeued from the batch shell" in (run_dir / f"{job}_0_log.out").read_text() + text
    assert json.loads((run_dir / "summary.json").read_text())["ranks"][0]["complete"]


# NCCL's line for each choice, as it writes them (see tests/unit/launch/test_site.py).
NCCL = {"Socket": "nid001:811:811 [0] NCCL INFO Using network Socket\n",
        "AWS Libfabric": "nid001:811:811 [0] NCCL INFO Using network AWS Libfabric\n"}


@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("network", list(NCCL))
def test_a_two_node_run_on_sockets_stops_at_start_up(data_root, tmp_path, network):
    # The CPU cluster has no NCCL: its files, as it writes them where the run asks (NCCL_DEBUG_FILE's
    # nccl.rank<R>.%h.%p.log in the run's logs/), are there before the ranks look
    (tmp_path / "run" / "logs").mkdir(parents=True)
    for rank in range(4):
        (tmp_path / "run" / "logs" / f"nccl.rank{rank}.nid001.811.log").write_text(NCCL[network])
    env = environment(tmp_path)
    job = sbatch(env, tmp_path, "-N", "2", "--ntasks-per-node=2", "jobs/resnet152.sbatch", "--config", SMOKE,
                 "--data-root", str(data_root), "--max-steps", "2", "--no-profile", "--run-dir", str(tmp_path / "run"))
    final = wait_done(job, 300)
    log = (tmp_path / f"out-{job}.txt").read_text()
    if network == "Socket":
        assert final["ExitCode"] == "2:0", final
        said = [line for line in log.splitlines() if line.startswith("hpc.train: error:")]  # each rank's own line
        assert len(said) == 4 and all("NCCL uses TCP sockets between the 2 nodes" in line for line in said), log
        # no training was recorded; the run's summary (its runners', issue 50) names the first rank to stop
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["outcome"] == "failed" and "NCCL uses TCP sockets" in summary["failure"], summary["failure"]
        assert "Traceback" not in log and not (tmp_path / "run" / "checkpoints" / "last.pt").exists()
    else:
        assert final["JobState"] == "COMPLETED", log[-2000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert {r["nccl_network"] for r in summary["ranks"]} == {"AWS Libfabric"}
        assert summary["ranks"][0]["env"]["NCCL_NET"] == "AWS Libfabric"  # the guard, on a 2-node job only


@pytest.mark.usefixtures("slurm_cluster")
def test_the_sbatch_script_runs_every_task_in_the_profiles_container(data_root, tmp_path):
    """jobs/resnet152.sbatch takes the container from the profile (HPC_PROFILE) as hpc.submit does."""
    log = tmp_path / "shifter.log"
    stand_in(tmp_path, "shifter", f'echo "$@" >> {log}\nwhile [ $# -gt 0 ]; do case "$1" in --*) shift;; '
             f'*) break;; esac; done\nexec "$@"')
    site = profile(tmp_path, image="nersc/pytorch:24.08.01")
    env = environment(tmp_path, HPC_PROFILE=str(site))
    job = sbatch(env, tmp_path, "-N", "1", "--ntasks-per-node=2", "jobs/resnet152.sbatch", "--config", SMOKE,
                 "--data-root", str(data_root), "--max-steps", "2", "--no-profile", "--run-dir", str(tmp_path / "run"))
    final = wait_done(job, 300)
    assert final["JobState"] == "COMPLETED", (tmp_path / f"out-{job}.txt").read_text()[-2000:]
    calls = log.read_text().splitlines()  # each task: the per-rank runner, whose task is the training (issue 50)
    assert len(calls) == 2 and all(c.startswith("--image=nersc/pytorch:24.08.01 --module=gpu,nccl-plugin python -m "
                                                f"hpc.rank --run-dir {tmp_path / 'run'}") for c in calls), calls
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["ranks"][0]["complete"]
