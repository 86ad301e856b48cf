"""The parts that name a frozen or hung rank and an out-of-memory script, on literal inputs: faulthandler's
dump as CPython 3.11 writes it (copied from a dump of tests/scripts/stuck_ddp.py), /proc's stat line,
the beat pipe's identity check, the run's outcome when a script's OOM is followed by its peers' failures,
NCCL's Flight Recorder asked through torch's pipe (torch's side stood in for: no NCCL here)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from hpc.core.beat import READY, STEP, Beats, beat_fd, beat_pipe
from hpc.core.rundir import RunPaths
from hpc.core.summary import RankFacts, run_outcome
from recordedruns import entries
from hpc.core.proc import proc_stat, process_state
from hpc.launch.rank.flightrec import ask_for_dump
from hpc.launch.rank.hang import HangWatch, main_frames, waits_for_a_peer, where
from hpc.launch.rank.rankenv import rank_env
from hpc.placement.distenv import from_environ
from hpc.settings.rankcommand import user_command
from hpc.training.steptimes import StepClock
from hpc.training.hook.scriptoom import oom_of

STUCK = """Thread 0x00007f3540bff640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py", line 54 in _pin_memory_loop
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner

Current thread 0x00007f354c045b80 (most recent call first):
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 327 in wait
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 629 in wait
  File "/work/main/tests/scripts/stuck_ddp.py", line 17 in fetch_batch
  File "/work/main/tests/scripts/stuck_ddp.py", line 35 in main
  File "/work/main/tests/scripts/stuck_ddp.py", line 46 in <module>
"""
WAITING = """Current thread 0x00007fa2b5ddeb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 1072 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 623 in backward
  File "/work/main/tests/scripts/stuck_ddp.py", line 38 in main
  File "/work/main/tests/scripts/stuck_ddp.py", line 46 in <module>
"""


def test_the_main_threads_frame_and_the_scripts_own_are_named():
    frames = main_frames(STUCK)  # the block ending in <module>, not the pin-memory thread listed first
    assert [m["func"] for m in frames] == ["wait", "wait", "fetch_batch", "main", "<module>"]
    assert where(frames) == "wait (threading.py:327) called from fetch_batch (stuck_ddp.py:17)"
    assert not waits_for_a_peer(frames)
    waiting = main_frames(WAITING)
    assert waits_for_a_peer(waiting) and where(waiting) == "_engine_run_backward (graph.py:1072) called from main (stuck_ddp.py:38)"
    assert main_frames("") == [] and where([]) is None
    assert main_frames("Current thread 0x1 (most recent call first):\n  <no Python frame>\n") == []


def test_a_stopped_process_reads_as_stopped_and_a_gone_one_as_none():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(child.pid) == "T"
        os.kill(child.pid, signal.SIGCONT)
        assert process_state(child.pid) in ("S", "R")
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None


def test_the_beat_pipe_is_used_only_by_a_process_that_has_that_very_pipe(tmp_path):
    read_fd, write_fd, value = beat_pipe()
    try:
        assert beat_fd({"HPC_BEAT": value}) == write_fd
        other = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)  # a file that took the number elsewhere
        assert beat_fd({"HPC_BEAT": f"{other}:{value.split(':')[1]}"}) is None
        os.close(other)
        for bad in ("", "x:1", "99999:1", f"{write_fd}:1"):
            assert beat_fd({"HPC_BEAT": bad}) is None, bad
        beats = Beats(read_fd)
        beats.read()
        assert (beats.steps, beats.last_s, beats.ready) == (0, None, False)
        os.write(write_fd, STEP + READY + STEP * 3)
        beats.read()
        assert beats.steps == 4 and beats.ready and beats.last_s is not None
    finally:
        os.close(write_fd)
    beats.read()  # every writer gone: closed, nothing more counted
    assert beats.fd is None and beats.steps == 4


def test_a_silent_rank_is_named_only_past_the_bound_and_not_when_a_peer_failed(tmp_path):
    read_fd, write_fd, _ = beat_pipe()
    peer = {"failed": False}
    watch = HangWatch(os.getpid(), Beats(read_fd), 10, tmp_path / "stack.txt", lambda: peer["failed"])
    assert watch.check(now=1e9) is None  # no step yet: a script's start-up is not a hang
    os.write(write_fd, STEP)
    watch.check()
    last = watch.beats.last_s
    assert watch.check(now=last + 14.9) is None  # the bound and the extra a frozen peer gets first
    peer["failed"] = True
    assert watch.check(now=last + 16) is None  # a peer failed: it is the one named, this rank stops after it
    peer["failed"] = False
    line = watch.check(now=last + 16)
    assert line is not None and line.startswith(f"hung: its process (pid {os.getpid()}) made no step for 10 s")
    os.close(write_fd)


def test_the_first_rank_to_end_badly_says_what_the_run_is():
    oom = {"rank": 1, "kind": "oom", "ended_ns": 100}
    peer = {"rank": 0, "kind": "failed", "ended_ns": 105}  # its collective failed after the OOM
    assert run_outcome(entries([peer, oom]), 2) == "oom"
    assert run_outcome(entries([{**peer, "ended_ns": 90}, oom]), 2) == "failed"
    assert run_outcome(entries([{**peer, "kind": "ok"}, {**oom, "kind": "ok"}]), 2) == "done"


def test_an_out_of_memory_error_is_found_along_the_chain_of_causes():
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert oom_of(error) is error
    try:
        try:
            raise error
        except torch.OutOfMemoryError as e:
            raise RuntimeError("training step failed") from e  # a framework's wrapper
    except RuntimeError as wrapped:
        assert oom_of(wrapped) is error
    assert oom_of(ValueError("x")) is None and oom_of(None) is None


def test_nccls_flight_recorder_is_asked_through_torchs_pipe(tmp_path):
    """torch's side stood in for (no NCCL here): its watchdog makes the fifo and holds it open for reading
    without blocking, as ProcessGroupNCCL's DumpPipe does; a write there is its request."""
    pipe = RunPaths(tmp_path).flight_recorder(0)[1]
    pipe.parent.mkdir()
    assert pipe.parent.name == "ranks"  # not among the dumps, which torch's analyzer reads every one of
    assert not ask_for_dump(pipe)  # no NCCL group: nothing made, nothing asked
    os.mkfifo(pipe)
    assert not ask_for_dump(pipe)  # made, nobody reading: refused at once, never blocks
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert ask_for_dump(pipe) and os.read(reader, 8) == b"1"
    finally:
        os.close(reader)


