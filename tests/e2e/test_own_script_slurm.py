"""Your own script on the local Slurm cluster (issue 39): 2 nodes x 2 tasks, gloo on the CPU. Every rank gets
torchrun's contract, checked against Slurm's own layout; a SIGTERM from Slurm requeues a script that saves,
and it ends with the weights of an uninterrupted run; a failing rank is named; jobs/run.sbatch runs the
same script with srun and with torchrun; a sweep of a command reaches its report in one command."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_slurm_jobs import job_state, wait_gone, warn

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(PY).parent}:{os.environ['PATH']}")
TWO_BY_TWO = ["--nodes", "2", "--gpus", "2", "--account", "m1234_g", "--export", "ALL,OMP_NUM_THREADS=1"]
CONTRACT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# A probe, not a user's script: prints what its process was given (its stdout is the rank's own log).
PROBE = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
         f"{list(CONTRACT)!r} + ['SLURM_JOB_NODELIST', 'SLURM_PROCID', 'SLURM_NODEID']}}}}))")


def submit(*args, timeout=600):
    return subprocess.run([PY, "-m", "hpc.submit", *args], capture_output=True, text=True, cwd=REPO, env=ENV,
                          timeout=timeout)


def run_dir_of(stdout: str) -> Path:
    return Path(re.findall(r"^job \S+: run dir (\S+)", stdout, flags=re.M)[-1])


def hostnames(expression: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", expression], capture_output=True, text=True,
                          check=True).stdout.split()


def test_every_rank_gets_torchruns_contract_from_slurm_and_its_words_verbatim(slurm_cluster, tmp_path):
    words = ["a b", "$HOME", "*", ";", "{batch}", "--"]
    r = submit(*TWO_BY_TWO, "--runs-dir", str(tmp_path), "--no-profile", "--wait", "--", PY, "-c", PROBE, *words)
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_dir_of(r.stdout)
    seen = {rank: json.loads((run / "logs" / f"rank{rank}.out").read_text()) for rank in range(4)}
    hosts = hostnames(seen[0]["env"]["SLURM_JOB_NODELIST"])
    assert len(hosts) == 2
    for rank, said in seen.items():
        env = said["env"]
        assert said["argv"] == words  # no shell in between: nothing expanded, split or dropped
        assert env["RANK"] == env["SLURM_PROCID"] == str(rank) and env["WORLD_SIZE"] == "4"
        # Slurm's block layout: tasks 0-1 on the first node, 2-3 on the second
        assert env["GROUP_RANK"] == env["SLURM_NODEID"] == str(rank // 2)
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank % 2), "2")
        assert env["MASTER_ADDR"] == hosts[0] and env["MASTER_PORT"] == seen[0]["env"]["MASTER_PORT"]


# Two nodes of one task each: bit-identical weights need an all-reduce that sums in the same order after the
# restart. At 2x2 the resumed run ends within 1.5e-8 of the uninterrupted one, not bit-identical (seen on
# 2026-11-25, also here with --local at 4 ranks, never at 2): DDP rebuilds its gradient buckets after the
# first step of every start, and with 3+ ranks a changed place in the bucket changes a sum's order.
TWO_BY_ONE = ["--nodes", "2", "--gpus", "1", "--account", "m1234_g", "--export", "ALL,OMP_NUM_THREADS=1"]


def test_a_signal_requeues_the_script_and_it_ends_with_the_uninterrupted_weights(slurm_cluster, tmp_path):
    script = [PY, str(SCRIPTS / "torchrun_ddp.py"), "--epochs", "3"]
    whole = submit(*TWO_BY_ONE, "--runs-dir", str(tmp_path / "a"), "--no-profile", "--wait", "--", *script,
                   "--ckpt", str(tmp_path / "a.ck"), "--out", str(tmp_path / "a.pt"))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    proc = subprocess.Popen([PY, "-m", "hpc.submit", *TWO_BY_ONE, "--runs-dir", str(tmp_path / "b"), "--wait", "--",
                             *script, "--ckpt", str(tmp_path / "b.ck"), "--out", str(tmp_path / "b.pt"),
                             "--step-sleep", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=ENV)
    deadline = time.monotonic() + 180
    while not list((tmp_path / "b").glob("*/*/logs/rank0.out")) or "epoch 0" not in \
            next((tmp_path / "b").glob("*/*/logs/rank0.out")).read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    run = next((tmp_path / "b").glob("*/*/logs/rank0.out")).parents[1]
    warn(run.name)  # the time limit's warning: the batch shell tells the tasks (SIGTERM)
    wait_gone(run.name, 300, hurry_requeue=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    said = (run / "logs" / "rank0.out").read_text()
    assert "SIGTERM: saved epoch" in said and "rank 0: resumed at epoch" in said
    assert job_state(run.name)["Restarts"] == "1"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["attempt"] == f"{run.name}.1.0"
    a, b = torch.load(tmp_path / "a.pt", weights_only=True), torch.load(tmp_path / "b.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_failing_rank_on_the_second_node_is_named_and_ends_the_job(slurm_cluster, tmp_path):
    r = submit(*TWO_BY_TWO, "--runs-dir", str(tmp_path), "--no-profile", "--wait", "--",
               PY, str(SCRIPTS / "crash_ddp.py"), "--crash-rank", "2", "--steps", "100000")
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "FAILED" in x]
    assert re.search(r"FAILED: rank 2 failed first \(on \S+, local rank 0\): exit 1: .*ValueError: bad batch at step 3",
                     line), line
    run = run_dir_of(r.stdout)
    # submitit's wait ends at the failing task's result; Slurm then ends the job's other tasks (srun's
    # --kill-on-bad-exit), which takes seconds, not the rest of the job's time
    wait_gone(run.name, 60)
    assert job_state(run.name)["JobState"] == "FAILED"
    outcome = subprocess.run([PY, "-m", "hpc.rank", "--run-dir", str(run), "--outcome"], capture_output=True,
                             text=True, env=ENV)
    assert outcome.returncode == 1 and "failed: rank 2 failed first" in outcome.stdout


# A user's script as many are written: on SIGTERM rank 0 saves (slowly: a big checkpoint) and exits 3, the
# others exit 3 at once, with no barrier between them.
SLOW_SAVE = """import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while not stop:
    time.sleep(0.05)
