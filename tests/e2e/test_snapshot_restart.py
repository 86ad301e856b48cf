"""A torchrun-snapshot script (PyTorch's DDP tutorial series: tests/scripts/snapshot_ddp.py) under
`cluster.launcher: torchrun` (issue 52): stopped by Ctrl-C and started again by the same command, it
resumes from its snapshot; then one rank's script SIGKILLed mid-run: torchrun restarts the worker
group, which resumes from the snapshot and ends with the uninterrupted run's weights bit for bit; the
restart and the rank it lost are said in one line and in summary.json; the job ends within a bound;
nothing is left running. At the restart one worker starts 3 s late (a slow node): with torchrun's
shared store the restarted group then read the dead group's addresses (gloo: connection refused, and
a later restart hung in its set-up) - the agent's environment gives each start of the group a store
of its own (hpc/placement/torchrun.py's AGENT_ENV). Across two Slurm nodes:
tests/e2e/test_snapshot_restart_slurm.py."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_runner_signals import ENV, PY, REPO, wait_for

SNAPSHOT = REPO / "tests" / "scripts" / "snapshot_ddp.py"
ARGS = ["8", "1", "--step_sleep", "0.05"]  # 8 epochs of 32 steps a rank, a snapshot after each
# rank 1's script, in the restarted group only, starts late; exec keeps its pid the script's
LATE = 'if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && [ "$RANK" = 1 ]; then sleep 3; fi; exec "$0" "$@"'
RESTART_BOUND_S = 90  # from the kill to the job's end: the restart (seconds) and 5 epochs (about 10 s)


def straight_digest(folder: Path, nproc: int) -> str:
    """The oracle: the script run to its end by plain torchrun, nothing of the toolkit in it."""
    folder.mkdir()
    out = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                          str(SNAPSHOT), *ARGS[:2]], capture_output=True, text=True, cwd=folder,
                         env=dict(ENV, OMP_NUM_THREADS="1"), timeout=300).stdout
    return digest_in(out)


def digest_in(text: str) -> str:
    found = re.findall(r"final weights sha256 (\w+)", text)
    assert len(found) == 1, text[-2000:]
    return found[0]


def script_processes(cwd: Path) -> list[int]:
    """Live processes running the snapshot script in `cwd` (the runs of other tests have their own)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(SNAPSHOT).encode() in (proc / "cmdline").read_bytes() \
                    and os.readlink(proc / "cwd") == str(cwd):
                found.append(int(proc.name))
        except OSError:
            continue  # ended meanwhile
    return found


def rank_pid(run: Path, rank: int) -> int:
    return json.loads((run / "ranks" / f"rank{rank}.exit.json").read_text())["pid"]


def start_run(tmp_path: Path, here: Path) -> tuple[subprocess.Popen, Path]:
    """hpc.submit --local of the snapshot script under torchrun, in `here`; it and its run directory."""
    before = set((tmp_path / "runs" / "snap").glob("*"))
    proc = subprocess.Popen([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--name", "snap",
                             "--runs-dir", str(tmp_path / "runs"), "--set", "cluster.launcher=torchrun",
                             "--set", "cluster.max_restarts=2", "--", "sh", "-c", LATE, PY, str(SNAPSHOT), *ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=here, env=ENV)
    deadline = time.monotonic() + 120
    while not (runs := [p.parents[1] for p in (tmp_path / "runs" / "snap").glob("*/logs/rank0.out")
                        if p.parents[1] not in before]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return proc, runs[0]


def test_a_stopped_run_resumes_and_a_killed_rank_restarts_the_group_to_the_uninterrupted_weights(tmp_path):
    """Ctrl-C after the first snapshot, the same command again, one rank SIGKILLed after the fourth."""
    expected = straight_digest(tmp_path / "straight", 2)
    here = tmp_path / "here"
    here.mkdir()
    proc, first = start_run(tmp_path, here)
    wait_for(first / "logs" / "rank0.out", "Epoch 0 | Training snapshot saved", 120)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "hpc: stopped (SIGINT)" in err, out + err  # told to stop, not known saved
    assert json.loads((first / "summary.json").read_text())["outcome"] == "cancelled"  # a person's stop, unsaved
    assert script_processes(here) == []

    proc, run = start_run(tmp_path, here)  # the same command again: the script finds its snapshot
    wait_for(run / "logs" / "rank0.out", "Epoch 3 | Training snapshot saved", 120)
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        out, err = proc.communicate(timeout=RESTART_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        pytest.fail(f"no end {RESTART_BOUND_S} s after the kill: {proc.communicate(timeout=60)}")
    took_s = time.monotonic() - killed_at
    assert proc.returncode == 0 and f"job {run.name}: done" in out, out + err
    said = [line for line in err.splitlines() if "torchrun restarted the worker group" in line]
    assert len(said) == 1 and "1 time" in said[0] and "rank 1 (" in said[0] and "SIGKILL" in said[0], err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["attempt"] == f"{run.name}.0.1", summary
    (earlier,) = summary["earlier"]  # one restart: the first start's records kept
    assert earlier["attempt"] == f"{run.name}.0.0" and earlier["outcome"] == "failed", earlier
    assert earlier["first"].startswith("rank 1 (") and "SIGKILL: killed from outside" in earlier["first"], earlier
    records = [json.loads(p.read_text()) for p in (run / "ranks" / "earlier").iterdir()]
    kept = sorted((r["rank"], r["attempt"]) for r in records)
    assert kept == [(0, f"{run.name}.0.0"), (1, f"{run.name}.0.0")], kept  # every rank's end of the first start
    log = (run / "logs" / "rank0.out").read_text()
    resumed = re.findall(r"Resuming training from snapshot at Epoch (\d+)", log)
    assert len(resumed) == 2 and 1 <= int(resumed[0]) <= 3 and resumed[1] == "4", log  # no failed restart between
    assert digest_in(log) == expected
    assert script_processes(here) == []
    # profiled under torchrun, the restarted group too: its trace per rank, its table and verdict
    assert "profiled steps, per rank" in out and "verdict:" in out, out
    traced = sorted(p.name.split(".")[0] for p in (run / "traces").glob("*.pt.trace.json*"))
    assert traced == ["rank0", "rank0", "rank1", "rank1"], traced  # a window in each start of the group
    # the Flight Recorder's variables as this torch names them: no warning of ours on every rank's stderr
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated" not in (run / "logs" / "rank1.err").read_text()
    print(f"killed rank 1 at epoch 4: restarted and done {took_s:.1f} s later")
