"""How the ranks meet, and how a survivor tells a frozen or missing rank from a busy one.

`join(dist, use_cuda, timeout_s)`: the run's store (a TCPStore that rank 0 hosts; under torchrun the
agent's, keyed by the restart), each rank's mark in it (host and pid), then the process group over it.
When the group cannot form within `timeout_s` (train.collective_timeout_s), the store says who signed
in, and the line names the ranks that did not and where Slurm's layout put them. A rank that cannot
reach the store at all says that rank 0, which hosts it, never came.

`Heartbeat`: a thread of every rank adds one to its count in the store every BEAT_S. A rank blocked in
a collective still counts (its thread runs); a frozen rank (SIGSTOP, a node that hangs) or a dead one
does not. `silent_ranks` reads every count twice, SILENCE_S apart, after a collective has failed: the
ranks whose count did not move are the ones to name. Costs: one small store write per rank every
BEAT_S (a 1024-rank job: about 500 writes a second to rank 0's store), nothing on the step's path.
No Python stack is read and no rank is killed here: the survivors say who, then end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch.distributed as tdist

from hpc.core.errors import PeerLostError, StoreError
from hpc.core.owner import open_append
from hpc.placement.distenv import DistEnv
from hpc.placement.hostlist import expand_hostlist
from hpc.training.distributed.runstore import run_store, sealed

BEAT_S = 2.0  # a heartbeat's period
SILENCE_S = 2.5 * BEAT_S  # a count that does not move for this long: the rank is not running
JOINED, BEAT = "hpc/joined/", "hpc/beat/"

# What a collective's failure says when its peer is gone: a transport error or a timeout, from gloo,
# NCCL or the store. Anything else is the program's own error and is reported as it is.
PEER_SIGNS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Connection refused",
    "Broken pipe",
    "Timed out",
    "Application timeout caused pair closure",  # gloo, when the timeout closes a pair another wait used
    "timed out",
    "Socket Timeout",
    "before timing out",
    "NCCL communicator was aborted",
    "remote process exited",
)


def is_peer_failure(error: BaseException) -> bool:
    """A failed collective whose cause is another rank (dead, or not answering), by its type or message."""

    kinds = tuple(k for k in (getattr(tdist, "DistNetworkError", None), getattr(tdist, "DistStoreError", None)) if k)
    if kinds and isinstance(error, kinds):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in PEER_SIGNS)


def cause_of(error: BaseException) -> str:
    """The transport's own words, without its paths and advice: 'Connection reset by peer', 'Timed out ...'."""
    text = " ".join(str(error).split())
    for sign in PEER_SIGNS:
        if sign in text:
            start = text.index(sign)
            return text[start : start + 120].split(". ")[0].rstrip(".")
    return text[:120]


def open_store(dist: DistEnv, timeout: dt.timedelta, master: bool) -> tdist.Store:
    """The run's store: rank 0 hosts it (`master`: on its runner's socket), the others connect; sealed with
    the run's secret (hpc/training/distributed/runstore.py); under torchrun's shared store the agent hosts it and keeps
    it across restarts, so each start of the worker group has its own keys."""
    if dist.master_port is None:
        raise StoreError(f"rank {dist.rank}: MASTER_PORT is not set (a runner sets it: hpc/core/meet.py)")
    if dist.elastic_attempt is not None:
        base = tdist.TCPStore(dist.master_addr, dist.master_port, dist.world_size, is_master=False, timeout=timeout)
        return sealed(tdist.PrefixStore(f"hpc/attempt{dist.elastic_attempt}/", base))
    return run_store(
        dist.master_addr, dist.master_port, dist.world_size, is_master=master, timeout=timeout, wait_for_workers=False
    )


@contextlib.contextmanager
def stderr_to(path: Path | None) -> Iterator[None]:
    """The process's stderr (file descriptor 2) appended to `path` for a while: c10d's C++ logger writes
    its retries and a C++ stack there while a rank waits for its peers, which belong in the rank's log,
    not on the console, where the one line says what happened. None, or a file that cannot be opened:
    stderr as it is."""
    try:
        if path is None:
            raise OSError
        path.parent.mkdir(parents=True, exist_ok=True)
        target = open_append(path)
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def join(
    dist: DistEnv, use_cuda: bool, timeout_s: int, log_path: Path | None = None
) -> tuple[str, tdist.ProcessGroup | None, tdist.Store | None]:
    """(backend, control group, the run's store): NCCL or gloo for the model; stop and divergence flags
    travel on a CPU (gloo) group, so checking them costs no GPU synchronisation. A rank that does not come
    within `timeout_s` is a PeerLostError naming it; c10d's own words while waiting go to `log_path`."""
    timeout = dt.timedelta(seconds=timeout_s)
    with stderr_to(log_path if dist.world_size > 1 else None):
        backend, store = _form(dist, use_cuda, timeout)
        control = tdist.new_group(backend="gloo", timeout=timeout) if use_cuda else None
    return backend, control if isinstance(control, tdist.ProcessGroup) else None, store  # None: the default group


