"""Faults lose nothing: each fault injected for real into hpc.train on the CPU, and what is on disk checked
afterwards. Signals arrive at chosen moments (HPC_FAULT_INJECT=signal:SIG@MOMENT:STEP: the process sends
itself a real signal there, so each moment is hit every time); the disk fills up (a small tmpfs) or is
read-only (a read-only bind mount); two processes write one run directory; a rank dies or hangs. After
each: the files parse, nothing listed is missing, no temp file survives the next start, and the same
command resumes to the same final step with the weights an uninterrupted run ends with.

The tmpfs and bind-mount cases need root (tests/run.sh runs as root in CI); they skip, saying so, without it.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_module, wait_until
from hpc.core.rundir import RunPaths
from hpc.core.summary import decode_run_record
from hpc.training.checkpoint import load_checkpoint
from trainrun import SMOKE, metrics, same_weights, start_ranks, wait_all, weights

pytestmark = pytest.mark.slow
STEPS = 32  # 2 epochs of 16 steps: 1000 images, batch 64, one rank
ARGS = ("--epochs", "2", "--batch-size", "64", "--set", "train.checkpoint_every_steps=5")


def command(data_root, run_dir, *extra):
    return ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir), *ARGS, *extra]


def run(data_root, run_dir, faults="", world=1, *extra, timeout=300):
    env = {"HPC_FAULT_INJECT": faults} if faults else {}
    return wait_all(start_ranks(world, command(data_root, run_dir, *extra), env), timeout=timeout)


@pytest.fixture(scope="module")
def straight_dir(data_root, tmp_path_factory):
    """The uninterrupted run every faulted one must end like."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    assert run(data_root, run_dir)[0][0] == 0
    return run_dir


@pytest.fixture(scope="module")
def straight(straight_dir):
    return weights(straight_dir)


def check_on_disk(run_dir: Path) -> dict:
    """What a fault may leave: every file parses, the checkpoint passes its checksum, summary.json lists
    only traces that exist. Returns the checkpoint's step and the summary (either may be None)."""
    paths = RunPaths(run_dir)
    summary = json.loads(paths.summary.read_text()) if paths.summary.exists() else None
    for rank in (summary or {}).get("ranks", []):
        listed = rank["profiler"]["traces"]
        assert all((paths.traces / name).is_file() and ".tmp" not in name for name in listed), listed
        for name in listed:
            json.loads((paths.traces / name).read_text())
    ckpt = load_checkpoint(paths.checkpoint)  # raises on a checksum that does not match
    if paths.checkpoint_info.exists():
        assert json.loads(paths.checkpoint_info.read_text())["step"] <= (ckpt or {}).get("step", 0)
    if paths.metrics.exists():
        records = [json.loads(line) for line in paths.metrics.read_text().splitlines()]  # every line whole
        assert all(isinstance(r, dict) for r in records)
    return {"step": ckpt["step"] if ckpt else None, "summary": summary}


def check_finished(run_dir: Path, reference: dict) -> dict:
    """Resumed to the end: the final step, the uninterrupted run's weights, each step recorded once, no debris."""
    paths = RunPaths(run_dir)
    state = check_on_disk(run_dir)
    assert state["step"] == STEPS and state["summary"]["ranks"][0]["complete"], state
    assert decode_run_record(paths.summary.read_bytes()).outcome == "done"  # the typed record, strictly
    assert same_weights(weights(run_dir), reference)
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    keys = [(r["kind"], r["step"]) for r in records]
    assert len(keys) == len(set(keys)) and ("epoch", STEPS) in keys, keys
    assert paths.debris() == [] and not paths.lock.exists()
    return state