def test_a_commands_rank_gets_the_flight_recorder_unless_its_environment_says_otherwise(tmp_path):
    task = user_command(["python", "t.py"], "/", {"enabled": False}, 60)
    env = rank_env(from_environ({}), tmp_path, task, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, "1.0.0")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and "TORCH_FR_BUFFER_SIZE" not in env  # the user's wins
    named = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)  # torch's own answer
    fresh = rank_env(from_environ({}), tmp_path, task, {}, "1.0.0")  # this torch's own name: no warning
    assert fresh.get("TORCH_FR_BUFFER_SIZE" if named else "TORCH_NCCL_TRACE_BUFFER_SIZE") == "2000", fresh
    assert ("TORCH_NCCL_TRACE_BUFFER_SIZE" in fresh) != named
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    dump, pipe = RunPaths(tmp_path).flight_recorder(3)
    assert f"{env['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}3" == str(dump) and dump.parent == tmp_path / "flight_recorder"
    assert f"{env['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}3.pipe" == str(pipe)
    training = user_command(["python", "-m", "hpc.train"], "/", {"enabled": True}, 60)  # records its own way
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in rank_env(from_environ({}), tmp_path, training, {}, "1.0.0")


def test_each_steps_first_gradient_is_timed_and_four_parameters_keep_the_hook():
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])  # 8 parameters
    clock = StepClock()
    assert clock.watch(model.parameters()) and len(clock.handles) == 8
    clock.ended()  # the first step's end: its own work has no start, and no gradient came
    model(torch.randn(2, 4)).sum().backward()
    clock.ended()
    assert clock.own_times()[0] is None and clock.own_times()[1] is not None
    # the last layer's gradients come first in backward: they keep the hook, the rest let it go
    assert set(clock.handles) == {id(p) for p in [*model[3].parameters(), *model[2].parameters()]}
    model(torch.randn(2, 4)).sum().backward()
    clock.ended()
    assert clock.own_times()[2] is not None  # still timed with four
    clock.remove()
    model(torch.randn(2, 4)).sum().backward()
    clock.ended()
    assert clock.own_times()[3] is None


@pytest.mark.parametrize("group, env, said", [
    (2, {"WORLD_SIZE": "2"}, None),  # the job's world: nothing to say
    (1, {"WORLD_SIZE": "2"}, "process group has 1 rank(s), the job 2"),  # Lightning's devices=1 on 2 GPUs
    (8, {"WORLD_SIZE": "4"}, "process group has 8 rank(s), the job 4"),
    (3, {}, None),  # no job's world to compare with (run by hand)
])
def test_a_process_group_other_than_the_jobs_world_is_said(group, env, said):
    from hpc.training.hook.autoprofile import world_mismatch

    line = world_mismatch(group, env)
    assert (line is None) if said is None else (said in line and "--gpus" in line)


def test_ranks_without_a_group_are_separate_copies_from_two():
    from hpc.training.hook.autoprofile import separate_copies_line

    assert separate_copies_line(1) is None and "4 ranks each train a separate copy" in separate_copies_line(4)


