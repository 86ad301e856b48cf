"""Taking a run directory at start, and reading where it left off.

`claim_run_dir`: rank 0 locks the directory (hpc/core/lock.py: a second writer is refused in one line
naming the holder) and, holding the lock, removes the temp files earlier writers left when they were
killed (all of them are dead writers': the lock excludes a live one, and no rank of this run has
written yet); with `--resume-from previous` it puts the previous checkpoint in place. Every rank learns
at once whether it may go on, so a refused run leaves no rank waiting in a collective.

`note_start`: rank 0 writes a fresh run's config.yaml; after a resume it cuts metrics.jsonl back to
the resumed step (the steps redone after it are not recorded twice) and makes checkpoints/last.json
say what the checkpoint it read holds.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

from hpc.core.errors import HpcError, UsageError, WriteError
from hpc.core.files import write_failure
from hpc.core.lock import RunLock
from hpc.core.rundir import (
    CheckpointInfo,
    RunPaths,
    read_checkpoint_info,
    truncate_metrics,
    write_checkpoint_info,
    write_yaml,
)
from hpc.training.checkpoint import Checkpointer
from hpc.training.distributed.group import RankGroup


def remove_debris(paths: RunPaths) -> list[str]:
    """Remove the temp files in the run directory (only under its lock: then no live writer owns one)."""
    removed = []
    for path in paths.debris():
        with suppress(FileNotFoundError):
            path.unlink()
            removed.append(str(path.relative_to(paths.root)))
    return removed


def claim_run_dir(
    paths: RunPaths,
    lock: RunLock,
    group: RankGroup,
    checkpointer: Checkpointer,
    resume_from: str,
    log: Callable[[str], None],
) -> None:
    """Rank 0 takes the lock, cleans up, and with resume_from "previous" swaps the checkpoints; every rank
    then agrees, and a refusal or failure stops them all (rank 0 with its own line)."""
    error: HpcError | None = None
    if group.dist.rank == 0:
        try:
            note = lock.acquire(str(paths.root))
            if note:
                log(note)
            removed = remove_debris(paths)
            if removed:
                log(f"removed {len(removed)} temp file(s) killed writers left: {', '.join(removed[:4])}")
            if resume_from == "previous":
                checkpointer.use_previous()
        except HpcError as e:
            error = e
    if group.agree(error is not None):
        raise error or UsageError(f"{paths.root}: rank 0 could not take the run directory (its line says why)")


def note_start(
    paths: RunPaths, config: dict[str, Any], resumed: dict[str, int] | None, stop_at: int, log: Callable[[str], None]
) -> WriteError | None:
    """Rank 0, after loading the checkpoint (`resumed`: its step, epoch and position; None for a fresh
    start): config.yaml for a fresh run, metrics.jsonl cut back to the step, last.json made to say what
    last.pt holds (a kill between a checkpoint's rename and its last.json leaves that one step behind;
    a fresh start has none). A failed write is returned, for every rank to learn of it."""
    try:
        if resumed is None:
            write_yaml(paths.config, config)
            if paths.checkpoint_info.exists():
                paths.checkpoint_info.unlink()
        elif (info := read_checkpoint_info(paths)) is None or info.step != resumed["step"]:
            held = CheckpointInfo(
                step=resumed["step"],
                epoch=resumed["epoch"],
                position=resumed["position"],
                stop_at=stop_at,
                reason="resumed",
            )
            write_checkpoint_info(paths, held)
        step = resumed["step"] if resumed else 0
        dropped = truncate_metrics(paths.metrics, step, resumed["epoch"] if resumed else None)
    except OSError as e:
        return e if isinstance(e, WriteError) else write_failure(e.filename or paths.root, e, True)
    if dropped:
        log(f"{paths.metrics}: {dropped} record(s) after step {step} dropped (those steps run again now)")
    return None
