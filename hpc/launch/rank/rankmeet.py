"""Where one start of a run meets (hpc/core/meet.py says what and why), from the launcher's side:

- `meet`, for each rank's runner: rank 0 holds a port of its node's (the kernel's pick, at MASTER_ADDR's
  address) and draws the run's secret, and publishes both in RUN/ranks/meeting.json; the others wait for
  them there. Under torchrun the port is torchrun's pick and rank 0's task binds it itself. torchrun's
  agents meet on a port the batch shell picked on the job's first node (hpc/launch/batch.py `step_words`).

No torch import.
"""

from __future__ import annotations

import signal
import socket

from hpc.core.ending import RankEnd
from hpc.core.errors import EXIT_FAILED, EXIT_PEER_LOST, StoreError
from hpc.core.meet import MEET_TIMEOUT_S, Meeting, await_meeting, listen, new_secret, publish
from hpc.core.rundir import RunPaths
from hpc.core.stop import StopSignal
from hpc.core.summary import kind_of_code
from hpc.launch.rank.rankrecords import failed_peers
from hpc.placement.distenv import DistEnv


class Unmet(Exception):
    """The rank's task cannot start: args[0] is the end of its exit record (kind, exit code, message)."""


def meet(
    paths: RunPaths, dist: DistEnv, group: str, requeue_codes: tuple[int, ...], stop: StopSignal
) -> tuple[Meeting, socket.socket | None]:
    """This rank's meeting, and for rank 0 the listening socket its task's store serves on. Unmet when it
    cannot be: rank 0's port taken (failed, exit 1: never requeued); nothing published within
    MEET_TIMEOUT_S (as the training's own lost peer: exit 5), a stop signal or a failed peer first."""
    if dist.rank == 0:
        listener = None
        try:
            if dist.launcher != "torchrun":
                listener = listen(dist.master_addr, dist.master_port or 0)
            port = listener.getsockname()[1] if listener is not None else dist.master_port
            meeting = Meeting(group, dist.master_addr, int(port or 0), new_secret())
            publish(paths.meeting, meeting)
        except (StoreError, OSError) as e:
            if listener is not None:
                listener.close()
            raise Unmet({"kind": RankEnd.FAILED, "exit_code": EXIT_FAILED, "message": str(e)}) from None
        return meeting, listener

    def why_not_wait() -> str | None:
        peers = failed_peers(paths, group, dist.rank)
        return stopped(stop) or (f"rank {peers[0]} failed before this rank's task started" if peers else None)

    found, why = await_meeting(paths.meeting, group, MEET_TIMEOUT_S, why_not_wait)
    if found is not None:
        return found, None
    if stop.signum is not None:
        raise Unmet({"kind": RankEnd.INTERRUPTED, "exit_code": None, "message": why})
    if failed_peers(paths, group, dist.rank):
        raise Unmet({"kind": RankEnd.PEER, "exit_code": None, "message": why})
    kind = kind_of_code(EXIT_PEER_LOST, requeue_codes)  # as the training's own, when rank 0 never came
    raise Unmet({"kind": kind, "exit_code": EXIT_PEER_LOST, "message": why})


def stopped(stop: StopSignal) -> str | None:
    """Why waiting for a meeting ends early: a stop signal came before the task started."""
    return f"{signal.Signals(stop.signum).name} before the task started" if stop.signum is not None else None
