"""Checkpointing: when to save, the atomic save with its checksum, and the checked load.

`Checkpointer` owns the policy (every `train.checkpoint_every_steps`, at epoch ends, at the end and on
a stop signal; rank 0 writes, every rank learns whether it could) and the files:
- checkpoints/last.pt: model (a plain state_dict, no DDP prefix), optimizer, schedule,
  epoch/position/step, the RNG states, and `sha256`, a checksum of all of them;
- checkpoints/previous.pt: the checkpoint before it, kept for when last.pt is found damaged (a hard
  link: no copy, no space);
- checkpoints/last.json: what last.pt holds, for readers without torch (hpc/core/summary.py run_state).

A save copies the state to the host once, checksums it, and writes a temp file, fsync, rename, with
previous.pt linked first: at every instant last.pt is a whole checkpoint. An epoch's end or a periodic
save that the run goes on from is written in the background (a thread, after the copy), off the steps'
critical path; the ranks agree on it at the next save or the run's end. A failed write (disk full,
read-only) is a WriteError naming the file, the earlier checkpoint intact. A load uses
`weights_only=True`, checks every entry resuming needs and recomputes the checksum over what it read,
so a byte flipped in a tensor is an error naming the file (offering previous.pt where it is intact),
never a silent resume from damaged weights.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec
import torch

from hpc.core.errors import UsageError, WriteError
from hpc.core.files import temp_name, write_atomic
from hpc.core.rundir import CheckpointInfo, RunPaths, read_checkpoint_info, write_checkpoint_info
from hpc.training import inject

CHECKPOINT_KEYS = {
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "epoch": int,
    "position": int,
    "step": int,
    "rng": dict,
}


class Stateful(Protocol):
    def load_state_dict(self, state: dict[str, Any], /) -> None: ...


DIGEST = "sha256"  # the checkpoint's own entry: state_digest of every other entry
DAMAGED = "damaged.pt"  # where --resume-from previous moves a damaged last.pt, for a look at it


def _feed(h: hashlib._Hash, value: Any) -> None:  # value: a checkpoint's nested state, of any JSON-like shape

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # its bytes, as a memoryview (no copy)
    elif isinstance(value, Mapping):
        h.update(b"{%d" % len(value))
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):  # a tuple saved comes back a tuple; a list, a list: one rule for both
        h.update(b"[%d" % len(value))
        for item in value:
            _feed(h, item)
    else:  # int, float (repr round-trips), str, bool, None
        h.update(f"{type(value).__name__}:{value!r}".encode())


def state_digest(state: Mapping[str, Any]) -> str:
    """sha256 over every entry but the checksum itself, in a fixed order: tensors by dtype, shape and
    bytes, the rest by value. The same on the saved state and on what torch.load gives back."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != DIGEST})
    return h.hexdigest()


def to_host(value: Any, copy: bool = False) -> Any:  # a checkpoint's nested state, of any shape: the same shape
    """The state with every tensor on the CPU: one copy off the device, shared by the checksum and the file.
    `copy`: a tensor already on the CPU is copied too (the state is written while training goes on)."""

    if isinstance(value, torch.Tensor):
        t = value.detach()
        return t.clone() if copy and t.device.type == "cpu" else t.cpu()
    if isinstance(value, dict):
        return {k: to_host(v, copy) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v, copy) for v in value)
    return value


def keep_previous(paths: RunPaths) -> None:
    """previous.pt becomes the current last.pt (a hard link, renamed into place), before last.pt is
    replaced. Where the file system has no hard links, no previous checkpoint is kept."""
    last, previous = paths.checkpoint, paths.previous_checkpoint
    if not last.exists() or (previous.exists() and os.path.samefile(last, previous)):
        return  # nothing yet, or previous.pt is last.pt already (--resume-from previous): rename() would do nothing
    tmp = temp_name(previous)
    try:
        os.link(last, tmp)
        os.replace(tmp, previous)
    except OSError:
        tmp.unlink(missing_ok=True)


