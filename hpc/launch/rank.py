"""One rank of your own command: `run_rank` starts the command as a child process (its words verbatim,
no shell) with the rank's environment (hpc/spec/command.py: torchrun's contract, HPC_RUN_DIR, the
profiler's hook), its stdout and stderr in RUN/logs/rank{R}.out and .err, and records how it ended in
RUN/ranks/rank{R}.exit.json, whole (written before this process ends, so a failing rank is named even
when srun kills the others right after). Then summary.json is made again from every rank's record
(hpc/launch/outcome.py). No torch import: the command is the user's, and so is its interpreter.

Stops. Slurm delivers its signals (the time limit's warning, a preemption's SIGTERM) to every process
of the step, the command included, so here they are not passed on; on this machine (submitit's local
executor, a plain shell) the stop signal is passed on as the command's stop signal (SIGTERM). Either way
the command then has `stop_grace_s` to save and exit; one still running then is killed (SIGKILL) and
the rank ends as `killed`. A command that saved and exited with EXIT_PREEMPTED (3) ends as `stopped`:
the job requeues it (hpc/launch/cmdjob.py) and the same command, started again, resumes by itself.

A failed peer. Outside Slurm (submitit's local executor, a plain torchrun), where no srun
--kill-on-bad-exit ends the others, each rank looks for a failed rank's mark (one stat every POLL_S) and
stops its own command as for a stop, so that it does not wait in a collective until its timeout.

summary.json: rank 0 writes it once every rank has recorded its end (at most SUMMARY_WAIT_S after its
own), and a rank that fails writes it at once (rank 0 may be killed next); never every rank, which
would read every record under one lock (a thousand ranks, a parallel file system).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.errors import EXIT_PREEMPTED
from hpc.core.files import write_atomic
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.launch.outcome import (
    attempt_of,
    failed_mark,
    failed_peers,
    last_said,
    tail_lines,
    wait_for_records,
    write_command_summary,
)
from hpc.spec.command import CommandSpec, rank_env
from hpc.spec.distenv import DistEnv, from_environ

log = logging.getLogger(__name__)

POLL_S = 0.5
PEER_GRACE_S = 10  # a rank whose peer failed is stopped as for a signal, but given less time
SUMMARY_WAIT_S = 30  # rank 0 waits this long after its own end for the others' records


def on_slurm(env: Mapping[str, str]) -> bool:
    """Inside an srun step, where Slurm signals every process of the step itself."""
    return env.get("SLURM_STEP_ID") not in (None, "") and env.get("SUBMITIT_EXECUTOR") != "local"


class RankRun:
    """One rank's command from start to its exit record (see the module doc)."""

    def __init__(self, spec: CommandSpec, run_dir: Path, env: Mapping[str, str], stop: StopSignal):
        self.spec, self.paths, self.env, self.stop = spec, RunPaths(run_dir), dict(env), stop
        self.dist: DistEnv = from_environ(env)
        self.attempt = attempt_of(env)
        self.record: dict[str, Any] = {
            "rank": self.dist.rank,
            "local_rank": self.dist.local_rank,
            "node_rank": self.dist.node_rank,
            "world_size": self.dist.world_size,
            "hostname": socket.gethostname(),
            "launcher": self.dist.launcher,
            "attempt": self.attempt,
            "logs": {s: str(self.paths.rank_stream(self.dist.rank, s)) for s in ("out", "err")},
        }
        self.stopping_since: float | None = None  # when the command was told to stop
        self.why_stopping: str | None = None  # a stop signal's name, or "rank R failed"
        self.killed = False

    def run(self) -> dict[str, Any]:
        self.paths.ranks.mkdir(parents=True, exist_ok=True)
        self.paths.rank_stream(0, "out").parent.mkdir(parents=True, exist_ok=True)
        self.paths.traces.mkdir(parents=True, exist_ok=True)  # where a profiled rank's traces go
        words = self.spec.words(self.paths.root)
        self.write(kind="running", started_ns=time.time_ns(), command=words)
        try:
            code = self.follow(self.start(words))
        except OSError as e:  # vanished since it was checked, or not executable on this node
            self.write(kind="failed", exit_code=127, ended_ns=time.time_ns(), message=f"could not start: {e}")
        else:
            self.write(**self.ending(code))
        if self.record["kind"] == "failed":
            with contextlib.suppress(OSError):
                failed_mark(self.paths, self.attempt).touch()
        elif self.dist.rank == 0:
            wait_for_records(self.paths, self.attempt, self.dist.world_size, SUMMARY_WAIT_S)
        if self.record["kind"] == "failed" or self.dist.rank == 0:
            write_command_summary(self.paths)
        return self.record

    def start(self, words: list[str]) -> subprocess.Popen[bytes]:
        env = rank_env(self.dist, self.paths.root, self.spec, self.env)
        with (
            open(self.paths.rank_stream(self.dist.rank, "out"), "ab") as out,
            open(self.paths.rank_stream(self.dist.rank, "err"), "ab") as err,
        ):
            # Its own session: a terminal's Ctrl-C or a signal to this process group reaches the command only
            # as this rank passes it on, once (Slurm still signals it directly, and then nothing is passed on).
            proc = subprocess.Popen(
                words,
                cwd=self.spec.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self.write(pid=proc.pid)
        return proc

    def follow(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for the command; pass stops on, stop it when a peer failed, kill it after the grace time. A
        stop signal is passed on from its handler, at once: a rank that learns of the stop from its peers
        (an all-reduce of a flag) may otherwise be on its way out when its own signal comes, and a signal
        during Python's exit, its handlers gone, kills it."""
        self.stop.listener = lambda signum: self.begin_stop(proc, signal.Signals(signum).name)
        if self.stop.signum is not None:  # came before the command started
            self.begin_stop(proc, signal.Signals(self.stop.signum).name)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=POLL_S)
            if self.stopping_since is None and not on_slurm(self.env):
                peers = failed_peers(self.paths, self.attempt, self.dist.rank)
                if peers:
                    self.begin_stop(proc, f"rank {peers[0]} failed")
            if self.why_stopping is not None and "stop" not in self.record:
                self.write(stop=self.why_stopping)
            if self.stopping_since is not None and time.monotonic() - self.stopping_since > self.grace_s():
                self.kill(proc)

    def begin_stop(self, proc: subprocess.Popen[bytes], why: str) -> None:
        """Tell the command to stop (SIGTERM), once: on a stop signal (on Slurm, which sends the command its
        own, only noted), or when a peer failed. No file is written here: this runs in a signal handler."""
        if self.stopping_since is not None:
            return
        self.why_stopping, self.stopping_since = why, time.monotonic()
        if why.startswith("rank ") or not on_slurm(self.env):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        if self.killed:
            return
        log.warning(
            f"hpc: rank {self.dist.rank}: the command did not exit within {self.grace_s():g} s of the stop "
            f"({self.why_stopping}): killed"
        )
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def grace_s(self) -> float:
        return self.spec.stop_grace_s if self.stop.signum is not None else min(PEER_GRACE_S, self.spec.stop_grace_s)

    def ending(self, code: int) -> dict[str, Any]:
        """The exit record's end: how the command ended (kind), its code or signal, and a line on why."""
        signum = -code if code < 0 else None
        said = tail_lines(self.paths.rank_stream(self.dist.rank, "err"))
        end: dict[str, Any] = {
            "ended_ns": time.time_ns(),
            "exit_code": code if code >= 0 else None,
            "signal": signal.Signals(signum).name if signum else None,
            "stderr_tail": said,
        }
        what = f"exit {code}" if signum is None else f"signal {end['signal']}"
        if code == 0:
            return {**end, "kind": "ok", "message": None}
        if code == EXIT_PREEMPTED:
            after = f" after {self.why_stopping}" if self.why_stopping else ""
            return {**end, "kind": "stopped", "message": f"saved and stopped (exit {code}){after}"}
        if self.killed:
            return {**end, "kind": "killed", "message": f"killed {self.grace_s():g} s after {self.why_stopping}"}
        if self.why_stopping and self.why_stopping.startswith("rank "):
            return {**end, "kind": "peer", "message": f"{what}, stopped because {self.why_stopping}"}
        if self.why_stopping:  # ended by the stop without saying it saved (exit 3 says so)
            return {**end, "kind": "interrupted", "message": f"{what} after {self.why_stopping}"}
        return {**end, "kind": "failed", "message": f"{what}: {last_said(said) or 'nothing on stderr'}"}

    def write(self, **fields: Any) -> None:
        """The rank's exit record with `fields` added, whole (a failed write is said, not raised: the
        command's own result matters more)."""
        self.record.update(fields)
        try:
            write_atomic(self.paths.rank_exit(self.dist.rank), json.dumps(self.record, indent=1))
        except OSError as e:
            log.warning(f"hpc: rank {self.dist.rank}: {self.paths.rank_exit(self.dist.rank)} not written ({e})")


def run_rank(spec: CommandSpec, run_dir: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one rank of the command here; its exit record. The stop signals are caught while it runs."""
    stop = StopSignal.take()
    try:
        return RankRun(spec, run_dir, os.environ if env is None else env, stop).run()
    finally:
        stop.restore()