# (signal, moment[:step], the faulted run's exit code, the checkpoint it leaves)
MOMENTS = [
    ("KILL", "start", -signal.SIGKILL, None),
    ("KILL", "step:7", -signal.SIGKILL, 5),
    ("KILL", "checkpoint:10", -signal.SIGKILL, 5),  # half of checkpoint 10 on disk: last.pt is still 5's
    ("KILL", "trace", -signal.SIGKILL, None),  # the trace exported, not yet published
    ("KILL", "eval:16", -signal.SIGKILL, 15),
    ("KILL", "summary", -signal.SIGKILL, STEPS),  # after the last checkpoint: the rerun writes the summary
    ("TERM", "start", 3, 1),
    ("TERM", "step:7", 3, 7),
    ("INT", "checkpoint:10", 3, 11),  # the signal during a save: that save completes, the next step stops
    ("TERM", "checkpoint:10", 3, 11),  # the same, the save in flight on the background writer's thread
    ("USR2", "trace", 3, 4),
    ("TERM", "eval:16", 3, 16),  # evaluation ends, the epoch's checkpoint is the stop's
    ("TERM", f"step:{STEPS}", 0, STEPS),  # during the last step: the run is complete, not stopped
    ("TERM", "summary", 0, STEPS),
]


@pytest.mark.parametrize("sig, moment, rc, kept", MOMENTS, ids=[f"{s}@{m}" for s, m, _, _ in MOMENTS])
def test_a_signal_at_any_moment_loses_nothing(data_root, tmp_path, straight, sig, moment, rc, kept):
    run_dir = tmp_path / "run"
    (code, out, err), = run(data_root, run_dir, f"signal:{sig}@{moment}")
    assert code == rc, (out[-800:], err[-800:])
    assert "Traceback" not in err
    state = check_on_disk(run_dir)
    assert state["step"] == kept
    if rc == 3:
        assert "stopped by signal, checkpoint written" in out
        assert out.count(f", step {kept} -> ") == 1  # no second checkpoint of the same step
        assert f"checkpoint (signal SIG{sig})" in out  # said even where its step was already saved (eval)
    (code, out, err), = run(data_root, run_dir)  # the same command, no fault
    assert code == 0, (out[-800:], err[-800:])
    finished = check_finished(run_dir, straight)
    if moment == "summary" and sig == "KILL":
        assert "summary.json is missing or out of date: writing it" in out and finished["summary"]["recovered"]
    if rc == 0:
        assert "already complete at step 32 of 32; nothing to do" in out