def _form(dist: DistEnv, use_cuda: bool, timeout: dt.timedelta) -> tuple[str, tdist.Store | None]:
    """The default process group over the run's store (None for one rank: a private one)."""
    backend, timeout_s = ("nccl" if use_cuda else "gloo"), int(timeout.total_seconds())
    store: tdist.Store | None = None
    if dist.world_size == 1:  # DDP over one process, as the study's 1-GPU runs; a private store needs no port
        tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        try:
            store = open_store(dist, timeout, master=dist.rank == 0)
        except Exception as e:
            if not is_peer_failure(e):
                raise
            raise PeerLostError(
                f"rank {dist.rank} could not reach the run's store at {dist.master_addr}:{dist.master_port} within "
                f"{timeout_s} s: rank 0, which hosts it, never started there or cannot be reached ({cause_of(e)})"
            ) from None
        store.set(f"{JOINED}{dist.rank}", f"{socket.gethostname()} {os.getpid()}")
        try:
            tdist.init_process_group(
                backend,
                store=tdist.PrefixStore("pg/", store),
                rank=dist.rank,
                world_size=dist.world_size,
                timeout=timeout,
            )
        except Exception as e:
            if not is_peer_failure(e):
                raise
            raise PeerLostError(
                f"rank {dist.rank}: the group did not form within {timeout_s} s (train.collective_timeout_s): "
                f"{never_joined(store, dist)} ({cause_of(e)})"
            ) from None
    return backend, store


def expected_host(rank: int, dist: DistEnv, env: Mapping[str, str]) -> str | None:
    """Where Slurm's layout puts `rank` (block distribution, srun's default), when this is a srun-launched job
    with the same number of tasks on each node; None otherwise. Not under torchrun: its c10d rendezvous numbers
    the nodes in the order their agents arrive (seen at 8 nodes: rank 0 on the job's third node)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist or dist.launcher == "torchrun" or dist.world_size != dist.num_nodes * dist.local_world_size:
        return None
    try:
        hosts = expand_hostlist(nodelist)
    except ValueError:
        return None
    node = rank // dist.local_world_size
    return hosts[node] if node < len(hosts) else None


def first_few(words: list[str], most: int = 4) -> str:
    """'a, b, c, d and 2 more': a line names a few ranks, not a thousand."""
    more = f" and {len(words) - most} more" if len(words) > most else ""
    return ", ".join(words[:most]) + more


def named(ranks: list[int], dist: DistEnv, env: Mapping[str, str], most: int = 4) -> str:
    """'rank 3 (on nid002), rank 7 (on nid002) and 2 more': the first few, with their expected hosts."""
    hosts = {r: expected_host(r, dist, env) for r in ranks[:most]}
    return first_few([f"rank {r}" + (f" (on {hosts[r]})" if hosts.get(r) else "") for r in ranks], most)


def never_joined(store: tdist.Store, dist: DistEnv) -> str:
    """Which ranks never signed in to the store, said for the one line."""
    try:
        missing = [r for r in range(dist.world_size) if not store.check([f"{JOINED}{r}"])]
    except Exception:  # the store went away too: rank 0 is gone
        return "rank 0, which hosts the run's store, stopped answering"
    if not missing:
        return "every rank signed in, but they could not connect to one another"
    return f"{named(missing, dist, os.environ)} never joined"


class Heartbeat:
    """This rank's count in the store, one more every BEAT_S, from a thread with its own connection (the
    step's path never waits for it). `stop()` ends it; a store that stops answering ends it too."""

    def __init__(self, dist: DistEnv, timeout_s: int):
        self.key = f"{BEAT}{dist.rank}"
        self.client = open_store(dist, dt.timedelta(seconds=min(timeout_s, 60)), master=False)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hpc-heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.client.add(self.key, 1)
            except Exception:
                return  # the store is gone (rank 0 ended): there is nobody left to tell
            if self.done.wait(BEAT_S):
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=BEAT_S)


def silent_ranks(store: tdist.Store, world_size: int, me: int) -> list[int] | None:
    """The ranks whose heartbeat did not move in SILENCE_S (frozen or dead); None when the store itself
    does not answer (rank 0, which hosts it, is frozen or gone)."""
    keys = [f"{BEAT}{r}" for r in range(world_size)]
    first = _counts(store, keys)
    time.sleep(SILENCE_S)
    second = _counts(store, keys) if first is not None else None
    if first is None or second is None:
        return None
    return [r for r in range(world_size) if r != me and first[r] == second[r]]


def _counts(store: tdist.Store, keys: list[str]) -> list[int] | None:
    """Every key's count (add 0: no wait for a missing key), or None when the store has not answered in
    SILENCE_S. A TCPStore's own timeout bounds its waits for keys, not a request to a frozen host, which
    blocks for ever: so the request runs in a thread, and is left there if it does not come back."""
    out: list[list[int]] = []

    def read() -> None:
        with contextlib.suppress(Exception):  # a store gone (connection refused) is one that did not answer
            out.append([store.add(k, 0) for k in keys])

    thread = threading.Thread(target=read, name="hpc-roll-call", daemon=True)
    thread.start()
    thread.join(SILENCE_S)
    return out[0] if out else None
