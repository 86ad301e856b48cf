"""The parts faults go through, in-process and on real failures (no mocks): a write the system refuses,
/dev/full's ENOSPC, a lock held by a process killed with SIGKILL, a zombie peer, the fault hook's
grammar, and the words a dead peer's collective fails with (as gloo and NCCL print them). The
end-to-end fault tests (signals at chosen moments, a small tmpfs, two writers, killed ranks) are
tests/e2e/test_faults.py."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc.core.errors import UsageError, WriteError
from hpc.core.faults import Fault, parse_faults
from hpc.core.files import append_line, write_atomic
from hpc.core.lock import RunLock
from hpc.core.rundir import RunPaths, read_metrics, truncate_metrics
from hpc.core.summary import run_state
from hpc.training.distributed.group import _ended, pid_alive
from hpc.training.distributed.rendezvous import cause_of, is_peer_failure
from hpc.training import inject
from hpc.training.inject import Armed

REPO = Path(__file__).resolve().parents[3]


def test_a_refused_write_names_the_file_keeps_the_old_one_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "summary.json"
    target.mkdir()  # the rename onto it fails: IsADirectoryError, a real refusal by the system
    with pytest.raises(WriteError, match=r"summary.json: could not be written \(Is a directory\); the previous"):
        write_atomic(target, "{}")
    assert target.is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    with pytest.raises(WriteError, match=r"could not be written \(No such file or directory\); nothing was written"):
        write_atomic(tmp_path / "gone" / "x.json", "{}")


def test_a_line_cut_short_is_ended_and_a_full_disk_is_one_error(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"kind": "train", "step": 1}\n{"kind": "tr')  # a kill cut the second line short
    append_line(log, json.dumps({"kind": "train", "step": 2}))
    assert [r.step for r in read_metrics(log)] == [1, 2]
    with pytest.raises(WriteError, match=r"/dev/full: could not be written \(No space left on device\)"):
        append_line(Path("/dev/full"), "{}")  # the kernel's always-full device: ENOSPC on every write


def test_a_resume_drops_the_records_after_its_step(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n" for s in (4, 8, 12, 16)))
    assert truncate_metrics(log, 8) == 2
    assert [r.step for r in read_metrics(log)] == [4, 8]
    assert truncate_metrics(tmp_path / "none.jsonl", 8) == 0 and not (tmp_path / "none.jsonl").exists()


def test_a_resume_from_an_epochs_last_step_drops_that_epochs_end_record(tmp_path):
    """A checkpoint of step 16 taken before epoch 1's end (epoch 0 in it) must drop the end's record of
    step 16 (epoch 1 in it), which the resumed run writes again; one taken after the end keeps it."""
    log = tmp_path / "metrics.jsonl"
    records = [("train", 12, 0), ("train", 16, 0), ("epoch", 16, 1), ("train", 20, 1)]
    text = "".join(json.dumps({"kind": k, "step": s, "epoch": e}) + "\n" for k, s, e in records)
    log.write_text(text)
    assert truncate_metrics(log, 16, 0) == 2
    assert [(r.kind, r.step) for r in read_metrics(log)] == [("train", 12), ("train", 16)]
    log.write_text(text)
    assert truncate_metrics(log, 16, 1) == 1
    assert [(r.kind, r.step) for r in read_metrics(log)] == [("train", 12), ("train", 16), ("epoch", 16)]


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_blocks_nobody(tmp_path):
    first, second = RunLock(tmp_path / ".lock"), RunLock(tmp_path / ".lock")
    assert first.acquire("run A") is None
    with pytest.raises(UsageError, match=rf"run B: in use by another run \(pid {os.getpid()} on .* since "):
        second.acquire("run B")
    first.release()
    assert not (tmp_path / ".lock").exists()  # a run that ends leaves no lock file
    assert second.acquire("run B") is None
    second.release()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from hpc.core.lock import RunLock; "
        f"RunLock(Path({str(tmp_path / '.lock')!r})).acquire('x'); print('held', flush=True); time.sleep(60)")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UsageError, match=f"pid {holder.pid}"):
        RunLock(tmp_path / ".lock").acquire("run C")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    taker = RunLock(tmp_path / ".lock")
    assert taker.acquire("run C") is None  # the kernel dropped the dead holder's lock; its file stayed
    taker.release()


def test_debris_is_what_killed_writers_leave_and_nothing_else(tmp_path):
    paths = RunPaths(tmp_path)
    for name in ("checkpoints/.last.pt.tmp.123", "traces/rank0.1.pt.trace.json.tmp", "traces/.rank0.2.pt.trace.json"
                 ".tmp.9", ".summary.json.first.tmp.7", "checkpoints/last.pt", "traces/rank0.3.pt.trace.json",
                 "metrics.jsonl", ".lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert [str(p.relative_to(tmp_path)) for p in paths.debris()] == [
        ".summary.json.first.tmp.7", "checkpoints/.last.pt.tmp.123", "traces/.rank0.2.pt.trace.json.tmp.9",
        "traces/rank0.1.pt.trace.json.tmp"]
    assert paths.rank_traces(0) == ["rank0.3.pt.trace.json"]  # a temp file is never listed as a trace
    assert paths.is_run_or_empty()


def _state(tmp_path, summary=None, info=None):
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    (run / "checkpoints").mkdir(parents=True)
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if info is not None:
        (run / "checkpoints" / "last.json").write_text(json.dumps(info))
    return run_state(RunPaths(run))


def test_a_runs_state_comes_from_its_files(tmp_path):
    done = {"outcome": "done", "ranks": [{"rank": 0, "complete": True, "steps": 8}]}
    stopped = {"outcome": "stopped", "ranks": [{"rank": 0, "complete": False, "steps": 4}]}
    empty = _state(tmp_path)
    assert (empty.leaves, empty.step, empty.summary_current) == (None, None, False)
    s = _state(tmp_path, done, {"step": 8, "stop_at": 8})
    assert (s.leaves, s.step, s.summary_current, s.complete) == ("done", 8, True, True)
    s = _state(tmp_path, None, {"step": 8, "stop_at": 8})  # killed after its last checkpoint
    assert (s.leaves, s.step, s.summary_current) == ("done", 8, False)
    s = _state(tmp_path, stopped, {"step": 8, "stop_at": 8})  # stopped at 4, resumed, killed before the summary
    assert (s.leaves, s.summary_current) == ("done", False)
    s = _state(tmp_path, stopped, {"step": 4, "stop_at": 8})
    assert (s.leaves, s.step, s.summary_current) == ("stopped", 4, True)
    s = _state(tmp_path, None, {"step": 4, "stop_at": 8})  # crashed, or still running: the files cannot say
    assert (s.leaves, s.step, s.summary_current) == ("stopped", 4, False)
    assert _state(tmp_path, {"outcome": "oom", "ranks": []}).leaves == "oom"
    assert _state(tmp_path, done).leaves == "done"  # a run from before last.json existed


def test_the_fault_hook_names_a_signal_a_moment_a_step_and_a_rank():
    assert parse_faults("signal:KILL@checkpoint:10,signal:TERM@step@rank=1,kill-during-checkpoint") == (
        Fault("signal", 10, signal="KILL", moment="checkpoint"),
        Fault("signal", None, signal="TERM", moment="step", rank=1),
        Fault("signal", signal="KILL", moment="checkpoint", once_saved=True))
    for bad in ("signal:HUP@step", "signal:KILL@lunch", "signal:KILL@step:x", "signal:KILL"):
        with pytest.raises(UsageError, match="signal:SIG@MOMENT"):
            parse_faults(bad)
    armed = Armed(parse_faults("signal:TERM@step:8@rank=1,signal:USR2@trace,kill-during-checkpoint"), 1, lambda: 7)
    assert armed.due("step", 8) == [signal.SIGTERM]  # inside step 8: 7 done
    assert armed.due("trace", 7) == [signal.SIGUSR2] and armed.due("eval", 7) == []
    assert armed.due("checkpoint", 7, saved_before=False) == [] and armed.due("checkpoint", 7) == [signal.SIGKILL]
    assert Armed(parse_faults("signal:TERM@step:8@rank=1"), 0, lambda: 7).due("step", 8) == []  # another rank


def test_the_fault_point_does_nothing_unarmed_and_sends_real_signals_armed(tmp_path):
    """One point (hpc/training/inject.py): unarmed, no signal, no file, no error; armed, the process signals
    itself at the moment asked for, and a checkpoint's write leaves its half on disk first."""
    got = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        inject.arm((), 0, lambda: 0)
        inject.at("step")
        inject.at_checkpoint(tmp_path / "last.pt", b"0123456789", 3)
        inject.before_step(1, 8, 1)
        assert got == [] and list(tmp_path.iterdir()) == [] and not inject.graph_fault("mismatch")
        inject.arm(parse_faults("signal:USR2@checkpoint:3,graph-mismatch@rank=0"), 0, lambda: 9)
        inject.at_checkpoint(tmp_path / "last.pt", b"0123456789", 2)  # another step's checkpoint: nothing
        assert got == [] and list(tmp_path.iterdir()) == []
        inject.at_checkpoint(tmp_path / "last.pt", b"0123456789", 3)
        assert got == [signal.SIGUSR2] and [p.read_bytes() for p in tmp_path.iterdir()] == [b"01234"]
        assert inject.graph_fault("mismatch") and not inject.graph_fault("slow")
    finally:
        inject.arm((), 0, lambda: 0)
        signal.signal(signal.SIGUSR2, previous)