if os.environ["RANK"] == "0":
    time.sleep(8)  # longer than the cluster's KillWait (5 s): srun's kill of a step would land mid-save
    open(sys.argv[1], "w").write("saved")
sys.exit(3)
"""


def test_the_first_rank_to_stop_does_not_cut_a_peers_save_short(slurm_cluster, tmp_path):
    """A stop (exit 3) is not a failure to srun: its --kill-on-bad-exit, there for a failing rank, must not
    kill rank 0 while it still saves because rank 1 stopped first (seen in CI as a job that ended 137)."""
    script, saved = tmp_path / "slow_save.py", tmp_path / "saved"
    script.write_text(SLOW_SAVE)
    r = subprocess.run(["sbatch", "--parsable", "--export=ALL,HPC_MAX_REQUEUES=0,HPC_NO_PROFILE=1", "-N", "1",
                        "--ntasks-per-node=2", "-o", str(tmp_path / "out-%j.txt"), str(REPO / "jobs" / "run.sbatch"),
                        PY, str(script), str(saved)], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    logs = tmp_path / "runs" / "slow_save" / job / "logs"
    deadline = time.monotonic() + 120
    while not all("ready" in (p.read_text() if p.exists() else "") for p in (logs / "rank0.out", logs / "rank1.out")):
        assert time.monotonic() < deadline and job_state(job).get("JobState") in ("PENDING", "RUNNING"), job_state(job)
        time.sleep(0.1)
    warn(job)  # the batch shell tells every task of the step (SIGTERM) at once
    wait_gone(job, 120)
    log = (tmp_path / f"out-{job}.txt").read_text()
    state = job_state(job)
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "3:0"), log[-3000:]  # the batch shell's 3
    assert saved.read_text() == "saved", log[-3000:]
    summary = json.loads((tmp_path / "runs" / "slow_save" / job / "summary.json").read_text())
    assert [(r["rank"], r["kind"], r["exit_code"]) for r in summary["ranks"]] == [(0, "stopped", 3), (1, "stopped", 3)]
    assert summary["outcome"] == "stopped" and "stopped after 0 requeues" in log


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_run_sbatch_runs_a_users_script_unchanged(slurm_cluster, tmp_path, launcher):
    r = subprocess.run(["sbatch", "--parsable", f"--export=ALL,OMP_NUM_THREADS=1,HPC_LAUNCHER={launcher}", "-N", "2",
                        "--ntasks-per-node=2", "-o", str(tmp_path / "out-%j.txt"), str(REPO / "jobs" / "run.sbatch"),
                        PY, str(SCRIPTS / "torchrun_ddp.py"), "--ckpt", str(tmp_path / "c.pt"), "--out",
                        str(tmp_path / "w.pt")], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    wait_gone(job, 300)
    log = (tmp_path / f"out-{job}.txt").read_text()
    assert job_state(job)["JobState"] == "COMPLETED", log[-3000:]
    assert f"hpc.batch: runs/torchrun_ddp/{job}: done" in log  # the batch shell's line (hpc/launch/batch.py)
    summary = json.loads((tmp_path / "runs" / "torchrun_ddp" / job / "summary.json").read_text())
    expected = "torchrun" if launcher == "torchrun" else "slurm"
    assert [(r["rank"], r["launcher"], r["node_rank"], r["local_rank"]) for r in summary["ranks"]] == [
        (rank, expected, rank // 2, rank % 2) for rank in range(4)]
    assert len(list((tmp_path / "runs" / "torchrun_ddp" / job / "traces").glob("rank*.pt.trace.json"))) == 4


def test_a_sweep_of_a_command_reaches_its_report_on_slurm_in_one_command(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: paper\n  batch_sizes: [8, 16]\n  gpus: [1, 2]\ncommand:\n"
                     "  args: [--batch-size, '{batch}']\nprofiler:\n  wait: 1\n  warmup: 1\n  active: 2\n")
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--account", "m1_g", "--runs-dir",
                        str(tmp_path / "runs"), "--export", "ALL,OMP_NUM_THREADS=1", "--wait", "--",
                        PY, str(SCRIPTS / "paper_ddp.py"), "--data-size-factor", "0.5"],
                       capture_output=True, text=True, cwd=REPO, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (index,) = (tmp_path / "runs" / "paper").glob("sweep-*/index.json")
    status = subprocess.run([PY, "-m", "hpc.study", "status", str(index.parent), "--format", "json"],
                            capture_output=True, text=True, env=ENV, timeout=120)
    rows = json.loads(status.stdout)
    assert sorted((p["batch_size"], p["gpus"], p["state"]) for p in rows) == [
        (8, 1, "done"), (8, 2, "done"), (16, 1, "done"), (16, 2, "done")]
    assert (index.parent / "analysis" / "report.html").is_file() and "| paper_ddp.py |" in r.stdout


# A user's script that fails once at one point (lr 0.01, seed 2), then runs tests/scripts/torchrun_ddp.py, which
# takes --lr and has no seed: what it trains depends on its lr alone.
FAIL_ONCE = """import os, runpy, sys
words = sys.argv[1:]
lr, seed = words[words.index("--lr") + 1], words.pop(words.index("--seed") + 1)
words.remove("--seed")
mark = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failed-once")
if (lr, seed) == ("0.01", "2") and not os.path.exists(mark):
    open(mark, "w").close()
    sys.exit("failing once, at lr 0.01 and seed 2")
