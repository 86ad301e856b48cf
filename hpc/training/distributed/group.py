"""The run's ranks as one: what they agree on, and who is who when one of them is lost.

`RankGroup` holds the control group (gloo: flags cost no GPU synchronisation) and answers for the
trainer's parts: `agree(flag)` (did any rank fail at this point? everyone learns it at once, so no rank
waits in a collective for one that gave up), `all_max`, `barrier`, `sync_buffers`. At start it gathers
every rank's host and pid (`roster`), so that when a collective fails because a peer died or went
silent, a survivor can say which rank it was and not just "Connection reset by peer": a rank on its
own host is checked by pid; on any host, a rank whose heartbeat stopped (hpc/training/distributed/rendezvous.py)
is frozen or dead, and named with its host.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as tdist

from hpc.core.errors import PeerLostError
from hpc.core.proc import proc_stat, process_state
from hpc.placement.distenv import DistEnv
from hpc.training.distributed.rendezvous import SILENCE_S, cause_of, first_few, silent_ranks

# A killed rank's sockets close before its process has ended (the kernel releases its memory, closes its
# files, and only then makes it a zombie), so its peer may ask while it is still exiting: ask again for
# this long before saying that every rank still runs.
DYING_GRACE_S = 2.0


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs: not a zombie (dead but not yet reaped), and not
    exiting (its memory already released: /proc's vsize is 0 once a killed process has let it go)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat(pid)
    if fields is None or len(fields) < 21:
        return True
    return fields[0] not in ("Z", "X") and fields[20] != "0"  # state; vsize, the 23rd field


class RankGroup:
    """The ranks of one run (see the module doc). `control` None: the default group (gloo on a CPU);
    `store` the run's store (None: one rank), where the heartbeats are read."""

    def __init__(self, dist: DistEnv, control: tdist.ProcessGroup | None, store: tdist.Store | None = None):
        self.dist = dist
        self.control = control
        self.store = store
        self.roster: list[tuple[str, int]] = [(socket.gethostname(), os.getpid())]

    def gather_roster(self) -> None:
        """Every rank's (host, pid), once, at set-up."""
        me = (socket.gethostname(), os.getpid())
        if self.dist.world_size == 1:
            return
        everyone: list[tuple[str, int] | None] = [None] * self.dist.world_size
        tdist.all_gather_object(everyone, me, group=self.control)
        self.roster = [(str(r[0]), int(r[1])) for r in everyone if r is not None]  # every slot is filled

    def gather(self, value: object) -> list[object]:
        """Every rank's `value`, in rank order, on every rank (pickled: small values only)."""
        if self.dist.world_size == 1:
            return [value]
        everyone: list[object] = [None] * self.dist.world_size
        tdist.all_gather_object(everyone, value, group=self.control)
        return everyone

    def barrier(self) -> None:
        tdist.barrier(group=self.control)

    def all_max(self, values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        if self.dist.world_size > 1:
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=self.control)
        return [int(v) for v in t.tolist()]

    def agree(self, failed: bool) -> bool:
        """True when any rank failed here; every rank learns it at the same point."""
        return bool(self.all_max([int(failed)])[0])

    def sync_buffers(self, model: torch.nn.Module) -> None:
        # DDP does not broadcast buffers here (broadcast_buffers=False, hpc/training/build.py): each rank's
        # BatchNorm running stats follow its own batches. Rank 0's are made everyone's where they are read,
        # so evaluation and the final weights are rank 0's everywhere.

        if self.dist.world_size > 1:
            for buf in model.buffers():
                tdist.broadcast(buf, 0)

    def lost_error(self, error: BaseException, step: int, saved_step: int | None, checkpoint: Path) -> PeerLostError:
        """The survivor's one line: which peer, during which step, what a rerun resumes from."""
        kept = (
            f"last checkpoint: step {saved_step} ({checkpoint}), where a rerun resumes"
            if saved_step is not None
            else "no checkpoint yet: a rerun starts afresh"
        )
        return PeerLostError(
            f"rank {self.dist.rank} lost a peer during step {step}: {self.lost()} ({cause_of(error)}); {kept}"
        )

    def lost(self) -> str:
        """Which peers are gone, as far as this rank can tell: those on its host whose process has ended
        (by pid); else those whose heartbeat stopped (frozen or dead, on any host; rank 0 when its store
        does not answer); else the other hosts of the run, which it cannot check."""
        host = socket.gethostname()
        peers = [(r, h, pid) for r, (h, pid) in enumerate(self.roster) if r != self.dist.rank]
        dead = _ended([(r, pid) for r, h, pid in peers if h == host])
        if dead:
            return f"{', '.join(dead)} on {host} ended"
        silent = silent_ranks(self.store, self.dist.world_size, self.dist.rank) if self.store is not None else []
        if silent is None and self.dist.elastic_attempt is not None:
            return f"the run's store (torchrun's agent on {self.dist.master_addr}) stopped answering"
        if silent is None:
            return f"{self.who(0)}, which hosts the run's store, stopped answering (frozen, or gone)"
        if silent:
            who = first_few([self.who(r) for r in silent])
            return f"{who} stopped answering: no heartbeat for {SILENCE_S:g} s (frozen, or its node is gone)"
        elsewhere = sorted({h for _, h, _ in peers if h != host})
        if elsewhere:
            return f"a rank on {', '.join(elsewhere)} died or stopped answering"
        if len(self.roster) < self.dist.world_size:
            return "a peer died or stopped answering during set-up"
        return "a peer stopped answering (every rank on this host still runs)"

    def who(self, rank: int) -> str:
        """'rank 1 on nid001 (pid 4242, stopped: SIGSTOP or a debugger)': its host and pid from the roster,
        and the state of its process where it runs on this host."""
        if rank >= len(self.roster):
            return f"rank {rank}"
        host, pid = self.roster[rank]
        state = process_state(pid) if host == socket.gethostname() else None
        said = {"T": ", stopped: SIGSTOP or a debugger", "t": ", stopped by a debugger", "D": ", stuck in I/O"}
        return f"rank {rank} on {host} (pid {pid}{said.get(state or '', '')})"


def _ended(peers: list[tuple[int, int]], grace_s: float = DYING_GRACE_S) -> list[str]:
    """Which of these (rank, pid) of this host have ended, asked until one has or `grace_s` is over."""
    deadline = time.monotonic() + grace_s
    while True:
        dead = [f"rank {r} (pid {pid})" for r, pid in peers if not pid_alive(pid)]
        if dead or not peers or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)