@pytest.mark.parametrize("world, cuda, expected", [
    (2, False, {"ACCELERATE_USE_CPU": "true"}),  # CPU ranks, as `accelerate launch --cpu` makes them
    (1, False, {}),
    (4, True, {}),
])
def test_no_accelerate_config_adds_only_cpu_ranks(world, cuda, expected):
    from hpc.training.hook.scriptaccelerate import launch_env

    assert launch_env(None, world, cuda) == expected


ACCELERATE_CONFIGS = {
    "bf16, inductor with every dynamo option": "mixed_precision: bf16\nuse_cpu: false\ndynamo_config:\n"
    "  dynamo_backend: INDUCTOR\n  dynamo_mode: max-autotune\n  dynamo_use_fullgraph: true\n"
    "  dynamo_use_dynamic: true\n  dynamo_use_regional_compilation: true\n",
    "inductor, its options left out": "mixed_precision: fp16\nuse_cpu: false\ndynamo_config:\n"
    "  dynamo_backend: inductor\n",
    "inductor, dynamic shapes off": "mixed_precision: fp16\nuse_cpu: false\ndynamo_config:\n"
    "  dynamo_backend: inductor\n  dynamo_use_dynamic: false\n",
    "no precision, CPU, no dynamo": "mixed_precision: 'no'\nuse_cpu: true\ndynamo_config: {}\n",
    "dynamo backend no": "mixed_precision: bf16\nuse_cpu: false\ndynamo_config:\n  dynamo_backend: 'NO'\n",
}


@pytest.mark.parametrize("body", ACCELERATE_CONFIGS.values(), ids=list(ACCELERATE_CONFIGS))
def test_an_accelerate_config_becomes_what_accelerate_launch_passes(body, tmp_path):
    """The oracle is accelerate's own launcher: its parser and config loading (`accelerate launch
    --config_file`) and the environment its simple launcher gives the processes."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import (
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    from hpc.training.hook.scriptaccelerate import launch_env

    path = tmp_path / "accelerate.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
                    f"num_processes: 4\n{body}")
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    _validate_launch_command(args)
    theirs = {k: v for k, v in prepare_simple_launcher_cmd_env(args)[1].items() if k.startswith("ACCELERATE_")}
    ours = launch_env(load_config_from_file(str(path)), 4, True)
    assert ours.get("ACCELERATE_USE_CPU", "false").lower() == theirs["ACCELERATE_USE_CPU"].lower()
    assert ours["ACCELERATE_MIXED_PRECISION"] == theirs["ACCELERATE_MIXED_PRECISION"]
    if theirs["ACCELERATE_DYNAMO_BACKEND"] == "NO":  # accelerate reads an absent backend as NO
        assert not [k for k in ours if k.startswith("ACCELERATE_DYNAMO_")], ours
    else:
        assert {k: v for k, v in ours.items() if k.startswith("ACCELERATE_DYNAMO_")} == {
            k: v for k, v in theirs.items() if k.startswith("ACCELERATE_DYNAMO_")}


def test_a_hook_after_an_import_waits_for_the_module_to_run_not_for_a_probe(tmp_path, monkeypatch):
    """transformers asks importlib.util.find_spec("accelerate") before it imports it: the probe's spec is
    never executed, and the start-up hook's accelerate step must still run at the real import (it did
    not: HF Trainer's ranks each trained alone)."""
    import importlib
    import importlib.util

    from hpc.training.hook.afterimport import after_import

    name = f"probed_module_{uuid.uuid4().hex}"  # new to this interpreter, however often the test runs in it
    (tmp_path / f"{name}.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import(name, lambda module: seen.append(module.VALUE))
    assert importlib.util.find_spec(name) is not None and seen == []  # a probe: nothing ran
    importlib.import_module(name)

    assert seen == [7]
    sys.modules.pop(name)
    importlib.import_module(name)  # imported again: the hook has gone

    assert seen == [7]


# The bounds as the module doc states them (hpc/launch/rank/hang.py): with command.hang_timeout_s a silence
# is hung 5 s after the bound; a rank waiting for a peer is named 10 s after it was first seen waiting;
# progress is judged over a 10 s window once half of it is seen, busy at 5% of a core or 1 MiB moved.
SILENT_EXTRA, WAITER_EXTRA, WINDOW, CPU_SHARE, BYTES = 5.0, 10.0, 10.0, 0.05, 1 << 20


def test_a_silence_is_judged_at_the_bound_and_named_at_the_bound_and_its_extra(tmp_path):
    read_fd, write_fd, _ = beat_pipe()
    watch = HangWatch(os.getpid(), Beats(read_fd), 10, tmp_path / "stack.txt", lambda: False)
    os.write(write_fd, STEP)
    watch.check()
    watch.beats.last_s = 0.0  # its last step at 0: the times below are exact
    watch.dumped = "x"
    assert watch.check(now=9.99) is None and watch.dumped is None  # under the bound: a new silence each time
    assert watch.check(now=10.0) is None and watch.dumped == ""  # at it: judged (its stacks asked for)
    assert watch.check(now=10.0 + SILENT_EXTRA - 0.01) is None
    line = watch.check(now=10.0 + SILENT_EXTRA)
    assert line is not None and line.startswith("hung: its process") and "made no step for 10 s" in line
    os.close(write_fd)


def test_a_waiter_is_named_its_extra_after_it_was_first_seen_waiting(tmp_path):
    waiter = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, tmp_path / "s.txt", lambda: False)
    waiter.dumped = 'Thread 0x1 (most recent call first):\n  File "/x/torch/distributed/c10d.py", line 1 in wait\n' \
                    '  File "/me/train.py", line 9 in <module>\n'
    waiter.working = lambda now: False  # type: ignore[method-assign]  # idle, as a rank blocked in gloo's is
    waiter.beats.last_s = 0.0
    first = 100.0  # past the learned bound (at most 90 s) and its extra
    assert waiter.check(now=first) is None and waiter.waiting == (first, "wait (c10d.py:1)")
    assert waiter.check(now=first + WAITER_EXTRA - 0.01) is None
    said = waiter.check(now=first + WAITER_EXTRA)
    assert said is not None and "waiting for a peer in wait (c10d.py:1)" in said


