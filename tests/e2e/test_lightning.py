"""PyTorch Lightning as its documentation writes it (issue 52; tests/scripts/lightning_ddp.py: `L.Trainer(devices=2,
strategy="ddp")`, `ModelCheckpoint(save_last=True)`, `fit(ckpt_path="last")`), through `hpc.submit --local`:
two ranks, profiled (the window's steps against torch's own `Optimizer.step#` events: Lightning wraps the
optimizer), analysed; run from inside an outer Slurm job's shell (its SLURM_* variables, which Lightning's
SLURMEnvironment would read) it still sees this run's two ranks; stopped by SIGTERM (Lightning ends its loop
and exits 0 unfinished) it is `stopped`, not done, and the same command again resumes from Lightning's own
last.ckpt to the uninterrupted run's final weights (Lightning's digest printed by rank 0), here under
`cluster.launcher: torchrun` (Lightning's TorchElasticEnvironment). The same on the Slurm cluster:
tests/e2e/test_lightning_slurm.py."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_own_script import ENV, PY, REPO, assert_a_window_step_an_optimizer_step, run_dir_of
from hpc.core.rundir import RunPaths
from hpc.core.summary import decode_run_record, write_run_summary

# A test extra (pyproject's [test]): without it these tests fail to collect; they never vanish.
assert importlib.util.find_spec("lightning"), "Lightning is a test extra: pip install -e .[test]"
pytestmark = pytest.mark.slow
SCRIPT = REPO / "tests" / "scripts" / "lightning_ddp.py"
# An outer job's shell, as `salloc` or an sbatch script leaves it (8 tasks, this one the 6th).
OUTER_JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "8", "SLURM_PROCID": "5",
             "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "nid[001-002]",
             "SLURM_NTASKS_PER_NODE": "4"}


def lightning(runs: Path, root: Path, *extra: str, launcher: str = "srun") -> list[str]:
    return [PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(runs), "--set",
            f"cluster.launcher={launcher}", "--", PY, str(SCRIPT), "--devices", "2", "--epochs", "4", "--root",
            str(root), *extra]


def digest(stdout: str) -> str:
    return re.findall(r"final weights sha256 (\w+) after 32 steps", stdout)[-1]


def test_lightning_runs_profiled_stops_unfinished_and_resumes_to_the_uninterrupted_weights(tmp_path):
    whole = subprocess.run(lightning(tmp_path / "a", tmp_path / "ra"), capture_output=True, text=True, cwd=tmp_path,
                           env={**ENV, **OUTER_JOB}, timeout=600)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    run = run_dir_of(whole.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["world_size"] == 2
    # 256 samples, batch 16, 2 ranks, 4 epochs: 32 optimizer steps a rank, in one process group
    assert [(r["rank"], r["steps"], r["process_group"]) for r in summary["ranks"]] == [(0, 32, True), (1, 32, True)]
    for rank in (0, 1):  # Lightning's wrapped optimizer steps the real one: one window step each
        assert_a_window_step_an_optimizer_step(run, rank)
    analysed = subprocess.run([PY, "-m", "analysis", str(run)], capture_output=True, text=True, env=ENV, timeout=120)
    assert analysed.returncode == 0 and "Verdict:" in analysed.stdout, analysed.stderr

    # Steps of 2 s: Lightning 2.6 deadlocks its own ranks when one learns of a SIGTERM a step after another
    # (Lightning-AI/pytorch-lightning#20806; here rank 1's stop held back 0.5 s with 0.2 s steps: both killed
    # after the grace time, recorded `cancelled`, as CI's loaded 2 cores once did). Both ranks must be inside
    # the same step when the stop comes, or this tests Lightning's race and not the toolkit.
    cut = subprocess.Popen(lightning(tmp_path / "b", tmp_path / "rb", "--step-sleep", "2.0"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV)
    deadline = time.monotonic() + 300
    while not (tmp_path / "rb" / "checkpoints" / "last.ckpt").exists():  # Lightning's own, after epoch 0
        assert time.monotonic() < deadline and cut.poll() is None, cut.communicate()
        time.sleep(0.2)
    cut.send_signal(signal.SIGTERM)
    out, err = cut.communicate(timeout=300)
    assert "final weights sha256" not in out, out
    stopped = json.loads((run_dir_of(out) / "summary.json").read_text())
    assert stopped["outcome"] == "stopped", (stopped["ranks"], out[-2000:] + err[-2000:])
    assert all(r["kind"] == "stopped" and r["exit_code"] == 0 and "not known to have finished" in r["message"]
               for r in stopped["ranks"]), stopped["ranks"]
    # again, under torchrun's agent (Lightning's TorchElasticEnvironment then): the same world, the same weights
    again = subprocess.run(lightning(tmp_path / "b", tmp_path / "rb", launcher="torchrun"), capture_output=True,
                           text=True, cwd=tmp_path, env=ENV, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Restoring states from the checkpoint path at" in again.stdout + again.stderr
    assert digest(again.stdout) == digest(whole.stdout)
    resumed = json.loads((run_dir_of(again.stdout) / "summary.json").read_text())
    assert [(r["launcher"], r["process_group"]) for r in resumed["ranks"]] == [("torchrun", True)] * 2


def test_a_second_ctrl_c_kills_the_run_and_its_summary_still_says_how_every_rank_ended(tmp_path):
    """Ctrl-C twice (the toolkit's own line invites the second: "again to kill them") while Lightning trains:
    every process of the run is killed at once (ps is the oracle), and summary.json still parses and says
    how each rank ended: none `running` (issue 60: no summary.json at all, the exit records left running)."""
    runs = tmp_path / "runs"
    said = tmp_path / "said.txt"
    with open(said, "w") as sink:
        proc = subprocess.Popen(lightning(runs, tmp_path / "root", "--step-sleep", "0.2", "--epochs", "40"),
                                stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=ENV,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "root" / "checkpoints" / "last.ckpt").exists():  # Lightning's own, after epoch 0
        assert time.monotonic() < deadline and proc.poll() is None, said.read_text()[-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    while "(again to kill them)" not in said.read_text():  # the first stop taken: the toolkit says so
        assert time.monotonic() < deadline and proc.poll() is None, said.read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # the second: kill them
    proc.wait(timeout=120)
    out = said.read_text()
    run = run_dir_of(out)
    left = subprocess.run(["pgrep", "-f", str(runs)], capture_output=True, text=True).stdout.split()
    assert not left, left
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["ranks"]) == 2, summary
    # what the second stop does, and only it: every rank killed before it could say how it ended (one stop
    # alone lets them save and stop)
    assert [r["kind"] for r in summary["ranks"]] == ["lost", "lost"] and all(r.get("message") for r in
                                                                             summary["ranks"]), summary["ranks"]
    assert summary["outcome"] == "cancelled"  # a person stopped it (issue 73): nobody preempted anything
    written = (run / "summary.json").read_bytes()  # a function of the records: made again, the same file
    assert decode_run_record(written).outcome == summary["outcome"]  # the typed record (hpc/core/summary.py)
    (run / "summary.json").unlink()
    write_run_summary(RunPaths(run))
    assert (run / "summary.json").read_bytes() == written