def caught_signals(pid: int) -> int:
    """The process's caught-signal mask (/proc/PID/status SigCgt), 0 once it is gone."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return 0
    return int(line.split()[1], 16)


def torch_mapped(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("sig", ["USR2", "TERM"])
def test_a_signal_during_start_up_is_a_clean_stop(data_root, tmp_path, straight, sig):
    """A time limit's SIGUSR2 (or a preemption's SIGTERM) while the process still imports torch (seconds
    on a loaded node): caught by the door before that import (hpc/core/stop.py), so the run stops after
    its first step with a checkpoint, exit 3, and the same command finishes it. The signal is sent the
    moment the handler is in place, and the test checks torch was not loaded yet: without the early
    handler the default action killed the process (seen in CI: exit 140 under Slurm)."""
    run_dir = tmp_path / "run"
    proc, = start_ranks(1, command(data_root, run_dir))
    bit = 1 << (getattr(signal, f"SIG{sig}") - 1)
    deadline = time.monotonic() + 60
    while not caught_signals(proc.pid) & bit and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    early = not torch_mapped(proc.pid)
    proc.send_signal(getattr(signal, f"SIG{sig}"))
    (code, out, err), = wait_all([proc])
    assert early, "the stop handler was installed only after torch was loaded"
    assert code == 3 and "Traceback" not in err, (out[-800:], err[-800:])
    assert "stopped by signal, checkpoint written" in out
    assert check_on_disk(run_dir)["step"] == 1
    (code, out, err), = run(data_root, run_dir)
    assert code == 0, (out[-800:], err[-800:])
    check_finished(run_dir, straight)


def test_a_rerun_finishes_what_a_kill_after_the_last_checkpoint_left_and_status_agrees(data_root, tmp_path):
    """SIGKILL between the last checkpoint and summary.json: the directory says "done, summary missing"
    (hpc/core/summary.py run_state, which hpc.study status reads); the rerun writes the summary and exits 0."""
    from hpc.core.summary import run_state

    run_dir = tmp_path / "run"
    assert run(data_root, run_dir, "signal:KILL@summary", 1, "--no-profile")[0][0] == -signal.SIGKILL
    state = run_state(RunPaths(run_dir))
    assert (state.leaves, state.step, state.summary_current) == ("done", STEPS, False)
    assert run(data_root, run_dir, "", 1, "--no-profile")[0][0] == 0
    state = run_state(RunPaths(run_dir))
    assert (state.leaves, state.step, state.summary_current) == ("done", STEPS, True)


def test_a_kill_before_the_last_evaluation_is_recorded_leaves_it_owed_and_a_rerun_does_it(
    data_root, tmp_path, straight_dir
):
    """A checkpoint at the last step (every 8 steps: step 32 is one) is written before the last epoch's
    evaluation; SIGKILL in that evaluation leaves a run at its last step whose evaluation never happened.
    The directory must not say done (hpc.study status reads it), and the rerun must evaluate, record the
    epoch and write the final checkpoint and summary as the uninterrupted run did: the same weights, and
    the same evaluation numbers as the uninterrupted run's record (the oracle: that run's own metrics)."""
    from hpc.core.summary import run_state

    run_dir, every_8 = tmp_path / "run", ("--set", "train.checkpoint_every_steps=8")
    (code, out, err), = run(data_root, run_dir, f"signal:KILL@eval:{STEPS}", 1, *every_8)
    assert code == -signal.SIGKILL, (out[-800:], err[-800:])
    # the last step's checkpoint is written in the background while the evaluation runs, as in every run:
    # the kill leaves it whole (its epoch's end owed) or, still in flight, the one before (the files say which)
    on_disk = check_on_disk(run_dir)["step"]
    assert on_disk in (STEPS, STEPS - 8) and not RunPaths(run_dir).summary.exists()
    state = run_state(RunPaths(run_dir))
    assert (state.leaves, state.step, state.stop_at) == ("stopped", on_disk, STEPS)
    (code, out, err), = run(data_root, run_dir, "", 1, *every_8)
    assert code == 0 and "nothing to do" not in out, (out[-800:], err[-800:])
    assert out.count("epoch 2 done in") == 1 and "checkpoint (epoch end): epoch 2, batch 0, step 32" in out
    check_finished(run_dir, weights(straight_dir))
    assert run_state(RunPaths(run_dir)) == run_state(RunPaths(straight_dir))
    ends = [[r for r in metrics(d) if r["kind"] == "epoch"] for d in (run_dir, straight_dir)]
    evals = [[{k: v for k, v in r.items() if k.startswith("eval_")} for r in e] for e in ends]
    assert len(ends[0]) == 2 and evals[0] == evals[1] and evals[0][1], evals


# --- the disk -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def mounted(target: Path, *options: str):
    """A tmpfs (options: size=...; the owner's alone, as a run's folder is), a read-only bind mount of
    `target` itself ("ro-bind"), or a file bound on `target` ("bind=/dev/full"), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs or a read-only bind needs root (tests/run.sh runs as root)")
    if options[0].startswith("bind="):
        steps = [["mount", "--bind", options[0].split("=", 1)[1], str(target)]]
    elif options == ("ro-bind",):
        target.mkdir(parents=True, exist_ok=True)
        steps = [["mount", "--bind", str(target), str(target)], ["mount", "-o", "remount,ro,bind", str(target)]]
    else:
        target.mkdir(parents=True, exist_ok=True)
        steps = [["mount", "-t", "tmpfs", "-o", ",".join(["mode=0700", *options]), "tmpfs", str(target)]]
    for step in steps:
        r = subprocess.run(step, capture_output=True, text=True)
        if r.returncode:
            subprocess.run(["umount", str(target)], capture_output=True)
            pytest.skip(f"this machine refuses {' '.join(step)}: {r.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("hpc.train")]
    assert len(lines) == 1 and "Traceback" not in err, err[-1500:]
    return lines[0]


def test_a_full_disk_at_a_checkpoint_stops_in_one_line_and_keeps_the_previous(data_root, tmp_path, straight):
    """A 400 KiB tmpfs takes the first checkpoint (257 KiB) but not the second beside it."""
    with mounted(tmp_path / "small", "size=400k") as small:
        (code, out, err), = run(data_root, small / "run", "", 1, "--no-profile")
        assert code == 1
        line = one_line(err)
        assert "checkpoints/last.pt: could not be written (No space left on device); the previous version is intact" \
            in line
        assert check_on_disk(small / "run")["step"] == 5 and RunPaths(small / "run").debris() == []
        subprocess.run(["cp", "-a", str(small / "run"), str(tmp_path / "moved")], check=True)
    (code, out, err), = run(data_root, tmp_path / "moved", "", 1, "--no-profile")  # on a disk with room
    assert code == 0 and "resuming from" in out
    check_finished(tmp_path / "moved", straight)


def test_a_trace_the_full_disk_refused_is_said_and_never_listed(data_root, tmp_path):
    """Kineto only logs a failed export; the run says so, lists no temp file, and fails once complete. A
    600 KiB tmpfs: the trace with shapes recorded (782 KiB; without them 579 KiB, too close) does not fit,
    two checkpoints (2 x 257 KiB) do."""
    with mounted(tmp_path / "small", "size=600k") as small:
        (code, out, err), = run(data_root, small / "run", "", 1, "--max-steps", "8", "--set",
                                "profiler.record_shapes=true")
        assert code == 1
        line = one_line(err)
        assert "profiler trace(s) could not be written" in line and "(No space left on device)" in line
        assert "1 NOT written" in out
        summary = check_on_disk(small / "run")["summary"]
        profiler = summary["ranks"][0]["profiler"]
        assert profiler["traces"] == [] and profiler["failed"][0]["error"] == "No space left on device"
        assert os.listdir(small / "run" / "traces") == [] and RunPaths(small / "run").debris() == []


def test_a_read_only_checkpoint_folder_stops_in_one_line(data_root, tmp_path, straight):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    with mounted(run_dir / "checkpoints", "ro-bind"):
        (code, out, err), = run(data_root, run_dir, "", 1, "--no-profile")
        assert code == 1
        assert "last.pt: could not be written (Read-only file system); nothing was written" in one_line(err)
    (code, out, err), = run(data_root, run_dir, "", 1, "--no-profile")
    assert code == 0
    check_finished(run_dir, straight)
    with mounted(run_dir, "ro-bind"):  # a whole run directory read-only: refused before any work
        proc = run_module("hpc.train", *command(data_root, run_dir, "--no-profile"))
        assert proc.returncode == 2 and "Read-only file system" in one_line(proc.stderr)


def test_a_summary_that_cannot_be_written_is_one_line_and_a_rerun_writes_it(data_root, tmp_path, straight):
    run_dir = tmp_path / "run"
    (run_dir / "summary.json").mkdir(parents=True)  # the rename onto it fails (EISDIR), after all the training
    results = run(data_root, run_dir, "", 2, "--no-profile")
    assert [code for code, _, _ in results] == [1, 1]
    assert "summary.json: could not be written (Is a directory)" in one_line(results[0][2])
    assert "rank 0 could not write summary.json" in one_line(results[1][2])
    (run_dir / "summary.json").rmdir()
    results = run(data_root, run_dir, "", 2, "--no-profile")
    assert [code for code, _, _ in results] == [0, 0]
    assert "summary.json is missing or out of date: writing it" in results[0][1]


def test_a_metrics_line_the_disk_refuses_stops_every_rank(data_root, tmp_path):
    """metrics.jsonl is /dev/full (ENOSPC on every write, from the kernel; bind-mounted on the file: a log
    is never opened through a link, docs/security.md): rank 0 names the file, rank 1 learns it at the
    step's agreement; neither waits in a collective for the other."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").touch()
    with mounted(run_dir / "metrics.jsonl", "bind=/dev/full"):
        results = run(data_root, run_dir, "", 2, "--no-profile", timeout=120)
    assert [code for code, _, _ in results] == [1, 1]
    assert "metrics.jsonl: could not be written (No space left on device)" in results[0][2]
    assert "rank 0 could not write metrics.jsonl" in results[1][2]
    assert all("Traceback" not in err for _, _, err in results)


def test_analysis_on_a_full_disk_is_one_line_and_keeps_what_was_there(data_root, tmp_path):
    run_dir = tmp_path / "run"
    assert run(data_root, run_dir, "", 1, "--max-steps", "6")[0][0] == 0
    with mounted(tmp_path / "small", "size=64k") as small:
        (small / "report.html").write_text("an earlier report")
        proc = run_module("analysis", str(run_dir), "--report", "--out", str(small))
        assert proc.returncode == 1, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("analysis: error")]
        assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in proc.stderr
        assert (small / "report.html").read_text() == "an earlier report"
        assert not [p for p in small.rglob("*") if ".tmp" in p.name]


# --- two writers ----------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_naming_the_first(data_root, tmp_path, straight):
    run_dir = tmp_path / "run"
    first = start_ranks(1, command(data_root, run_dir, "--epochs", "400", "--no-profile"))
    wait_until(lambda: (run_dir / "metrics.jsonl").exists(), "the first run's metrics.jsonl", 120, every_s=0.1)
    second = run_module("hpc.train", *command(data_root, run_dir, "--epochs", "400", "--no-profile"))
    assert second.returncode == 2, second.stderr
    line = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(line) == 1 and f"in use by another run (pid {first[0].pid} on " in line[0]
    first[0].send_signal(signal.SIGTERM)
    (code, out, _), = wait_all(first)
    assert code == 3
    assert len(list((run_dir / "tensorboard").iterdir())) == 1  # one writer's event file, not two
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len({(r["kind"], r["step"]) for r in records}) == len(records)


# --- peers ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_peer_is_one_line_naming_it_and_a_rerun_resumes(data_root, tmp_path, victim):
    run_dir = tmp_path / "run"
    start = time.time()
    results = run(data_root, run_dir, f"signal:KILL@step:7@rank={victim}", 2, "--no-profile", timeout=120)
    survivor = 1 - victim
    assert results[victim][0] == -signal.SIGKILL and results[survivor][0] == 5, results
    assert time.time() - start < 90
    err = results[survivor][2]
    line = [line for line in err.splitlines() if line.strip()]
    assert len(line) == 1 and "Traceback" not in err, err
    assert f"rank {survivor} lost a peer during step 7: rank {victim} (pid " in line[0]
    # step 5's checkpoint is written in the background, as in every run: rank 0 killed at step 7 may have
    # died with it in flight. The line names what is on disk (the oracle: the files), where a rerun resumes.
    on_disk = RunPaths(run_dir).checkpoint.exists() and check_on_disk(run_dir)["step"]
    assert on_disk in ((5,) if victim == 1 else (5, False)), on_disk
    said = "last checkpoint: step 5" if on_disk else "no checkpoint yet: a rerun starts afresh"
    assert said in line[0] and f"logs/rank{survivor}.log" in line[0]
    assert "Traceback" in (run_dir / "logs" / f"rank{survivor}.log").read_text()
    results = run(data_root, run_dir, "", 2, "--no-profile")
    assert [code for code, _, _ in results] == [0, 0]
    assert check_on_disk(run_dir)["step"] == STEPS // 2 and RunPaths(run_dir).debris() == []  # 500 images a rank


TIMEOUT_S = 10  # train.collective_timeout_s in the frozen-rank tests: the bound is it plus SILENCE_S


@pytest.mark.parametrize("frozen, moment", [(1, "step:7"), (0, "step:7"), (1, "start")])
def test_a_frozen_rank_is_named_with_its_host_within_the_timeout(data_root, tmp_path, frozen, moment):
    """A rank stops itself (SIGSTOP: alive, silent) inside a step (its peer waits in the gradients'
    all-reduce) or before its first step (its peer waits for it at the first collective); the survivor
    ends within train.collective_timeout_s + the heartbeat's silence (hpc/training/distributed/rendezvous.py) with
    one line naming the frozen rank, its host and pid, and saying it is stopped (rank 0, which hosts the
    run's store, too). The oracle for the name: the pid the test itself started, and /proc's state T."""
    from hpc.training.distributed.rendezvous import SILENCE_S

    run_dir = tmp_path / "run"
    procs = start_ranks(2, command(data_root, run_dir, "--no-profile", "--set", f"train.collective_timeout_s={TIMEOUT_S}"),
                        {"HPC_FAULT_INJECT": f"signal:STOP@{moment}@rank={frozen}"})
    survivor = 1 - frozen
    try:
        deadline = time.monotonic() + 120
        while (Path(f"/proc/{procs[frozen].pid}/stat").read_text().split(")")[-1].split()[0] != "T"
               and time.monotonic() < deadline):
            time.sleep(0.05)
        stopped_at = time.monotonic()
        code, _, err = wait_all(procs[survivor:survivor + 1], timeout=120)[0]
        took_s = time.monotonic() - stopped_at
    finally:
        procs[frozen].kill()
        procs[frozen].wait()
    line = [x for x in err.splitlines() if x.strip()]
    assert code == 5 and len(line) == 1 and "Traceback" not in err, err
    who = f"rank {frozen} on {socket.gethostname()} (pid {procs[frozen].pid}, stopped: SIGSTOP or a debugger)"
    assert who in line[0] and ("Timed out" in line[0] or "Application timeout" in line[0]), line[0]
    assert ("which hosts the run's store" in line[0]) == (frozen == 0), line[0]
    assert took_s < TIMEOUT_S + SILENCE_S + 30, took_s  # the bound, with room for a loaded 2-core machine


@pytest.mark.parametrize("missing", [1, 0])
def test_a_rank_that_never_joins_is_named_within_the_timeout(data_root, tmp_path, missing):
    """One rank of two never starts: the other ends within train.collective_timeout_s (plus start-up)
    with one line naming it (rank 1: the store's sign-in; rank 0: nobody hosts the store)."""
    run_dir, came = tmp_path / "run", 1 - missing
    started = time.monotonic()
    procs = start_ranks(2, command(data_root, run_dir, "--no-profile", "--set", f"train.collective_timeout_s={TIMEOUT_S}"),
                        only=[came])
    code, _, err = wait_all(procs, timeout=180)[0]
    took_s = time.monotonic() - started
    line = [x for x in err.splitlines() if x.strip()]
    assert code == 5 and len(line) == 1 and "Traceback" not in err, err
    if missing == 1:
        assert f"rank 0: the group did not form within {TIMEOUT_S} s" in line[0] and "rank 1 never joined" in line[0]
    else:
        assert "rank 1 could not reach the run's store at 127.0.0.1:" in line[0], line[0]
        assert "rank 0, which hosts it, never started there or cannot be reached" in line[0], line[0]
    assert took_s < TIMEOUT_S + 60, took_s  # the timeout, torch's import and the set-up before the group


def test_torchs_memory_warning_comes_at_most_once_and_is_said_in_our_words(data_root, tmp_path):
    """A profiled CPU run records memory (profiler.profile_memory): torch's CPU allocator prints, from C++,
    'Memory block of unknown size was allocated before the profiling started' (a block made before the
    window, freed inside it). It comes at most once a process, and the run says once what it means."""
    (code, out, err), = run(data_root, tmp_path / "run")
    assert code == 0, err[-800:]
    assert err.count("Memory block of unknown size") <= 1, err[-800:]
    assert out.count("profiler: memory is recorded from the window's start") == 1, out[-800:]