sys.argv = [%r, *words]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_scripts_lr_and_seed_swept_in_one_array_reach_one_report_and_a_failed_point_reruns_alone(
    slurm_cluster, tmp_path
):
    """Issue 75: --lr {lr} --seed {seed} after --, 2 x 3 points in one study (lr from the file, seed from
    --axis, its replicas); the point that failed is resubmitted alone. The oracle is the script's own
    weights: its learning rate changes them, a seed it never reads does not."""
    sweep, script = tmp_path / "sweep.yaml", tmp_path / "fail_once.py"
    script.write_text(FAIL_ONCE % str(SCRIPTS / "torchrun_ddp.py"))
    sweep.write_text("sweep:\n  name: lrseed\n  batch_sizes: [16]\n  gpus: [1]\n  data_fractions: [1]\n"
                     "  axes:\n    lr: [0.1, 0.01]\n  replicas: seed\ncommand:\n  args: [--epochs, '1', --out, '{run_dir}/w.pt']\n"
                     "profiler:\n  wait: 1\n  warmup: 1\n  active: 2\n")
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--account", "m1_g", "--axis", "seed=1,2,3",
                        "--runs-dir", str(tmp_path / "runs"), "--export", "ALL,OMP_NUM_THREADS=1", "--wait", "--",
                        PY, str(script), "--lr", "{lr}", "--seed", "{seed}"],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (index,) = (tmp_path / "runs" / "lrseed").glob("sweep-*/index.json")

    def status() -> dict:
        said = subprocess.run([PY, "-m", "hpc.study", "status", str(index.parent), "--format", "json"],
                              capture_output=True, text=True, env=ENV, timeout=120)
        return {(p["lr"], p["seed"]): p for p in json.loads(said.stdout)}

    first = status()
    assert {k: p["state"] for k, p in first.items()} == {**{(lr, seed): "done" for lr in (0.1, 0.01) for seed in
                                                            (1, 2, 3)}, (0.01, 2): "failed"}, first
    table = subprocess.run([PY, "-m", "hpc.study", "status", str(index.parent)], capture_output=True, text=True,
                           env=ENV, timeout=120).stdout
    assert table.splitlines()[0].split()[:6] == ["data_fraction", "batch_size", "gpus", "nodes", "lr", "seed"], table
    assert "| lr=0.1, seed=2 |" in (index.parent / "analysis" / "sweep.md").read_text()
    again = subprocess.run([PY, "-m", "hpc.study", "resubmit", str(index.parent), "--failed", "--account", "m1_g",
                            "--export", "ALL,OMP_NUM_THREADS=1", "--wait"], capture_output=True, text=True,
                           cwd=tmp_path, env=ENV, timeout=900)
    assert again.returncode == 0 and "resubmitting 1 point(s)" in again.stdout, again.stdout + again.stderr
    rows = status()
    assert all(p["state"] == "done" for p in rows.values()), rows
    assert {k: p["job_id"] for k, p in rows.items() if k != (0.01, 2)} == {
        k: p["job_id"] for k, p in first.items() if k != (0.01, 2)}  # the others untouched
    assert rows[(0.01, 2)]["job_id"] != first[(0.01, 2)]["job_id"]
    weights = {k: torch.load(Path(p["run_dir"]) / "w.pt", weights_only=True) for k, p in rows.items()}
    same = lambda a, b: all(torch.equal(weights[a][k], weights[b][k]) for k in weights[a])  # noqa: E731
    assert same((0.1, 1), (0.1, 2)) and same((0.01, 1), (0.01, 2)) and not same((0.1, 1), (0.01, 1))
    why = (index.parent / "analysis" / "why.md").read_text()  # the report rebuilt after the resubmission
    replicas = why.split("## Replicas", 1)[1].split("\n## ", 1)[0]
    assert [line.split("|")[2:4] for line in replicas.splitlines() if "| fraction 1" in line] == [
        [" lr=0.01 ", " 3 "], [" lr=0.1 ", " 3 "]], replicas
    noise = why.split("## Beyond the run-to-run noise?", 1)[1]
    assert "fraction 1, batch 16, 1 rank(s): lr=0.01 against lr=0.1: step time (ms) " in noise, noise  # a script: no images/s


