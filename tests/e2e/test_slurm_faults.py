"""Faults of the scheduler: a controller that does not answer, a requeue that fails inside the job, and a
job requeued or cancelled from outside. The first are stand-ins on PATH (a squeue, sbatch or scontrol
that fails as Slurm's do when slurmctld is down: their messages are Slurm 22.05's); the last run on the
local cluster (tests/slurm/cluster.sh) with the real scancel and scontrol."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import found, has_lines, processes, wait_until
from test_slurm_jobs import job_state, wait_gone, warn
from trainrun import same_weights, weights

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
SMOKE = str(REPO / "profiles" / "smoke.yaml")
DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def stand_ins(folder: Path, **scripts: str) -> dict:
    """An environment whose PATH finds these commands first (name -> shell body)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return dict(os.environ, PATH=f"{folder}:{Path(PY).parent}:{os.environ['PATH']}", OMP_NUM_THREADS="1")


def hpc(env: dict, module: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", module, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def made_sweep(root: Path) -> Path:
    """A sweep directory as hpc.study writes it: one point done, one half-way (its checkpoint at step 4 of
    8: running, or crashed; only the queue can say), one never started."""
    sweep = root / "sweep-1"
    points = [{"data_fraction": 1, "batch_size": b, "gpus": 1, "nodes": 1, "job_id": f"41_{i}", "run_dir": f"41_{i}"}
              for i, b in enumerate((8, 16, 32))]
    (sweep / "41_0").mkdir(parents=True)
    (sweep / "41_0" / "summary.json").write_text(json.dumps({"outcome": "done", "ranks": [{"rank": 0, "complete": True,
                                                                                       "steps": 8}]}))
    (sweep / "41_1" / "checkpoints").mkdir(parents=True)
    (sweep / "41_1" / "checkpoints" / "last.json").write_text(json.dumps({"step": 4, "stop_at": 8}))
    (sweep / "sweep.yaml").write_text((REPO / "profiles" / "study-smoke.yaml").read_text())
    (sweep / "index.json").write_text(json.dumps({"sweep": {}, "cluster": "perlmutter", "points": points}))
    return sweep


def test_a_silent_controller_makes_status_unknown_and_resubmit_refuse(tmp_path):
    env = stand_ins(tmp_path / "bin", squeue=f'echo "{DOWN}" >&2; exit 1',
                    sbatch='echo "sbatch must not be called" >&2; exit 1')
    sweep = made_sweep(tmp_path)
    index_before = (sweep / "index.json").read_text()
    status = hpc(env, "hpc.study", "status", str(sweep))
    assert status.returncode == 1, status.stdout + status.stderr
    rows = {line.split()[4]: line.split()[5] for line in status.stdout.splitlines()[1:] if line.startswith(" ")}
    assert rows == {"41_0": "done", "41_1": "unknown", "41_2": "unknown"}, status.stdout  # never "failed"
    (line,) = status.stderr.strip().splitlines()
    assert "squeue failed (exit 1: " + DOWN in line and "2 point(s) shown as unknown" in line
    again = hpc(env, "hpc.study", "resubmit", str(sweep), "--failed", "--missing", "--account", "m1_g")
    assert again.returncode == 1
    (line,) = again.stderr.strip().splitlines()
    assert "not resubmitting while the queue cannot be read" in line and "Traceback" not in again.stderr
    assert (sweep / "index.json").read_text() == index_before


def test_a_silent_controller_no_point_needed_leaves_the_status_whole(tmp_path):
    """Every point settled by its run directory (done): the queue's silence changes no answer, so the
    status is whole (exit 0, no line), also while another user's restart has the controller away. One
    point that needs the queue is enough for the line and exit 1."""
    env = stand_ins(tmp_path / "bin", squeue=f'echo "{DOWN}" >&2; exit 1')
    sweep = made_sweep(tmp_path)
    index = json.loads((sweep / "index.json").read_text())
    (sweep / "index.json").write_text(json.dumps({**index, "points": index["points"][:1]}))  # the done one
    status = hpc(env, "hpc.study", "status", str(sweep))
    assert status.returncode == 0 and status.stderr == "", status.stdout + status.stderr
    assert [line.split()[4:6] for line in status.stdout.splitlines()[1:] if line.startswith(" ")] == [
        ["41_0", "done"]], status.stdout
    (sweep / "index.json").write_text(json.dumps({**index, "points": index["points"][:2]}))  # and one half-way
    status = hpc(env, "hpc.study", "status", str(sweep))
    assert status.returncode == 1 and "; 1 point(s) shown as unknown" in status.stderr, status.stdout + status.stderr


def test_an_sbatch_that_cannot_reach_the_controller_is_one_line_and_leaves_nothing(tmp_path):
    env = stand_ins(tmp_path / "bin", sbatch='echo "sbatch: error: Batch job submission failed: Unable to contact '
                                             'slurm controller (connect failure)" >&2; exit 1')
    runs = tmp_path / "runs"
    for args in (["hpc.study", "run", "profiles/study-smoke.yaml"], ["hpc.submit", "--config", SMOKE]):
        r = hpc(env, *args, "--account", "m1_g", "--runs-dir", str(runs))
        assert r.returncode == 1, r.stdout + r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "sbatch could not submit" in line and "Unable to contact slurm controller" in line
        assert "nothing was submitted" in line and "Traceback" not in r.stderr
        assert not runs.exists(), list(runs.rglob("*"))  # no sweep, no pickles, no scripts


# --- on the local cluster ---------------------------------------------------------------------------------

slurm = [pytest.mark.slurm, pytest.mark.slow]
CONTROLLER_DOWN_FOR_REQUEUE = (
    'if [ "$1" = requeue ]; then echo "scontrol: error: Unable to contact slurm controller (connect failure)" >&2; '
    'exit 1; fi\nexec /usr/bin/scontrol "$@"')


def wait_for_steps(metrics: Path, steps: int, timeout: float = 180) -> None:
    wait_until(lambda: has_lines(metrics, steps), f"{steps} records in {metrics}", timeout)


@pytest.mark.parametrize("how", ["sbatch", "submitit"])
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.slurm
@pytest.mark.slow
def test_a_requeue_that_fails_inside_the_job_is_one_line_and_keeps_the_checkpoint(data_root, tmp_path, how):
    """The time limit's warning (SIGUSR2 to the batch shell): the ranks checkpoint and the job asks `scontrol requeue`, which fails
    (the controller is down, or no scontrol in the container): one line in the log, not a traceback."""
    env = stand_ins(tmp_path / "bin", scontrol=CONTROLLER_DOWN_FOR_REQUEUE)
    train = ["--config", SMOKE, "--data-root", str(data_root), "--epochs", "300", "--no-profile",
             "--set", "train.log_every_steps=1"]
    if how == "sbatch":
        run_dir = tmp_path / "run"
        r = subprocess.run(["sbatch", "--parsable", "--export=ALL", "-N", "1", "--ntasks-per-node=2", "-o",
                            str(tmp_path / "out-%j.txt"), "jobs/resnet152.sbatch", *train, "--run-dir", str(run_dir)],
                           capture_output=True, text=True, cwd=REPO, env=env)
        job = r.stdout.strip()
        log = tmp_path / f"out-{job}.txt"
    else:
        r = hpc(env, "hpc.submit", "--nodes", "1", "--gpus", "2", "--account", "m1_g", "--runs-dir", str(tmp_path),
                "--export", f"ALL,PATH={env['PATH']}", *train)
        (job,) = re.findall(r"^job (\S+): run dir", r.stdout, flags=re.M)
        run_dir = tmp_path / "tiny" / job
        log = run_dir / f"{job}_0_log.err"
    assert r.returncode == 0, r.stderr
    wait_for_steps(run_dir / "metrics.jsonl", 3)
    warn(job)
    wait_gone(job, 180)
    state = job_state(job)
    assert state["Restarts"] == "0", state  # not requeued: it could not be
    text = log.read_text()
    said = [line for line in text.splitlines() if "could not requeue itself" in line]
    assert len(said) == 1 and "Unable to contact slurm controller" in said[0], text[-2000:]
    assert f"resume with: python -m hpc.submit --resume {run_dir}" in said[0], said[0]
    assert "CalledProcessError" not in text and "Traceback" not in text, text[-3000:]
    steps = json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"]
    assert steps > 0 and (run_dir / "checkpoints" / "last.pt").exists()


@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_requeued_from_outside_checkpoints_resumes_and_matches(data_root, tmp_path, straight_smoke_2x4):
    """`scontrol requeue` of a running job (an operator, or a preemption that requeues): Slurm sends SIGTERM,
    the ranks checkpoint within the grace time, the job runs again and resumes to the uninterrupted weights."""
    env = stand_ins(tmp_path / "bin")
    train = ["--config", SMOKE, "--data-root", str(data_root), "--epochs", "4", "--no-profile",
             "--set", "train.log_every_steps=1"]
    r = subprocess.run(["sbatch", "--parsable", "--export=ALL", "-N", "1", "--ntasks-per-node=2", "-o",
                        str(tmp_path / "requeued-%j.txt"), "jobs/resnet152.sbatch", *train, "--run-dir",
                        str(tmp_path / "requeued")], capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    wait_for_steps(tmp_path / "requeued" / "metrics.jsonl", 5)
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_gone(job, 600, hurry_requeue=True)
    state = job_state(job)
    assert state["JobState"] == "COMPLETED" and int(state["Restarts"]) >= 1, state
    log = (tmp_path / f"requeued-{job}.txt").read_text()
    assert "checkpoint (signal SIGTERM)" in log and "resuming from" in log, log[-3000:]
    assert same_weights(straight_smoke_2x4, weights(tmp_path / "requeued"))


def lose_node_while_running(job: str, run_dir: Path) -> int:
    """nid002 set DOWN under a running 2-node job (as Slurm does when a node stops answering): Slurm kills
    its tasks and requeues the job, which waits for two nodes. The node comes back once the old tasks are
    gone and it is done with them (a node resumed while Slurm still kills the job's old step there kills
    the new one). Returns the checkpoint step on disk when the node went (its last, or the stop's)."""
    try:
        subprocess.run(["scontrol", "update", "NodeName=nid002", "State=DOWN", "Reason=test-lost-node"], check=True)
        wait_until(lambda: int(job_state(job)["Restarts"]) == 1, f"job {job} requeued by Slurm", 120, every_s=0.5)
        wait_until(lambda: not (job_state(job)["JobState"] == "COMPLETING"
                                or any(str(run_dir) in cmd for cmd in processes().values())
                                or "comp" in subprocess.run(["sinfo", "-h", "-n", "nid002", "-o", "%t"],
                                                            capture_output=True, text=True).stdout),
                   f"job {job}'s old tasks gone", 120, every_s=0.5)
        # slurmd's own cleanup of the old steps after the states above say done: their slurmstepd processes
        wait_until(lambda: not [c for c in processes().values() if f"slurmstepd: [{job}." in c],
                   f"job {job}'s old steps' slurmstepd gone", 60, every_s=0.2)
        return json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"]
    finally:
        subprocess.run(["scontrol", "update", "NodeName=nid002", "State=RESUME"], capture_output=True)


@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("tasks_per_node", [1, 2])
def test_a_lost_node_requeues_the_job_which_resumes_from_its_checkpoint(data_root, tmp_path, tasks_per_node,
                                                                     straight_smoke_2x4):
    """A 2-node job (2 tasks each) loses nid002 mid-run: the node is set DOWN (`scontrol update ... state=down`,
    as Slurm does when a node stops answering), which kills its tasks; Slurm requeues the job itself (the
    script's --requeue; the survivors' exit is not what requeues it), the job waits for two nodes, runs
    again when nid002 is back, and resumes from the last checkpoint to the end. The oracle: the same
    training run without the fault: with 2 ranks (one task a node) the same weights bit for bit
    (straight_smoke_2x4). With 4 ranks (a job of its own beside it) they are not: the resumed run's first
    step reduces the gradients in DDP's initial buckets where the uninterrupted run had rebuilt them, a
    float32 rounding apart that the steps after it grow (7.9e-4 at most after 50 steps, measured here);
    the test then bounds the difference and says so."""
    env = stand_ins(tmp_path / "bin")
    train = ["--config", SMOKE, "--data-root", str(data_root), "--epochs", "4", "--no-profile",
             "--set", "train.log_every_steps=1", "--set", "train.checkpoint_every_steps=4"]
    jobs = {}
    placed = {"lost": "--nodelist=nid[001-002]"}  # the faulted job; nid002 is the node lost
    if tasks_per_node == 2:  # the 4-rank oracle is a job of its own, beside it on two other nodes
        placed["straight"] = "--exclude=nid[001-002]"
    for name, nodes in placed.items():
        r = subprocess.run(["sbatch", "--parsable", "--export=ALL", "-N", "2", f"--ntasks-per-node={tasks_per_node}",
                            nodes, "-o", str(tmp_path / f"{name}-%j.txt"), "jobs/resnet152.sbatch", *train,
                            "--run-dir", str(tmp_path / name)], capture_output=True, text=True, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr
        jobs[name] = r.stdout.strip()
    wait_for_steps(tmp_path / "lost" / "metrics.jsonl", 9)
    kept = lose_node_while_running(jobs["lost"], tmp_path / "lost")
    wait_gone(jobs["lost"], 600, hurry_requeue=True)
    if "straight" in jobs:
        wait_gone(jobs["straight"], 300)
        assert job_state(jobs["straight"])["JobState"] == "COMPLETED", job_state(jobs["straight"])
    state = job_state(jobs["lost"])
    assert state["JobState"] == "COMPLETED" and int(state["Restarts"]) == 1, state
    log = (tmp_path / f"lost-{jobs['lost']}.txt").read_text()
    resumed = int(re.match(r".*, step (\d+)$", log.split("resuming from", 1)[1].splitlines()[0])[1])
    assert resumed == kept, (kept, resumed)  # the checkpoint on disk when the node went (its last, or the stop's)
    summary = json.loads((tmp_path / "lost" / "summary.json").read_text())
    assert all(r["complete"] for r in summary["ranks"]) and len(summary["ranks"]) == 2 * tasks_per_node
    b = weights(tmp_path / "lost")
    if tasks_per_node == 1:
        assert same_weights(straight_smoke_2x4, b)  # 2 ranks: bit for bit
    else:  # 4 ranks: the first resumed step's rounding, grown over the 50 steps after it (measured: 7.9e-4)
        a = weights(tmp_path / "straight")
        worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        assert a.keys() == b.keys() and worst <= 1e-2, worst


def rank_pid(job: str, rank: int) -> int | None:
    """The pid of rank `rank`'s training process in a submitit job: the task its runner started (its
    environment says the job and the rank; the runner, a submitit process, has no RANK)."""
    for pid, cmd in processes().items():
        if "-m hpc.train" not in cmd:
            continue
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if {f"SLURM_JOB_ID={job}".encode(), f"RANK={rank}".encode()} <= env:
            return pid
    return None


@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.slurm
@pytest.mark.slow
def test_a_frozen_rank_0_under_submitit_is_requeued_and_resumes(data_root, tmp_path, straight_smoke_2x4):
    """hpc.submit on 2 nodes, a task each; rank 0 is stopped from outside (SIGSTOP: alive and silent, holding
    the step; it hosts the run's store, so nothing answers for it). Rank 1 names it within the collective
    timeout, asks for the requeue (rank 0 cannot) and exits 5, so srun ends the step, the frozen task with
    it; the batch shell requeues the job (the one place a job is requeued, issue 60), and the job runs again
    from its checkpoint to the weights of the same job run without the fault (2 ranks: bit for bit).
    Before any of this, the job held its nodes to its time limit."""
    env = stand_ins(tmp_path / "bin")
    # slow-step: each step 0.3 s longer on both ranks (the same arithmetic), so the run outlasts the freeze
    common = ["--nodes", "2", "--gpus", "1", "--account", "m1_g", "--config", SMOKE, "--data-root", str(data_root),
              "--export", "ALL,OMP_NUM_THREADS=1", "--export", "ALL,HPC_FAULT_INJECT=slow-step:300", "--epochs", "4",
              "--no-profile", "--set", "train.log_every_steps=1", "--set", "train.checkpoint_every_steps=4",
              "--set", "train.collective_timeout_s=10"]
    frozen = hpc(env, "hpc.submit", *common, "--runs-dir", str(tmp_path / "b"))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    job, run_dir = re.findall(r"^job (\S+): run dir (\S+)", frozen.stdout, flags=re.M)[-1]
    wait_for_steps(Path(run_dir) / "metrics.jsonl", 9)
    victim = wait_until(lambda: rank_pid(job, 0), "rank 0's process", 30)
    os.kill(victim, signal.SIGSTOP)
    wait_until(lambda: int(job_state(job).get("Restarts", 0)) == 1, f"job {job} requeued", 180, every_s=1)
    wait_gone(job, 600, hurry_requeue=True)
    state = job_state(job)
    assert state["JobState"] == "COMPLETED" and int(state["Restarts"]) == 1, state
    said = " ".join(p.read_text(errors="replace") for p in Path(run_dir).rglob("*log.*"))
    assert f"hpc.submit: job {job} requeued from the batch shell" in said, said[-3000:]
    assert same_weights(straight_smoke_2x4, weights(Path(run_dir)))


LOST_SWEEP = """
sweep: {name: lost, data_fractions: [1], batch_sizes: [16], gpus: [1], nodes: [2]}
data: {source: synthetic, synth_train: 256, synth_test: 64}
model: {arch: tiny}
train: {epochs: 6, lr: 0.05, warmup_epochs: 0, log_every_steps: 1, checkpoint_every_steps: 4}
profiler: {enabled: false}
"""


@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.slurm
@pytest.mark.slow
def test_a_study_point_that_loses_a_node_shows_requeued_then_done(data_root, tmp_path):
    """hpc.study with one 2-node point (each step 0.3 s longer: slow-step, so the run outlasts the fault);
    nid002 is lost mid-run as above: while Slurm holds the requeued job, `hpc.study status` shows the
    point requeued (pending again, with a checkpoint), and done once it has resumed to its end."""
    env = stand_ins(tmp_path / "bin")
    (tmp_path / "sweep.yaml").write_text(LOST_SWEEP)
    run = hpc(env, "hpc.study", "run", str(tmp_path / "sweep.yaml"), "--account", "m1_g", "--data-root",
              str(data_root), "--runs-dir", str(tmp_path / "runs"), "--export", "ALL,OMP_NUM_THREADS=1", "--export",
              "HPC_FAULT_INJECT=slow-step:300")
    assert run.returncode == 0, run.stdout + run.stderr
    (sweep,) = {p.parent for p in found(tmp_path / "runs", "index.json")}

    def point() -> dict:
        status = hpc(env, "hpc.study", "status", str(sweep), "--format", "json")
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)
        return row

    metrics = wait_until(lambda: next(iter(found(sweep, "metrics.jsonl")), None), "the point's metrics.jsonl")
    wait_for_steps(metrics, 9)
    job = str(point()["job_id"])
    assert point()["state"] == "running"
    lose_node_while_running(job, metrics.parent)
    held = point()  # held by Slurm after its requeue, its checkpoint on disk; its requeues as Slurm counts them
    assert (held["state"], held["requeues"]) == ("requeued", int(job_state(job)["Restarts"])) == ("requeued", 1), held
    wait_gone(job, 600, hurry_requeue=True)
    row = point()
    summary = json.loads((metrics.parent / "summary.json").read_text())
    assert row["state"] == "done" and row["steps"] == summary["ranks"][0]["steps"], (row, summary["ranks"][0])
    assert row["requeues"] == 1, row  # the second start's own count (SLURM_RESTART_COUNT), the queue gone
    assert all(r["complete"] and r["epochs_completed"] == 6 for r in summary["ranks"])  # LOST_SWEEP's epochs