@pytest.mark.parametrize("ticks_off, moved, busy", [(-1, None, False), (0, None, True), (1, None, True),
                                                    (None, BYTES - 1, False), (None, BYTES, True)])
def test_progress_is_a_share_of_a_core_or_bytes_moved_over_the_window(monkeypatch, ticks_off, moved, busy):
    """CPU ticks one under, at and one over 5% of a core over half a window; bytes one under and at 1 MiB."""
    from hpc.launch.rank import hang

    hz = os.sysconf("SC_CLK_TCK")
    half = WINDOW / 2
    at = CPU_SHARE * half * hz
    assert at == int(at)  # whole ticks (100 Hz: 25)
    ticks = 0 if ticks_off is None else int(at) + ticks_off
    seen = iter([(0, 0), (ticks, moved or 0)])  # (CPU ticks, bytes) at 0 and at half a window
    monkeypatch.setattr(hang, "progress", lambda pid: next(seen))
    watch = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, Path("unused"), lambda: False)
    assert watch.working(0.0) is None  # a window not half seen is not judged
    assert watch.working(half) is busy


def test_the_window_keeps_the_last_ten_seconds_and_judges_from_half_of_it(monkeypatch):
    from hpc.launch.rank import hang

    monkeypatch.setattr(hang, "progress", lambda pid: (0, 0))
    watch = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, Path("unused"), lambda: False)
    assert watch.working(0.0) is None and watch.working(WINDOW / 2 - 0.01) is None
    assert watch.working(WINDOW / 2) is False
    watch.working(WINDOW)
    assert [s[0] for s in watch.samples] == [0.0, WINDOW / 2 - 0.01, WINDOW / 2, WINDOW]  # 10 s back: kept
    watch.working(WINDOW + 0.01)
    assert watch.samples[0][0] == WINDOW / 2 - 0.01  # older than the window: gone


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_by_default_the_bound_is_learned_and_a_working_rank_is_never_hung(tmp_path):
    """No hang_timeout_s: silent past 10x its longest step gap (at least 60 s), a rank is named only when
    idle. Two real processes are watched: one computing (a busy loop, as an evaluation pass), one asleep
    (as a lost wake-up); the oracle is what each does, read by the kernel's own counters."""
    from hpc.launch.rank.hang import LEARNED_MIN_S, PROGRESS_WINDOW_S, SILENT_EXTRA_S

    busy, idle = _child("while True: pass"), _child("import time; time.sleep(600)")
    pipes = [beat_pipe() for _ in range(2)]
    marked = []
    watches = [HangWatch(p.pid, Beats(r), None, tmp_path / f"stack{i}.txt", lambda: False,
                         busy=lambda i=i: marked.append(i))
               for i, (p, (r, _, _)) in enumerate(zip((busy, idle), pipes, strict=True))]
    try:
        for (_, w, _), watch in zip(pipes, watches, strict=True):
            for _ in range(3):  # three steps, 0.2 s apart: a longest gap far under the floor
                os.write(w, STEP)
                watch.check()
                time.sleep(0.2)
        assert all(watch.bound_s() == LEARNED_MIN_S for watch in watches)
        start = max(watch.beats.last_s for watch in watches)
        # Polls past the bound, over a progress window (and a second) of real time: the CPU each child uses
        # is real, so the watch's clock runs at the real rate (a clock run 5x faster made a computing child
        # on a loaded machine, a fifth of a core, read as idle: seen with 12 processes on 2 cores).
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < PROGRESS_WINDOW_S / 2 + 1:
            said = [watch.check(now=start + LEARNED_MIN_S + SILENT_EXTRA_S + 1 + elapsed) for watch in watches]
            time.sleep(0.05)
        assert said[0] is None and 0 in marked  # computing: not hung, and its peers are told it works
        assert said[1] is not None and said[1].startswith(f"hung: its process (pid {idle.pid}) made no step for 60 s"
                                                           " (learned"), said
        assert "idle (no CPU, no disk)" in said[1] and 1 not in marked
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
        for r, w, _ in pipes:
            os.close(w)