@pytest.mark.parametrize("axis, said", [
    ("train.lrr=0.1,0.01", "sweep point train.lrr=0.1: unknown key train.lrr"),
    ("seed=1,2", "sweep.axes.seed: the command never uses {seed}"),
    ("batch=8,16", "swept by the study's own list: sweep.batch_sizes"),
])
def test_a_bad_axis_is_refused_before_anything_is_submitted(slurm_cluster, tmp_path, axis, said):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: bad\n  batch_sizes: [16]\n  gpus: [1]\n")
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    words = ["--", PY, str(SCRIPTS / "torchrun_ddp.py"), "--lr", "{lr}"] if axis.startswith("seed") else []
    extra = ["--axis", "lr=0.1,0.01"] if words else []
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--account", "m1_g", "--axis", axis, *extra,
                        "--runs-dir", str(tmp_path / "runs"), *words], capture_output=True, text=True, cwd=tmp_path,
                       env=ENV, timeout=300)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()  # nothing written
    # and nothing submitted: no job of the sweep's name (bad-1gpu, its one shape's array) in the queue or the
    # accounting since the command started
    queued = subprocess.run(["squeue", "-h", "-n", "bad-1gpu"], capture_output=True, text=True, check=True).stdout
    accounted = subprocess.run(["sacct", "-n", "-X", "-S", since, "--name", "bad-1gpu", "-o", "JobID"],
                               capture_output=True, text=True, check=True).stdout
    assert queued.strip() == accounted.strip() == "", (queued, accounted)