def save_checkpoint(paths: RunPaths, state: dict[str, Any], info: CheckpointInfo) -> None:
    """last.pt with its checksum (atomic), previous.pt kept, then last.json. WriteError on failure."""

    host = to_host(state)
    host[DIGEST] = state_digest(host)
    buf = io.BytesIO()
    torch.save(host, buf)
    data = buf.getvalue()
    keep_previous(paths)
    inject.at_checkpoint(paths.checkpoint, data, info.step)  # the fault point: unarmed, nothing
    write_atomic(paths.checkpoint, data)
    written = msgspec.structs.replace(info, sha256=host[DIGEST], size=len(data), written_unix=time.time())
    write_checkpoint_info(paths, written)


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, checked for what resuming needs and against its checksum; None if there is
    none. A file that is damaged, foreign or incomplete is an input error naming it, and is left as it is."""

    if not path.exists():
        return None
    if not path.is_file():
        raise UsageError(f"{path}: not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged or foreign file
        # (not torch's own message: it suggests weights_only=False, i.e. running the file's code)
        raise UsageError(f"{path}: not a checkpoint this toolkit can load ({type(e).__name__})") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"{path}: not a checkpoint (holds a {type(ckpt).__name__}, not a mapping)")
    for key, kind in CHECKPOINT_KEYS.items():
        if not isinstance(ckpt.get(key), kind) or isinstance(ckpt.get(key), bool):
            raise UsageError(
                f"{path}: checkpoint entry {key!r} is "
                f"{'missing' if key not in ckpt else type(ckpt[key]).__name__}, expected {kind.__name__}"
            )
    if min(ckpt["epoch"], ckpt["position"], ckpt["step"]) < 0:
        raise UsageError(f"{path}: negative epoch/position/step in the checkpoint")
    if ckpt.get(DIGEST) != state_digest(ckpt):  # a checkpoint without one was not written whole by this toolkit
        raise UsageError(f"{path}: damaged: its contents do not match the checksum written with it")
    return ckpt


def rng_state(use_cuda: bool) -> dict:

    return {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()),
        "cuda": torch.cuda.get_rng_state() if use_cuda else None,
    }


def set_rng_state(rng: dict, use_cuda: bool) -> None:

    torch.set_rng_state(rng["torch"])
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in rng["python"]))
    if use_cuda and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"])


def restore(
    path: Path,
    ckpt: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: Stateful,
) -> None:
    """Load the checkpoint into the run's objects: weights, optimizer, schedule, and the train state
    (position and RNG: anything with load_state_dict). A mismatch (another architecture, a tensor of
    another shape, junk RNG state) names the file, not a traceback."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        state.load_state_dict(ckpt)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        raise UsageError(
            f"{path}: does not fit this run's model or optimizer ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
        ) from None