# One core shared by a watched process and SPINNERS processes that never sleep: the watched one computes
# 10 ms of CPU, then sleeps three times what that pass took on the clock (as long_eval_ddp.py's evaluation
# waits for its next batch): a quarter of its time wanting a core, a 32nd of it on one.
SPINNERS = 7
STARVED = """import os, time
os.sched_setaffinity(0, {%d})
while True:
    began, cpu = time.monotonic(), time.process_time()
    while time.process_time() - cpu < 0.01:
        pass
    time.sleep(3 * (time.monotonic() - began))
"""


def test_a_rank_its_node_starves_of_cores_is_working_not_hung():
    """On a loaded node (CI: 32 ranks on 2 cores) a rank evaluating in passes got 1/4 of its time's worth
    of work done at a fraction of a core: under 5% of one by its CPU ticks alone, so a watch that counted
    only those named it hung (seen in CI, 2026-11-30). Starved is not blocked: the time it waited in the run
    queue for a core counts. The oracle is the kernel's CPU count for it (/proc/PID/stat: under the bar,
    so the case is real) and the clock (it wants a core a quarter of the time)."""
    from hpc.launch.rank import hang

    core = min(os.sched_getaffinity(0))
    spinners = [_child(f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass") for _ in range(SPINNERS)]
    starved = _child(STARVED % core)
    hz = os.sysconf("SC_CLK_TCK")
    watch = HangWatch(starved.pid, Beats(beat_pipe()[0]), None, Path("unused"), lambda: False)
    try:
        time.sleep(0.5)  # past its start-up (imports on a shared core), which is work of another kind
        began, cpu_then = time.monotonic(), _cpu_ticks(starved.pid)
        assert watch.working(began) is None
        while (now := time.monotonic()) - began < hang.PROGRESS_WINDOW_S / 2:
            time.sleep(0.1)
        judged = watch.working(now)
        cpu_share = (_cpu_ticks(starved.pid) - cpu_then) / hz / (now - began)
        assert cpu_share < hang.BUSY_CPU_SHARE, cpu_share  # by CPU alone it would read idle
        assert judged is True
    finally:
        for p in (*spinners, starved):
            p.kill()
            p.wait()


def _cpu_ticks(pid: int) -> int:
    """The kernel's CPU count for the process alone (utime + stime), without the run-queue time."""
    fields = proc_stat(pid)
    assert fields is not None
    return int(fields[11]) + int(fields[12])


def test_by_default_a_stopped_rank_is_frozen_after_a_minute_and_a_waiter_behind_a_busy_peer_is_not_hung(tmp_path):
    from hpc.launch.rank.hang import FROZEN_S

    child = _child("import time; time.sleep(600)")
    read_fd, write_fd, _ = beat_pipe()
    watch = HangWatch(child.pid, Beats(read_fd), None, tmp_path / "stack.txt", lambda: False)
    try:
        os.write(write_fd, STEP)
        watch.check()
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while process_state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        assert watch.check(now=t0) is None and watch.check(now=t0 + FROZEN_S - 1) is None
        line = watch.check(now=t0 + FROZEN_S)
        assert line is not None and line.startswith(f"frozen: its process (pid {child.pid}) was stopped") and \
            f"for {FROZEN_S:g} s, after step 1" in line and FROZEN_S + 5 <= 120
    finally:
        child.kill()
        child.wait()
        os.close(write_fd)
    # a rank waiting for a peer in a collective (its stack says so) is not hung while a peer is busy
    peer = {"busy": True}
    waiter = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, tmp_path / "s.txt", lambda: False,
                       peer_busy=lambda: peer["busy"])
    waiter.dumped = 'Thread 0x1 (most recent call first):\n  File "/x/torch/distributed/c10d.py", line 1 in wait\n' \
                    '  File "/me/train.py", line 9 in <module>\n'
    waiter.working = lambda now: False  # type: ignore[method-assign]  # idle, as a rank blocked in gloo's is
    waiter.beats.last_s = 0.0
    assert waiter.check(now=100.0) is None and waiter.check(now=200.0) is None  # the peer works
    peer["busy"] = False
    assert waiter.check(now=205.0) is None  # the waiter's extra starts now
    said = waiter.check(now=216.0)
    assert said is not None and "waiting for a peer in wait (c10d.py:1)" in said


def test_a_scripts_rank_record_carries_every_measurement_the_trainings_does(tmp_path):
    """One set of instruments: the step hook's facts hold each key of RANK_MEASURES, the list the toolkit's
    training's records are nulled by when recovered (hpc/training/summary.py's MEASURED holds it whole)."""
    from hpc.training.hook.autoprofile import StepHook
    from hpc.training.steptimes import RANK_MEASURES
    from hpc.training.summary import MEASURED

    hook = StepHook(None, tmp_path)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        hook(optimizer, (), {})
    facts = hook.facts()
    assert set(RANK_MEASURES) <= set(RankFacts.__struct_fields__) and set(RANK_MEASURES) <= set(MEASURED)
    off_a_gpu = {"cuda_max_memory_allocated_bytes", "cuda_max_memory_reserved_bytes", "step_time_after_profiler_s"}
    assert [k for k in RANK_MEASURES if getattr(facts, k) is None] == sorted(off_a_gpu, key=RANK_MEASURES.index)
    assert facts.startup.first_step_end_unix is not None and facts.wall_time_s > 0
    assert facts.own_step_series.first_step == 0 and len(facts.own_step_series.ms) == 4


def test_a_ready_task_is_asked_for_its_stacks_and_the_whole_dump_is_read(tmp_path):
    """dump(): nothing asked of a task that has not said it can take the signal; a ready one gets
    DUMP_SIGNAL (faulthandler, as the start-up hook registers it) and its every thread's block is read once
    written; NCCL's Flight Recorder is asked through its pipe, where there is one."""
    from hpc.core.beat import DUMP_SIGNAL

    stack = tmp_path / "stack.txt"
    code = (f"import faulthandler, signal, sys, threading, time\n"
            f"f = open({str(stack)!r}, 'w')\n"
            f"faulthandler.register({int(DUMP_SIGNAL)}, file=f, all_threads=True)\n"
            "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        read_fd, write_fd, _ = beat_pipe()
        pipe = tmp_path / "recorder.pipe"
        os.mkfifo(pipe)
        reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # torch's watchdog reads it
        watch = HangWatch(child.pid, Beats(read_fd), 10, stack, lambda: False, recorder=(tmp_path / "fr", pipe))
        assert watch.dump() == "" and not stack.read_text()  # not ready: not signalled (it would die)
        os.write(write_fd, READY)
        watch.beats.read()
        text = watch.dump()
        assert text.count("(most recent call first)") == 2 and text.endswith("\n"), text  # both threads
        assert os.read(reader, 8) == b"1"  # the Flight Recorder was asked too
        os.close(reader)
        gone = HangWatch(child.pid, watch.beats, 10, tmp_path / "never.txt", lambda: False)
        started = time.monotonic()
        assert gone.dump() == "" and time.monotonic() - started < 10  # nothing written: given up, bounded
    finally:
        child.kill()
        child.wait()


THREAD_ONLY = """Thread 0x00007f3540bff640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner

Current thread 0x00007f354c045b80 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 415 in select
"""


def test_without_a_modules_block_the_first_thread_is_named_and_pythons_own_frame_alone():
    frames = main_frames(THREAD_ONLY)  # no block ends in <module> (an embedded interpreter): the first
    assert [m["func"] for m in frames] == ["wait", "_bootstrap_inner"]
    assert where(frames) == "wait (threading.py:331)"  # no frame of the script's own: Python's alone


def _silent_watch(tmp_path, timeout_s, recorder=None, peer_busy=lambda: False):
    """A watch of this process, its last step at 100 s on the test's clock, its stacks `STUCK`."""
    watch = HangWatch(os.getpid(), Beats(beat_pipe()[0]), timeout_s, tmp_path / "stack.txt", lambda: False,
                      recorder=recorder, peer_busy=peer_busy)
    watch.beats.last_s, watch.beats.steps = 100.0, 7
    watch.working = lambda now: False  # type: ignore[method-assign]  # idle
    watch.dump = lambda: STUCK  # type: ignore[method-assign]
    return watch


def test_a_hung_line_says_the_bound_where_the_rank_was_and_the_flight_recorders_dump(tmp_path):
    stack = tmp_path / "stack.txt"
    watch = _silent_watch(tmp_path, 10)
    assert watch.check(now=109.99) is None and watch.dumped is None  # silent 9.99 s of its 10
    assert watch.check(now=110.0) is None and watch.dumped == STUCK  # at the bound: its stacks asked for
    assert watch.check(now=115.0) == (
        f"hung: its process (pid {os.getpid()}) made no step for 10 s (command.hang_timeout_s) after step 7, "
        f"in wait (threading.py:327) called from fetch_batch (stuck_ddp.py:17); every thread's stack: {stack}")
    nothing = _silent_watch(tmp_path, None)
    nothing.dump = lambda: ""  # type: ignore[method-assign]  # a task that never said it can take the signal
    assert nothing.check(now=300.0) == (
        f"hung: its process (pid {os.getpid()}) made no step for 60 s (learned: 10x its longest step gap, 60-90 s), "
        f"idle (no CPU, no disk) after step 7; every thread's stack: {stack}")
    dump, pipe = tmp_path / "nccl_trace_rank_0", tmp_path / "absent.pipe"
    for made, said in ((False, ""), (True, f"; NCCL's Flight Recorder: {dump}")):
        if made:
            dump.write_text("trace")
        line = _silent_watch(tmp_path, 10, recorder=(dump, pipe)).check(now=200.0)
        assert line is not None and line.endswith(f"every thread's stack: {stack}{said}")


def test_a_frozen_line_counts_from_the_first_poll_that_saw_it_stopped(tmp_path, monkeypatch):
    from hpc.launch.rank import hang

    monkeypatch.setattr(hang, "process_state", lambda pid: "T")
    watch = _silent_watch(tmp_path, 10)
    assert watch.check(now=1000.0) is None and watch.check(now=1011.99) is None  # the bound and 2 s
    assert watch.check(now=1012.0) == (
        f"frozen: its process (pid {os.getpid()}) was stopped (SIGSTOP, or a debugger) for 12 s "
        "(command.hang_timeout_s), after step 7; a stopped process gives no stack")
    monkeypatch.setattr(hang, "process_state", lambda pid: "S")
    watch.check(now=1013.0)  # it runs again: a later stop counts afresh
    monkeypatch.setattr(hang, "process_state", lambda pid: "T")
    assert watch.check(now=2000.0) is None and watch.check(now=2011.99) is None


def test_a_waiter_is_named_its_extra_after_its_peer_was_last_seen_busy(tmp_path):
    peer = {"busy": True}
    waiter = _silent_watch(tmp_path, None, peer_busy=lambda: peer["busy"])
    waiter.dump = lambda: WAITING  # type: ignore[method-assign]
    assert waiter.check(now=200.0) is None and waiter.check(now=300.0) is None  # the peer works meanwhile
    peer["busy"] = False
    assert waiter.check(now=309.99) is None
    said = waiter.check(now=310.0)  # 10 s after the peer was last seen working
    assert said is not None and said.endswith(
        f"after step 7, waiting for a peer in _engine_run_backward (graph.py:1072) called from main "
        f"(stuck_ddp.py:38); every thread's stack: {tmp_path / 'stack.txt'}")


@pytest.mark.parametrize("ticks_then, moved_then", [(1000, 0), (0, 5 << 20)])
def test_progress_is_what_was_used_since_the_windows_start(monkeypatch, ticks_then, moved_then):
    """Counters that did not start at 0 (a rank minutes into its run): one tick and one byte under the
    bar is idle, whatever the counters held before."""
    from hpc.launch.rank import hang

    hz = os.sysconf("SC_CLK_TCK")
    under = int(CPU_SHARE * WINDOW / 2 * hz) - 1
    seen = iter([(ticks_then, moved_then), (ticks_then + under, moved_then + BYTES - 1)])
    monkeypatch.setattr(hang, "progress", lambda pid: next(seen))
    watch = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, Path("unused"), lambda: False)
    assert watch.working(0.0) is None and watch.working(WINDOW / 2) is False


class _Clock:
    """hang's `time` for dump(): a clock that moves only when slept on; each sleep runs the task's next act."""

    def __init__(self, acts):
        self.now, self.slept, self.acts = 0.0, [], acts

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.slept.append(s)
        act = self.acts.get(s)
        if act:
            act()


BLOCK_1 = "Thread 0x1 (most recent call first):\n  File \"/me/train.py\", line 3 in work\n"
BLOCK_2 = "\nCurrent thread 0x2 (most recent call first):\n  File \"/me/train.py\", line 9 in <module>\n"


@pytest.fixture
def ready_watch(tmp_path):
    read_fd, write_fd, _ = beat_pipe()
    os.write(write_fd, READY)
    watch = HangWatch(os.getpid(), Beats(read_fd), None, tmp_path / "stack.txt", lambda: False)
    watch.beats.read()
    assert watch.beats.ready
    yield watch
    os.close(write_fd)


def test_a_dump_is_read_once_its_first_block_is_whole_and_then_once_more(ready_watch, monkeypatch):
    """faulthandler writes the blocks one after the other: the file is read again 0.1 s after the first
    whole block, for the others; bytes that are not UTF-8 are replaced, not fatal."""
    from hpc.launch.rank import hang

    stack = ready_watch.stack
    stack.write_bytes(b"\xff partial\n")  # what a poll may catch: a line, but no thread's block yet
    clock = _Clock({0.05: lambda: stack.write_bytes(b"\xff" + BLOCK_1.encode()),
                    0.1: lambda: stack.write_bytes(b"\xff" + (BLOCK_1 + BLOCK_2).encode())})
    monkeypatch.setattr(hang, "time", clock)
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)  # this process is the task: not signalled here
    assert ready_watch.dump() == "\ufffd" + BLOCK_1 + BLOCK_2
    assert clock.slept == [0.05, 0.1]  # read within 0.15 s of the dump written