# What a survivor's collective raises when its peer is gone, as torch 2.x prints it (gloo, NCCL, the store),
# and errors that are the program's own.
PEER_GONE = [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:57041: Connection reset by peer. "
    "This is typically caused by a remote worker hanging or bugs in the application.",
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation "
    "to complete",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.249.4.12]:43771",
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote process exited or there was a "
    "network error, NCCL version 2.21.5",
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE) ran for 600044 "
    "milliseconds before timing out.",
    "Application timeout caused pair closure",  # gloo in torch 2.14, seen with a frozen peer (SIGSTOP)
]
OWN_ERRORS = ["shape '[16, 3, 32, 32]' is invalid for input of size 12", "fault injection: HPC_FAULT_INJECT=fail"]


@pytest.mark.parametrize("message", PEER_GONE)
def test_a_dead_peers_failure_is_told_from_the_programs_own(message):
    assert is_peer_failure(RuntimeError(message))
    cause = cause_of(RuntimeError(message))
    assert len(cause) <= 120 and "third_party" not in cause and "typically caused" not in cause


@pytest.mark.parametrize("message", OWN_ERRORS)
def test_the_programs_own_errors_are_not_a_dead_peer(message):
    assert not is_peer_failure(RuntimeError(message)) and not is_peer_failure(ValueError("Timed out"))


