"""hpc.submit --local: the README's main command path, through submitit's local executor (no Slurm)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, processes, run_module


def test_local_two_ranks_through_submitit(tmp_path):
    proc = run_module("hpc.submit", "--local", "--gpus", "2", "--config", "profiles/smoke.yaml", "--data-root",
                      str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs"), "--max-steps", "4", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # it ends by saying where the run, its ranks' logs, its traces and its summary are
    tail = proc.stdout.strip().splitlines()[-5:]
    assert tail[0].endswith(": done") and [line.split(":")[0].strip() for line in tail[1:]] == [
        "run", "logs", "traces", "summary"]
    run_dir = tmp_path / "runs" / "tiny" / tail[0].split()[1].rstrip(":")
    assert tail[1].split()[-1] == str(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["launcher"] for r in summary["ranks"]] == ["submitit-local", "submitit-local"]
    assert len(list((run_dir / "traces").glob("rank*.pt.trace.json"))) == 2
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny").iterdir()) == [run_dir.name]  # no '%j' left over
    assert "step 4/4" in proc.stdout  # rank 0's progress was followed
    # ... after the numbers of the run it just made, from its traces: one row per rank
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("profiled steps, per rank"))
    # in human units, the unit in the header (the raw integers stay in JSON and CSV)
    assert lines[at + 1].split() == ["rank", "steps", "cpu_time", "(ms)", "cuda_time", "(ms)", "kernel_calls",
                                     "peak_gpu_mem", "(MiB)", "peak_cpu_mem", "(MiB)"]
    rows = [line.split() for line in lines[at + 2:at + 4]]
    assert [r[0] for r in rows] == ["0", "1"] and all(int(r[1]) == 2 and float(r[2]) > 0 for r in rows)
    assert all(r[3:6] == ["-", "-", "-"] and 100 < float(r[6]) < 4096 for r in rows)  # a CPU run: no CUDA numbers
    # ... and what bounds it, in words: a CPU run has no GPU to judge, and says so rather than guess
    assert lines[at + 4].startswith("verdict: unknown: no device activity in the trace (a CPU run)")
    assert lines[at + 5] == tail[0]


def _processes_of(folder: Path) -> list[str]:
    """Command lines of live processes that name the run's folder (the controller, the ranks)."""
    return [cmd for pid, cmd in processes().items() if str(folder) in cmd and pid != os.getpid()]