def test_a_dump_that_vanishes_or_never_comes_ends_the_wait(ready_watch, monkeypatch, tmp_path):
    from hpc.launch.rank import hang

    stack = ready_watch.stack
    stack.write_text(BLOCK_1)
    clock = _Clock({0.1: stack.unlink})  # removed between the two reads: the first read's text stands
    monkeypatch.setattr(hang, "time", clock)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ready_watch.pid = gone.pid  # a task that already ended: no such process to signal
    assert ready_watch.dump() == BLOCK_1
    never = _Clock({})
    monkeypatch.setattr(hang, "time", never)
    assert ready_watch.dump() == ""  # no file at all: given up at the deadline, 3 s on its clock
    assert never.now == pytest.approx(hang.DUMP_WAIT_S, abs=0.06)


def test_a_task_not_ready_is_not_signalled_for_its_stacks(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    watch = HangWatch(os.getpid(), Beats(beat_pipe()[0]), None, tmp_path / "stack.txt", lambda: False)
    assert not watch.beats.ready and watch.dump() == "" and sent == []


def test_a_silence_that_worked_between_is_a_new_one_and_dumps_again(tmp_path):
    watch = _silent_watch(tmp_path, None)
    dumps = []
    watch.dump = lambda: dumps.append(1) or STUCK  # type: ignore[method-assign]
    busy = {"now": False}
    watch.working = lambda now: busy["now"]  # type: ignore[method-assign]
    assert watch.check(now=161.0) is None and len(dumps) == 1  # past the 60 s bound, idle: its stacks asked for
    busy["now"] = True
    assert watch.check(now=162.0) is None and watch.dumped is None  # it worked: that silence is over
    busy["now"] = False
    assert watch.check(now=163.0) is None and len(dumps) == 2  # idle again: a new dump, not the old one
    said = watch.check(now=300.0)
    assert said is not None and "in wait (threading.py:327) called from fetch_batch" in said


def test_a_ranks_timeline_keeps_each_phases_first_time_and_the_last_steps_latest():
    from hpc.core.proc import process_started_unix
    from hpc.training.steptimes import PHASES, Timeline, startup_record

    timeline = Timeline()
    timeline.mark("imports", 10.0)
    timeline.mark("imports", 11.0)  # a phase is reached once: the first time stands
    timeline.mark("last_step", 20.0, again=True)
    timeline.mark("last_step", 21.0, again=True)  # each step's end: the latest stands
    with pytest.raises(ValueError, match="no start-up phase 'warmup'"):
        timeline.mark("warmup")
    phases = startup_record(None, None, 15.0, timeline).phases
    assert list(phases) == list(PHASES)
    assert (phases["imports"], phases["last_step"], phases["first_step"]) == (10.0, 21.0, 15.0)
    assert phases["process_start"] == process_started_unix() and phases["exit"] is None  # not seen: None


def test_the_hooks_profiler_section_is_read_as_its_profilerconfig(caplog):
    """HPC_PROFILER crosses into the command's process as JSON and is decoded there into ProfilerConfig, its
    checks included: a key of a later toolkit is ignored; a value the section refuses, or no mapping, is
    one line and no profiling (the command runs on)."""
    import json

    from hpc.settings.schema import ProfilerConfig
    from hpc.training.hook.scripthooks import profiler_settings

    told = profiler_settings({"HPC_PROFILER": json.dumps({"enabled": True, "active": 2, "later_key": 1})})
    assert told == ProfilerConfig(enabled=True, active=2)
    for bad, said in (({"active": 0}, "profiler.active: must be > 0"), ({"active": "two"}, "'>'"),
                      ([1], "not a JSON mapping"), ("{", "not a JSON mapping")):
        caplog.clear()
        text = bad if isinstance(bad, str) else json.dumps(bad)
        assert profiler_settings({"HPC_PROFILER": text}) is None
        (line,) = [r.getMessage() for r in caplog.records]
        assert line.startswith("hpc: HPC_PROFILER") and said in line and line.endswith("not profiled"), line
    assert profiler_settings({}) is None and not caplog.records[1:]