class Checkpointer:
    """The run's checkpoint: policy, save (rank 0; every rank then learns through `agree` whether it was
    written) and the checked load. `saved_step` is the step last.pt holds, as far as this run knows."""

    def __init__(
        self,
        run_dir: Path,
        every_steps: int,
        is_main: bool,
        agree: Callable[[bool], bool],
        log: Callable[[str], None],
    ):
        self.paths = RunPaths(run_dir)
        self.path = self.paths.checkpoint
        self.every_steps = every_steps
        self.is_main = is_main
        self.agree = agree
        self.log = log
        self.saved_step: int | None = None
        self.in_flight_step: int | None = None  # a checkpoint being written in the background (every rank)
        self.writer: CheckpointWriter | None = None  # rank 0's thread writing it

    def due(self, step: int) -> bool:
        """The periodic policy; epoch ends, the run's end and stop signals save regardless."""
        return bool(self.every_steps) and step % self.every_steps == 0

    def load(self) -> dict | None:
        """last.pt checked (see load_checkpoint); a damaged one is an error that offers previous.pt when that
        one is intact."""
        try:
            ckpt = load_checkpoint(self.path)
        except UsageError as e:
            raise UsageError(f"{e}{self._offer_previous()}") from None
        self.saved_step = ckpt["step"] if ckpt is not None else None
        return ckpt

    def _offer_previous(self) -> str:
        try:
            previous = load_checkpoint(self.paths.previous_checkpoint)
        except UsageError:
            previous = None
        if previous is None:
            return "; no intact earlier checkpoint: move it away to start afresh"
        return (
            f"; {self.paths.previous_checkpoint} (step {previous['step']}) is intact: "
            "add --resume-from previous to resume from it"
        )

    def use_previous(self) -> None:
        """--resume-from previous (rank 0, before anyone loads): last.pt moves aside to damaged.pt and
        previous.pt takes its place, so the run resumes from it and its next save keeps it as previous."""
        previous = self.paths.previous_checkpoint
        try:
            ckpt = load_checkpoint(previous)
        except UsageError as e:
            raise UsageError(f"--resume-from previous: {e}") from None
        if ckpt is None:
            raise UsageError(f"--resume-from previous: {previous} does not exist")
        if self.path.exists():
            os.replace(self.path, self.path.with_name(DAMAGED))
        os.link(previous, self.path)
        self.log(f"resuming from the previous checkpoint: {self.path.with_name(DAMAGED)} kept aside")

    def save(self, state: dict, reason: str, stop_at: int, complete: bool, background: bool = False) -> None:
        """Rank 0 writes; then every rank agrees, and a failure (rank 0's WriteError) stops every rank.
        `complete`: the run has nothing left to do (last.json says so for readers without torch).
        `background`: rank 0 copies the state off the device now and writes it on a thread while the
        training goes on; the ranks agree on it at the next save or settle(). A run with faults injected
        writes as any run does: the fault tests (tests/e2e/test_faults.py) meet the writer users run."""
        self.settle()
        info = CheckpointInfo(
            step=state["step"],
            epoch=state["epoch"],
            position=state["position"],
            stop_at=stop_at,
            complete=complete,
            reason=reason,
        )
        if background:
            if self.is_main:
                self.writer = CheckpointWriter(self.paths, to_host(state, copy=True), info, self.log)
            self.in_flight_step = state["step"]
            return
        error = save_and_say(self.paths, state, info, self.log) if self.is_main else None
        if self.agree(error is not None):
            raise error or WriteError(f"{self.path}: rank 0 could not write the checkpoint; stopping with it")
        self.saved_step = state["step"]

    def settle(self) -> None:
        """The checkpoint being written in the background, waited for (rank 0) and agreed on (every rank, at
        the same point of the run): its WriteError, or rank 0's failure, stops every rank here."""
        if self.in_flight_step is None:
            return
        step, self.in_flight_step = self.in_flight_step, None
        error = self.writer.wait() if self.writer is not None else None
        self.writer = None
        if self.agree(error is not None):
            raise error or WriteError(f"{self.path}: rank 0 could not write the checkpoint; stopping with it")
        self.saved_step = step

    def written_step(self) -> int | None:
        """The step last.pt holds, where a rerun resumes (a lost peer's line), without asking the peers:
        rank 0 waits for its own write in flight; then what checkpoints/last.json says (written after
        last.pt), so that a rank whose peer rank 0 died with a write in flight names what is on disk."""
        if self.writer is not None:
            self.writer.wait()
        info = read_checkpoint_info(self.paths)
        return info.step if info is not None else self.saved_step

    @property
    def latest_step(self) -> int | None:
        """The step of the last checkpoint asked for: the one in the background, else the one written."""
        return self.saved_step if self.in_flight_step is None else self.in_flight_step


def save_and_say(paths: RunPaths, state: dict, info: CheckpointInfo, log: Callable[[str], None]) -> WriteError | None:
    """save_checkpoint, then its line; the WriteError returned for the ranks to agree on."""
    try:
        save_checkpoint(paths, state, info)
    except WriteError as e:
        return e
    where = f"epoch {info.epoch}, batch {info.position}, step {info.step}"
    log(f"checkpoint ({info.reason}): {where} -> {paths.checkpoint}")
    return None


class CheckpointWriter:
    """One checkpoint written on a thread (checksum, file, last.json): a non-daemon thread, so a process
    leaving early still finishes it, atomically, before it exits."""

    def __init__(self, paths: RunPaths, host: dict, info: CheckpointInfo, log: Callable[[str], None]):
        self.error: WriteError | None = None
        self.thread = threading.Thread(target=self._run, args=(paths, host, info, log), name="hpc-checkpoint")
        self.thread.start()

    def _run(self, paths: RunPaths, host: dict, info: CheckpointInfo, log: Callable[[str], None]) -> None:
        self.error = save_and_say(paths, host, info, log)

    def wait(self) -> WriteError | None:
        self.thread.join()
        return self.error
