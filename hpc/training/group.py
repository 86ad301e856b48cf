"""The run's ranks as one: what they agree on, and who is who when one of them is lost.

`RankGroup` holds the control group (gloo: flags cost no GPU synchronisation) and answers for the
trainer's parts: `agree(flag)` (did any rank fail at this point? everyone learns it at once, so no rank
waits in a collective for one that gave up), `all_max`, `barrier`, `sync_buffers`. At start it gathers
every rank's host and pid (`roster`), so that when a collective fails because a peer died or went
silent, a survivor can say which rank it was and not just "Connection reset by peer": a rank on its
own host is checked by pid; of a rank elsewhere only its host is known.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as tdist

from hpc.core.errors import PeerLostError
from hpc.spec.distenv import DistEnv

# What a collective's failure says when its peer is gone: a transport error or a timeout, from gloo,
# NCCL or the store. Anything else is the program's own error and is reported as it is.
PEER_SIGNS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Connection refused",
    "Broken pipe",
    "Timed out",
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
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
        return fields[0] not in ("Z", "X") and fields[20] != "0"  # state; vsize, the 23rd field
    except (OSError, IndexError):
        return True


def cause_of(error: BaseException) -> str:
    """The transport's own words, without its paths and advice: 'Connection reset by peer', 'Timed out ...'."""
    text = " ".join(str(error).split())
    for sign in PEER_SIGNS:
        if sign in text:
            start = text.index(sign)
            return text[start : start + 120].split(". ")[0].rstrip(".")
    return text[:120]


class RankGroup:
    """The ranks of one run (see the module doc). `control` None: the default group (gloo on a CPU)."""

    def __init__(self, dist: DistEnv, control: tdist.ProcessGroup | None):
        self.dist, self.control = dist, control
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
        # DDP broadcasts buffers (BatchNorm running stats) from rank 0 at the *start* of each forward,
        # so after the last step every rank holds its own. Do that broadcast now, so evaluation and the
        # final weights are rank 0's everywhere.

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
        (by pid), else the other hosts of the run, which it cannot check."""
        host = socket.gethostname()
        peers = [(r, h, pid) for r, (h, pid) in enumerate(self.roster) if r != self.dist.rank]
        dead = _ended([(r, pid) for r, h, pid in peers if h == host])
        if dead:
            return f"{', '.join(dead)} on {host} ended"
        elsewhere = sorted({h for _, h, _ in peers if h != host})
        if elsewhere:
            return f"a rank on {', '.join(elsewhere)} died or stopped answering"
        if len(self.roster) < self.dist.world_size:
            return "a peer died or stopped answering during set-up"
        return "a peer stopped answering (every rank on this host still runs)"


def _ended(peers: list[tuple[int, int]], grace_s: float = DYING_GRACE_S) -> list[str]:
    """Which of these (rank, pid) of this host have ended, asked until one has or `grace_s` is over."""
    deadline = time.monotonic() + grace_s
    while True:
        dead = [f"rank {r} (pid {pid})" for r, pid in peers if not pid_alive(pid)]
        if dead or not peers or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)