def test_a_peer_that_has_ended_is_dead_even_before_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{child.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        time.sleep(0.05)  # ended, not waited for: a zombie, as a launcher's killed rank is until it reaps it
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid) and pid_alive(os.getpid())


def test_a_peer_that_ends_while_its_survivor_asks_is_named():
    """A killed rank's sockets close before it has ended: the survivor asks again for a moment (found in
    CI: a dead peer reported as 'every rank on this host still runs')."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert _ended([(1, child.pid)], grace_s=0.0) == []  # still running: no grace, not named
        assert child.stdin is not None
        threading.Timer(0.3, child.stdin.close).start()  # it ends (EOF) while the survivor asks
        start = time.monotonic()
        assert _ended([(1, child.pid)], grace_s=300) == [f"rank 1 (pid {child.pid})"]  # ends within the grace
        assert time.monotonic() - start < 300  # named when it ended, not when the grace ran out
        assert _ended([(0, os.getpid())], grace_s=0.2) == []  # alive throughout: the grace is spent
    finally:
        child.wait()


def test_a_silent_rank_is_the_one_whose_heartbeat_stops_and_a_busy_one_is_not(monkeypatch):
    """The heartbeat read on a real store (torch's HashStore, in-process): rank 2's count stops, ranks 0
    and 1 go on counting (one of them is 'blocked in a collective': its thread still counts); a store that
    does not answer within the silence (a request that blocks for ever, as to a frozen host) is None."""
    import threading

    import torch.distributed as tdist

    from hpc.training.distributed import rendezvous

    monkeypatch.setattr(rendezvous, "SILENCE_S", 0.5)
    store = tdist.HashStore()
    done = threading.Event()

    def beat(rank: int) -> None:
        while not done.wait(0.05):
            store.add(f"{rendezvous.BEAT}{rank}", 1)

    store.add(f"{rendezvous.BEAT}2", 1)  # rank 2 beat once, then froze
    threads = [threading.Thread(target=beat, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    try:
        assert rendezvous.silent_ranks(store, 3, me=0) == [2]
    finally:
        done.set()

    class Frozen:  # a store whose requests never come back
        def add(self, key: str, value: int) -> int:
            threading.Event().wait()
            return 0

    assert rendezvous.silent_ranks(Frozen(), 3, me=1) is None  # type: ignore[arg-type]


def test_a_missing_rank_is_placed_where_slurms_block_layout_puts_it():
    """srun's default block distribution: 4 tasks a node, ranks 0-3 on the first host, 4-7 on the second;
    outside Slurm, or with uneven nodes, no host is guessed."""
    from hpc.placement.distenv import DistEnv
    from hpc.training.distributed.rendezvous import expected_host, named

    dist = DistEnv(0, 8, 0, 4, 0, 2, "nid001", 29500, "slurm")
    env = {"SLURM_JOB_NODELIST": "nid[001-002]"}
    assert [expected_host(r, dist, env) for r in (0, 3, 4, 7)] == ["nid001", "nid001", "nid002", "nid002"]
    assert expected_host(5, dist, {}) is None
    # torchrun numbers nodes in its agents' arrival order (tests/e2e/test_many_ranks.py saw rank 0 on the
    # job's third node): no host is guessed from Slurm's list
    assert expected_host(5, DistEnv(0, 8, 0, 4, 0, 2, "nid001", 29500, "torchrun"), env) is None
    assert named([5, 6, 7, 1, 2], dist, env) == (
        "rank 5 (on nid002), rank 6 (on nid002), rank 7 (on nid002), rank 1 (on nid001) and 1 more"
    )


def test_a_metrics_line_is_decoded_into_its_record_and_one_of_another_shape_is_skipped(tmp_path):
    """Issue 73: metrics.jsonl's lines are MetricsRecords when read; a line whose figure is mistyped, or of a
    kind the training does not write, is skipped as a cut one is; a line written keeps only what it says."""
    from hpc.core.rundir import MetricsRecord, append_metrics

    log = tmp_path / "metrics.jsonl"
    append_metrics(log, MetricsRecord(kind="epoch", step=8, epoch=1, epoch_time_s=12.5, eval_top1=3.0))
    assert log.read_text() == '{"kind": "epoch", "step": 8, "epoch": 1, "epoch_time_s": 12.5, "eval_top1": 3.0}\n'
    assert json.loads(log.read_text()) == {"kind": "epoch", "step": 8, "epoch": 1, "epoch_time_s": 12.5,
                                           "eval_top1": 3.0}
    append_line(log, json.dumps({"kind": "epoch", "step": 9, "epoch_time_s": "slow"}))
    append_line(log, json.dumps({"kind": "eval", "step": 10}))
    append_line(log, json.dumps({"kind": "train", "step": 11, "loss": 2.5}))
    assert [(r.kind, r.step, r.loss, r.epoch_time_s) for r in read_metrics(log)] == [
        ("epoch", 8, None, 12.5), ("train", 11, 2.5, None)]
