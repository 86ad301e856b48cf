"""A rank's records among the others' (RUN/ranks/, hpc/core/summary.py): which start of the world a
rank is in (`group_key`), a failed peer's mark and who failed, rank 0's wait for every rank's end, and
a rank's record of its earlier start kept aside (hpc/core/summary.py's keep_earlier). No torch import.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hpc.core.ending import RankEnd
from hpc.core.rundir import RunPaths
from hpc.core.summary import group_of, read_records
from hpc.placement.distenv import DistEnv

log = logging.getLogger(__name__)


def group_key(attempt: str, dist: DistEnv) -> str:
    """Which start of the world a rank is in, the same on every node: its attempt, but under torchrun
    the group's store too. torchrun's agents count restarts each for its own node (a node whose workers
    restart because another node's failed keeps its count), and each start of the group has a store of
    its own (hpc/placement/torchrun.py's AGENT_ENV)."""
    if dist.launcher != "torchrun":
        return attempt
    return f"{attempt.rsplit('.', 1)[0]}@{dist.master_addr}:{dist.master_port}"


def failed_mark(paths: RunPaths, group: str) -> Path:
    """Made by a rank that failed: one file every other rank can look for with one stat, where reading
    every rank's record would not scale (a thousand ranks on a parallel file system)."""
    return paths.ranks / f".failed.{group}"


def failed_peers(paths: RunPaths, group: str, me: int) -> list[int]:
    """The ranks of `group` other than `me` that failed on their own (read only once the mark is there)."""
    if not failed_mark(paths, group).exists():
        return []
    bad = (RankEnd.FAILED, RankEnd.OOM)
    return [r.rank for r in read_records(paths) if group_of(r) == group and r.rank != me and r.kind in bad]


def wait_for_records(paths: RunPaths, group: str, world_size: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """Until every rank of `group` has recorded its end (one listing and a few reads a poll), or timeout_s:
    rank 0 then writes the run's summary once, whole."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = [r for r in read_records(paths) if group_of(r) == group and r.ended_ns]
        if len(ended) >= world_size:
            return
        time.sleep(poll_s)
