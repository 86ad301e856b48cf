"""The per-rank runner: `run_rank` starts a rank's task (hpc/settings/rankcommand.py: the toolkit's training or a
user's command) as a child process (its words, no shell) with the rank's environment (hpc/launch/
rankenv.py: torchrun's contract, HPC_RUN_DIR, the GPUs in the profile's order, the start-up hook where
the task has one), its stdout and stderr kept in RUN/logs/rank{R}.out and .err and passed on to the runner's own
(the job's log, a terminal: hpc/launch/rank/pump.py), and records how it ended in
RUN/ranks/rank{R}.exit.json, whole (written before this process ends, so a failing rank is named even
when srun kills the others right after). Then summary.json is made again from every rank's records
(hpc/core/summary.py). No torch import: the task is a process of its own.

Signals. Every signal Slurm or a person sends a job is caught here, never this process's death while its
task runs (hpc/core/stop.py). Slurm delivers its signals (the time limit's warning, a preemption's
SIGTERM, `scancel --signal`) to every process of the step, the task included, so here they are not
passed on (but under torchrun, whose agent also stops its workers on its own); on this machine
(submitit's local executor, a plain shell) a stop signal (TERM, USR2, INT, HUP) is passed on as SIGTERM,
another (USR1, QUIT) as it came. After a stop the task has `stop_grace_s` to save and exit; one still
running then is killed (SIGKILL) and the rank ends as `killed`; one that exits 0 without saying it
finished (the toolkit's training says so in its facts) ends as `stopped`, not done. The task's process
dies with this one (Linux's parent-death signal), and what it leaves in its session is killed at its
end. A task that exits with one of its requeue codes (3 saved and stopped; the training's 5, a lost
peer) ends as `stopped`: the job requeues it (hpc/launch/requeue.py) and the same task, started again,
resumes by itself. Exit 4 with an out-of-memory record in its facts ends as `oom`.

A failed peer. Outside Slurm (submitit's local executor, a plain torchrun), where no srun
--kill-on-bad-exit ends the others, each rank looks for a failed rank's mark (one stat every POLL_S) and
stops its own task as for a stop, so that it does not wait in a collective until its timeout.

summary.json: rank 0 writes it once every rank has recorded its end (at most SUMMARY_WAIT_S after its
own), and a rank that fails writes it at once (rank 0 may be killed next); never every rank, which
would read every record under one lock (a thousand ranks, a parallel file system).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from hpc.core.beat import BEAT_VARIABLE, DUMP_SIGNAL, Beats, beat_pipe
from hpc.core.ending import RankCommand, RankEnd, RankExit, encode_exit, encode_task
from hpc.core.errors import EXIT_OOM, EXIT_PREEMPTED
from hpc.core.files import dump_yaml, write_atomic
from hpc.core.gpusample import start_sampler
from hpc.core.meet import LISTEN_FD_VARIABLE, Meeting
from hpc.core.owner import make_dirs
from hpc.core.proc import gone
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.core.summary import (
    EXCEPTION_LINE,
    attempt_of,
    keep_earlier,
    kind_of_code,
    last_said,
    no_step_line,
    read_facts,
    tail_lines,
    write_run_summary,
)
from hpc.launch.rank.hang import HangWatch
from hpc.launch.rank.pump import Pump
from hpc.launch.rank.rankenv import on_slurm, passes_stops_on, rank_env
from hpc.launch.rank.rankmeet import Unmet, meet
from hpc.launch.rank.rankrecords import failed_mark, failed_peers, group_key, wait_for_records
from hpc.placement.distenv import DistEnv, from_environ
from hpc.settings.rankcommand import SUBMITTER_VARIABLE, words_for

log = logging.getLogger(__name__)

POLL_S = 0.5
PEER_GRACE_S = 10  # a rank whose peer failed is stopped as for a signal, but given less time
SUMMARY_WAIT_S = 30  # rank 0 waits this long after its own end for the others' records
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A task that exits 0 after a stop signal without saying it finished (Lightning's `Bypassing SIGTERM`, a
# script that returns from its loop on the signal): not done. What the record and the line say.
UNFINISHED = (
    "not known to have finished: recorded as stopped, not done, and requeued as a stop is (on Slurm; here, run "
    "the same command again); it resumes only from a checkpoint of its own: save one on SIGTERM, then exit 3"
)

# A task SIGKILLed by nobody of the toolkit, having raised nothing: its last line would only mislead.
KILLED_FROM_OUTSIDE = "killed from outside the task (a user, the kernel's out-of-memory killer), raising nothing"
# a signal the task does not handle, whose default action ends it (scancel --signal=USR1 to a plain script): the
# cause, not its stderr's last line, which may be any warning it printed before
ENDED_BY_THE_SIGNAL = "the signal ended it (the task does not handle it), raising nothing"
# the signals a task gets from outside (a person, Slurm, the kernel); SIGSEGV, SIGABRT... are its own crash, whose
# last stderr lines (faulthandler's) say more
SENT_FROM_OUTSIDE = frozenset(
    {
        signal.SIGKILL,
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
    }
)


def write_task(paths: RunPaths, task: RankCommand) -> None:
    """task.json, and the training's config (submitted.yaml): what the run's ranks run (each writes the
    same; the rename makes it whole)."""
    make_dirs(paths.root, "run directory")
    # its command.env may hold secrets: the owner's alone, even where HPC_GROUP shares the run
    write_atomic(paths.task, encode_task(task), mode=0o600)
    if task.config is not None:
        write_atomic(paths.submitted, dump_yaml(task.config))


class RankRun:
    """One rank's task from start to its exit record (see the module doc)."""

    def __init__(self, task: RankCommand, run_dir: Path, env: Mapping[str, str], stop: StopSignal):
        self.task = task
        self.paths = RunPaths(run_dir)
        self.env = dict(env)
        self.stop = stop
        self.dist: DistEnv = from_environ(env)
        self.attempt = attempt_of(env)
        self.group = group_key(self.attempt, self.dist)
        self.record = RankExit(
            rank=self.dist.rank,
            kind=RankEnd.RUNNING,
            local_rank=self.dist.local_rank,
            node_rank=self.dist.node_rank,
            world_size=self.dist.world_size,
            hostname=socket.gethostname(),
            # the node as Slurm names it (nid001...: the hostname on Perlmutter, not on a one-machine cluster)
            node=env.get("SLURMD_NODENAME") or socket.gethostname(),
            launcher=self.dist.launcher,
            attempt=self.attempt,
            group=self.group,
            logs={s: str(self.paths.rank_stream(self.dist.rank, s)) for s in ("out", "err")},
        )
        self.pumps: list[Pump] = []  # the task's stdout and stderr, kept in its logs and passed on
        self.hang: HangWatch | None = None  # where the start-up hook beats (a command's task)
        self.hung: str | None = None  # the line naming this rank frozen or hung
        self.stopping_since: float | None = None  # when the task was told to stop
        self.why_stopping: str | None = None  # a stop signal's name, or "rank R failed"
        self.killed = False

    def run(self) -> RankExit:
        folders: tuple[Path, ...] = (self.paths.ranks, self.paths.rank_stream(0, "out").parent, self.paths.traces)
        if self.task.profiler is not None:  # a command's: where torch writes NCCL's Flight Recorder dumps
            folders += (self.paths.flight_recorder_dir,)
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)  # traces/: where a profiled rank's traces go
        words = words_for(self.task, self.paths.root, sys.executable)
        keep_earlier(self.paths, self.dist.rank)
        self.write(kind=RankEnd.RUNNING, started_ns=time.time_ns(), command=words)
        # the node's GPUs, sampled by one rank a node (its first) while the task runs
        node = str(self.record.node)
        sampler = start_sampler(self.paths.gpu_samples(node), node, self.env) if self.dist.local_rank == 0 else None
        try:
            proc = self.start(words, *meet(self.paths, self.dist, self.group, self.task.requeue_codes, self.stop))
            code = self.follow(proc)
            self.end_session(proc.pid)
        except Unmet as e:  # the task never started: where its run meets did not come, or could not be held
            self.write(ended_ns=time.time_ns(), **e.args[0])
        except OSError as e:  # vanished since it was checked, or not executable on this node
            self.write(kind=RankEnd.FAILED, exit_code=127, ended_ns=time.time_ns(), message=f"could not start: {e}")
        else:
            for pump in self.pumps:  # the task's last lines are in its logs before its end is recorded
                pump.finish()
            self.write(**self.ending(code))
            if self.record.kind == RankEnd.STOPPED and code == 0 and self.dist.rank == 0:  # once, not a line a rank
                log.warning(f"hpc: the command exited 0 after {self.why_stopping}, {UNFINISHED}")
        finally:
            self.end_watch()
            if sampler is not None:
                sampler.stop()
        if self.record.kind in (RankEnd.FAILED, RankEnd.OOM):  # the others stop rather than fail in a collective
            with contextlib.suppress(OSError):
                failed_mark(self.paths, self.group).touch()
        elif self.dist.rank == 0:
            wait_for_records(self.paths, self.group, self.dist.world_size, SUMMARY_WAIT_S)
        if self.record.kind in (RankEnd.FAILED, RankEnd.OOM) or self.dist.rank == 0:
            with contextlib.suppress(OSError):  # a full disk: the records still say it
                summary = write_run_summary(self.paths)
                said = no_step_line(summary) if self.dist.rank == 0 else None
                if said:
                    log.warning(f"hpc: {said}")
        return self.record

    def start(self, words: list[str], meeting: Meeting, listener: socket.socket | None) -> subprocess.Popen[bytes]:
        """The task's process, in the rank's environment and where its run meets (rank 0's with the socket
        its store serves on)."""
        self.dist = dataclasses.replace(self.dist, master_port=meeting.port)
        env = {**rank_env(self.dist, self.paths.root, self.task, self.env, self.attempt), **meeting.env()}
        beat_read, beat_write, env[BEAT_VARIABLE] = beat_pipe()
        kept = (beat_write,) if listener is None else (beat_write, listener.fileno())
        if listener is not None:
            env[LISTEN_FD_VARIABLE] = str(listener.fileno())
        # Its own session: a terminal's Ctrl-C or a signal to this process group reaches the task only as
        # this rank passes it on, once (Slurm still signals it directly, and then nothing is passed on).
        try:
            proc = self.popen(words, env, kept)
        except OSError:
            os.close(beat_read)
            raise
        finally:
            os.close(beat_write)  # the task's alone: its end (and its workers') closes the pipe
            if listener is not None:
                listener.close()  # the task's now
        assert proc.stdout is not None and proc.stderr is not None  # both piped
        self.pumps = [
            Pump(proc.stdout, self.paths.rank_stream(self.dist.rank, "out"), 1),
            Pump(proc.stderr, self.paths.rank_stream(self.dist.rank, "err"), 2),
        ]
        self.write(pid=proc.pid)
        rank = self.dist.rank
        self.hang = HangWatch(  # every task, the training and a user's command: one liveness watch
            proc.pid,
            Beats(beat_read),
            self.task.hang_timeout_s,
            self.paths.rank_stack(rank),
            self.peer_failed,
            self.paths.flight_recorder(rank),
            busy=lambda: touch_mark(self.paths.rank_busy(rank)),
            peer_busy=lambda: busy_peers(self.paths, rank),
        )
        return proc

    def popen(self, words: list[str], env: dict[str, str], kept: tuple[int, ...]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            words,
            cwd=self.task.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=kept,
            preexec_fn=die_with(os.getpid()),
        )

    def follow(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for the task; pass stops on, stop it when a peer failed, kill it after the grace time. A
        stop signal is passed on from its handler, at once: a rank that learns of the stop from its peers
        (an all-reduce of a flag) may otherwise be on its way out when its own signal comes, and a signal
        during Python's exit, its handlers gone, kills it."""
        self.stop.listener = lambda signum: self.on_signal(proc, signum)
        if self.stop.signum is not None:  # came before the task started
            self.begin_stop(proc, signal.Signals(self.stop.signum).name)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=POLL_S)
            if self.stopping_since is None and not on_slurm(self.env):
                peers = failed_peers(self.paths, self.group, self.dist.rank)
                if peers:
                    self.begin_stop(proc, f"rank {peers[0]} failed")
            submitter = self.env.get(SUBMITTER_VARIABLE) or ""
            if self.stopping_since is None and submitter and gone(submitter):  # killed, even with SIGKILL
                self.write(orphaned=True)  # a stop nobody will follow (a local run: never requeued)
                self.begin_stop(proc, f"its submitter hpc.submit (pid {submitter.split(':')[0]}) ended")
            if self.stopping_since is None and self.hang is not None:
                self.hung = self.hang.check()
                if self.hung is not None:
                    log.error(f"hpc: rank {self.dist.rank} on {self.record.hostname}: {self.hung}")
                    self.kill(proc)
            if self.why_stopping is not None and self.record.stop is None:
                self.write(stop=self.why_stopping)
            if len(self.stop.passed) != len(self.record.signals_passed_on or []):
                self.write(signals_passed_on=self.passed_names())
            if self.stopping_since is not None and time.monotonic() - self.stopping_since > self.grace_s():
                self.kill(proc)

    def on_signal(self, proc: subprocess.Popen[bytes], signum: int) -> None:
        """In the handler: a stop signal stops the task; another (SIGUSR1, SIGQUIT) is passed on as it
        came, where stops are (on Slurm the task has it from Slurm already), never this process's death."""
        if signum not in StopSignal.PASSED:
            self.begin_stop(proc, signal.Signals(signum).name)
        elif passes_stops_on(self.env):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    def begin_stop(self, proc: subprocess.Popen[bytes], why: str) -> None:
        """Tell the task to stop (SIGTERM), once: on a stop signal (on Slurm, which sends the task its
        own, only noted), or when a peer failed. No file is written here: this runs in a signal handler."""
        if self.stopping_since is not None:
            return
        self.why_stopping = why
        self.stopping_since = time.monotonic()
        if why.startswith("rank ") and self.hang is not None and self.hang.beats.ready:
            with contextlib.suppress(ProcessLookupError):  # where it waited for the failed peer
                proc.send_signal(DUMP_SIGNAL)
        if why.startswith("rank ") or passes_stops_on(self.env):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def end_watch(self) -> None:
        """The beat's pipe closed; a stack file never dumped into removed (made at the first step), and the
        Flight Recorder's pipe."""
        if self.hang is not None:
            self.hang.beats.close()
        stack = self.paths.rank_stack(self.dist.rank)
        with contextlib.suppress(OSError):
            if stack.stat().st_size == 0:
                stack.unlink()
        with contextlib.suppress(OSError):
            self.paths.rank_busy(self.dist.rank).unlink()
        with contextlib.suppress(OSError):  # torch's, where a killed task left it
            self.paths.flight_recorder(self.dist.rank)[1].unlink()

    def end_session(self, pid: int) -> None:
        """What the task started in its session and left running ends with it (SIGKILL to its process
        group, which outlives its leader while a member lives; none left: nothing to do). A DataLoader's
        workers on their way out are such members too, so it is recorded, not said on the console."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        log.info(f"hpc: rank {self.dist.rank}: processes left in the command's session killed with it")
        self.write(leftovers_killed=True)

    def peer_failed(self) -> bool:
        return bool(failed_peers(self.paths, self.group, self.dist.rank))

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL to the task's whole process group (its session's: what it started and did not move)."""
        if self.killed:
            return
        if self.hung is None:
            log.warning(
                f"hpc: rank {self.dist.rank}: the task did not exit within {self.grace_s():g} s of the stop "
                f"({self.why_stopping}): killed"
            )
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def grace_s(self) -> float:
        return self.task.stop_grace_s if self.stop.signum is not None else min(PEER_GRACE_S, self.task.stop_grace_s)

    def ending(self, code: int) -> dict[str, Any]:
        """The exit record's end: how the task ended (kind), its code or signal, and a line on why."""
        signum = -code if code < 0 else None
        said = tail_lines(self.paths.rank_stream(self.dist.rank, "err"))
        end: dict[str, Any] = {
            "ended_ns": time.time_ns(),
            "exit_code": code if code >= 0 else None,
            "signal": signal.Signals(signum).name if signum else None,
            "stderr_tail": said,
            **({"signals_passed_on": self.passed_names()} if self.stop.passed else {}),
        }
        if self.hang is not None and self.task.profiler is not None:  # a command's: the steps its beats counted
            self.hang.beats.read()  # the last ones, written just before its end
            end["steps_seen"] = self.hang.beats.steps  # summary.json's steps where its facts stopped short
        what = f"exit {code}" if signum is None else f"signal {end['signal']}"
        facts = read_facts(self.paths).get(self.dist.rank)
        oom = code == EXIT_OOM and facts is not None and facts.oom is not None
        kind = kind_of_code(code, self.task.requeue_codes, oom) if signum is None else RankEnd.FAILED
        after = f" after {self.why_stopping}" if self.why_stopping else ""
        if self.hung is not None:
            return {**end, "kind": RankEnd.FAILED, "hung": True, "message": self.hung}
        if kind == RankEnd.OK and self.stop.signum is not None and not self.said_complete():
            return {**end, "kind": RankEnd.STOPPED, "message": f"{what} after {self.why_stopping}, {UNFINISHED}"}
        if kind in (RankEnd.OK, RankEnd.OOM):
            return {**end, "kind": kind, "message": None if kind == RankEnd.OK else last_said(said)}
        if kind == RankEnd.STOPPED:  # 3 says it saved; another requeue code (the training's 5) says why in its words
            why = "saved and stopped" if code == EXIT_PREEMPTED else last_said(said) or "asked to be requeued"
            return {**end, "kind": RankEnd.STOPPED, "message": f"{why} ({what}){after}"}
        if self.killed:
            return {**end, "kind": RankEnd.KILLED, "message": f"killed {self.grace_s():g} s after {self.why_stopping}"}
        if self.why_stopping and self.why_stopping.startswith("rank "):
            return {**end, "kind": RankEnd.PEER, "message": f"{what}, stopped because {self.why_stopping}"}
        if self.why_stopping:  # ended by the stop without saying it saved (a requeue code says so)
            return {**end, "kind": RankEnd.INTERRUPTED, "message": f"{what} after {self.why_stopping}"}
        if signum in SENT_FROM_OUTSIDE and not any(EXCEPTION_LINE.match(line) for line in said):  # the cause
            why = KILLED_FROM_OUTSIDE if signum == signal.SIGKILL else ENDED_BY_THE_SIGNAL
            return {**end, "kind": RankEnd.FAILED, "message": f"{what}: {why}"}
        return {**end, "kind": RankEnd.FAILED, "message": f"{what}: {last_said(said) or 'nothing on stderr'}"}

    def passed_names(self) -> list[str]:
        return [signal.Signals(s).name for s in self.stop.passed]

    def said_complete(self) -> bool:
        """Whether the task said it finished (the toolkit's training does in its facts; a script cannot)."""
        facts = read_facts(self.paths).get(self.dist.rank)
        return facts is not None and facts.complete is True

    def write(self, **fields: Any) -> None:
        """The rank's exit record with `fields` added, whole (a failed write is said, not raised: the
        task's own result matters more)."""
        self.record = msgspec.structs.replace(self.record, **fields)
        try:
            write_atomic(self.paths.rank_exit(self.dist.rank), encode_exit(self.record).decode())
        except OSError as e:
            log.warning(f"hpc: rank {self.dist.rank}: {self.paths.rank_exit(self.dist.rank)} not written ({e})")