def _started(data_root: Path, runs: Path, epochs: int, output: int) -> tuple[subprocess.Popen, list[Path]]:
    """hpc.submit --local training the smoke profile for `epochs`, in a session of its own, once its run has
    logged 3 metrics lines (its ranks train); its metrics.jsonl found."""
    proc = subprocess.Popen([sys.executable, "-m", "hpc.submit", "--local", "--gpus", "2", "--config", "profiles/smoke.yaml",
                             "--data-root", str(data_root), "--runs-dir", str(runs), "--epochs", str(epochs),
                             "--no-profile", "--set", "train.log_every_steps=2"], cwd=REPO, stdout=output,
                            stderr=output, text=True, start_new_session=True)
    deadline = time.time() + 180
    metrics: list[Path] = []
    while time.time() < deadline and not any(len(m.read_text().splitlines()) >= 3 for m in metrics):
        metrics = list(runs.glob("tiny/*/metrics.jsonl"))
        time.sleep(0.2)
    assert metrics, "the run never started"
    return proc, metrics


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "ctrl-c, then plain torchrun"])
def test_stopping_a_local_run_stops_every_rank_and_says_how_to_resume(data_root, tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group: hpc.submit, submitit's controller, the ranks) or
    `timeout`'s SIGTERM (to hpc.submit alone): every rank checkpoints at a step boundary and exits, no
    process of the run is left, one line says what was kept and how to resume, exit 3; the printed
    command resumes the run to its end. Resumed instead with plain torchrun on the training (as the README
    allows, no runner), summary.json is that start's: done, every rank at the last step, the weights'
    digest the checkpoint's, the stopped start among the earlier ones (issue 60: it stayed the first's)."""
    runs = tmp_path / "runs"
    proc, metrics = _started(data_root, runs, 12, subprocess.PIPE)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out[-1000:] + err[-1000:]
    run_dir = metrics[0].parent
    assert "Traceback" not in out + err and not _processes_of(runs)  # submitit names the folder "tiny/%j"
    (line,) = [line for line in err.splitlines() if line.strip()]
    step = json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"]
    assert f"hpc: stopped (SIG{'INT' if how == 'ctrl-c' else 'TERM'}): {run_dir} holds a checkpoint at step {step} of " \
        f"384; resume with: python -m torch.distributed.run --standalone --nproc-per-node 2 -m hpc.rank --run-dir " \
        f"{run_dir}" in line  # the task again, by its runner (issue 50)
    assert 0 < step < 384 and (run_dir / "summary.json").exists()  # stopped, not requeued: summary says so
    if how.endswith("plain torchrun"):
        return _resumed_with_plain_torchrun(run_dir, line)
    resume = line.split("resume with: ", 1)[1].replace("python ", f"{sys.executable} ", 1)
    done = subprocess.run(resume, shell=True, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    said = (run_dir / "logs" / "rank0.out").read_text()  # the task's own lines, as its runner keeps them
    assert done.returncode == 0 and f"resuming from {run_dir}" in said, done.stdout[-1000:] + done.stderr[-1000:]
    assert f"hpc.rank: {run_dir}: done; the task's output: {run_dir / 'logs'}" in done.stdout
    assert json.loads((run_dir / "summary.json").read_text())["ranks"][0]["steps"] == 384


@pytest.mark.slow
def test_a_local_run_ends_with_its_submitter_even_killed_with_sigkill(data_root, tmp_path):
    """kill -9 of hpc.submit --local (no handler runs): its ranks' runners see it gone, stop their tasks at
    a step's end with a checkpoint, and nothing of the run is left running (ps is the oracle; issue 60: the
    ranks trained on to the end, detached, and an empty '%j' folder stayed). The summary says who stopped
    it, and it is not requeued."""
    runs = tmp_path / "runs"
    proc, metrics = _started(data_root, runs, 40, subprocess.DEVNULL)
    proc.kill()
    proc.wait()
    deadline = time.time() + 120
    while _processes_of(runs) and time.time() < deadline:
        time.sleep(1)
    assert not _processes_of(runs), _processes_of(runs)
    run_dir = metrics[0].parent
    summary = json.loads((run_dir / "summary.json").read_text())
    step = json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"]
    assert summary["outcome"] == "stopped" and [r["steps"] for r in summary["ranks"]] == [step, step], summary
    # the first runner to see it gone stops its task; its peer may stop with it (the training agrees a stop
    # across ranks) before its own runner looks: each says it saved and stopped, at least one why
    assert all(r["kind"] == "stopped" and "saved and stopped (exit 3)" in r["message"] for r in summary["ranks"])
    assert any(f"after its submitter hpc.submit (pid {proc.pid}) ended" in r["message"] for r in summary["ranks"])
    assert 0 < step < 40 * 32 and sorted(p.name for p in (runs / "tiny").iterdir()) == [run_dir.name]


def _resumed_with_plain_torchrun(run_dir: Path, stopped_line: str) -> None:
    import hashlib

    import torch

    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "hpc.train", "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-1000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    digest = hashlib.sha256()  # the checkpoint's weights, every tensor of the state in order, as the README says
    for tensor in torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["model"].values():
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    assert summary["outcome"] == "done" and [r["steps"] for r in summary["ranks"]] == [384, 384], summary
    assert {r["weights_sha256"] for r in summary["ranks"]} == {digest.hexdigest()}
    (earlier,) = summary["earlier"]
    assert earlier["outcome"] == "stopped" and earlier["attempt"] != summary["attempt"], (earlier, stopped_line)


def test_the_training_and_a_users_script_leave_the_same_run_directory(tmp_path):
    """One road (issue 50): the toolkit's training and an unmodified DDP script, each run here on 2 ranks,
    leave a run directory of the same layout and a summary.json with the same top-level keys, each rank
    saying how it ended, its exit code, its host, its traces and the profiler's cycles."""
    script = REPO / "tests" / "scripts" / "torchrun_ddp.py"
    runs = {"train": ["--config", "profiles/smoke.yaml", "--data-root", str(tmp_path / "data"), "--max-steps", "4"],
            "script": ["--", sys.executable, str(script), "--ckpt", str(tmp_path / "c.pt"), "--out", str(tmp_path / "w.pt")]}
    summaries, layouts = {}, {}
    for kind, argv in runs.items():
        proc = run_module("hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(tmp_path / kind), *argv, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        (run_dir,) = [p for p in (tmp_path / kind).glob("*/*") if p.is_dir()]
        summaries[kind] = json.loads((run_dir / "summary.json").read_text())
        layouts[kind] = {p.name for p in run_dir.iterdir() if not p.name.startswith(run_dir.name)}  # submitit's own
    assert set(summaries["train"]) == set(summaries["script"])
    assert {"task.json", "summary.json", "logs", "ranks", "traces"} <= layouts["train"] & layouts["script"]
    for kind, summary in summaries.items():
        assert summary["outcome"] == "done" and summary["kind"] == ("train" if kind == "train" else "command")
        for rank in summary["ranks"]:
            assert rank["kind"] == "ok" and rank["exit_code"] == 0 and rank["hostname"] and rank["complete"], kind
            assert rank["profiler"]["traces"] and rank["profiler"]["cycles"], (kind, rank["profiler"])


THREADS_SCRIPT = """import os, sys, torch
with open(os.path.join(sys.argv[1], "threads." + os.environ["RANK"]), "w") as f:
    f.write(str(torch.get_num_threads()))
"""


def test_a_rank_gets_its_share_of_the_machines_cores_as_torch_alone_would(tmp_path):
    """hpc.submit --local without OMP_NUM_THREADS: one rank gets as many threads as torch gives a process of
    its own here (the profile used to force one, and a one-rank ResNet152 step took 1.8x as long as under
    torchrun on 2 cores); two ranks share them and never oversubscribe the machine. The user's own value is
    kept. The oracle is torch's own thread count, read by a plain python."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    alone = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                           capture_output=True, text=True, check=True)
    cores = int(alone.stdout)
    assert cores >= 2, "a machine of one core cannot tell a share from one thread"  # CI's has 2
    (tmp_path / "threads.py").write_text(THREADS_SCRIPT)

    def threads(gpus: int, **extra: str) -> list[int]:
        out = tmp_path / f"out{gpus}{len(extra)}"
        out.mkdir()
        proc = subprocess.run([sys.executable, "-m", "hpc.submit", "--local", "--gpus", str(gpus), "--runs-dir",
                               str(tmp_path / "runs"), "--no-profile", "--", sys.executable,
                               str(tmp_path / "threads.py"), str(out)],
                              cwd=REPO, env={**env, **extra}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return [int((out / f"threads.{r}").read_text()) for r in range(gpus)]

    assert threads(1) == [cores]
    two = threads(2)
    assert sum(two) <= cores and min(two) >= 1, two
    assert threads(1, OMP_NUM_THREADS="1") == [1]  # the user's own value wins