BUSY_FRESH_S = 3.0  # a peer's busy mark touched this recently: it still works (its runner polls every POLL_S)


def touch_mark(path: Path) -> None:
    """The rank's busy mark, made or touched (its runner's, the owner's file; a failed touch is no error)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.utime(fd)
        finally:
            os.close(fd)


def busy_peers(paths: RunPaths, me: int) -> bool:
    """Whether another rank's runner said, within BUSY_FRESH_S, that its task works without stepping."""
    now = time.time()
    with contextlib.suppress(OSError):
        for mark in paths.ranks.glob("rank*.busy"):
            with contextlib.suppress(OSError):
                if mark != paths.rank_busy(me) and now - mark.stat().st_mtime < BUSY_FRESH_S:
                    return True
    return False


def die_with(parent: int) -> Callable[[], None]:
    """For the task's process, between fork and exec: SIGKILL when this runner dies, however it dies (a
    SIGKILL, torchrun's agent ending its worker after its grace): in a session of its own, nothing else
    would end it with the job. Linux's parent-death signal; the libc call is found before the fork."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the runner died before the line above: nothing would tell it
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def run_rank(task: RankCommand, run_dir: Path, env: Mapping[str, str] | None = None) -> RankExit:
    """Run one rank of the task here; its exit record. The stop signals are caught while it runs (in the
    StopSignal a door installed early, if one did)."""
    stop = StopSignal.take()
    try:
        return RankRun(task, run_dir, os.environ if env is None else env, stop).run()
    finally:
        stop.restore()
