"""torch.profiler around the training loop: one trace per rank per cycle, plus key_averages() totals.

`maybe_profile(cfg, trace_dir, who, cuda)` yields a `Profiling` (call `.step()` after every
optimizer step) or None when profiling is off, or profiler.ranks leaves rank `who` out (`RankChoice`,
`Choice`: every rank of a small job, node leaders and the slowest ranks of a large one), in which case
nothing is recorded.

What the profiler costs is measured, not guessed: each cycle's record says how long the host spent
inside the profiler's own calls (starting, stopping, exporting: `profiler_host_s`), and how long the
export and the key_averages() totals took within that (`export_s`, `key_averages_s`).

A trace is published whole or not at all (`publish_trace`): Kineto writes it under a temp name, the
text is checked to end as a JSON document ends, and only then is it renamed to its final name. Kineto
reports a failed write (a full disk, a read-only one) only in a log line and raises nothing; here such
an export is recorded in `Profiling.failed` with its cause, its temp files removed, and the run goes on
(the trainer fails the run at its end, once the rest is written).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule
from torch.torch_version import TorchVersion

from hpc.core.files import JsonObject, temp_name
from hpc.core.rundir import trace_worker
from hpc.core.summary import TraceFailure
from hpc.settings.profranks import chosen, static_choice
from hpc.settings.schema import ProfilerConfig
from hpc.training import inject

log = logging.getLogger(__name__)

# Over 16 ranks (profiler.ranks auto), steps timed after the first before the slowest ranks are chosen
TIMED_BEFORE_CHOICE = 2
LOW_SPACE_BYTES = 1 << 20  # less than this free after a failed export: it was the disk that was full

DEVICE_COPY_PREFIXES = ("Memcpy", "Memset")  # key_averages' names for gpu_memcpy / gpu_memset events


def key_average_totals(prof: profile) -> JsonObject:
    """The profiler's own totals for one cycle, kept to cross-check the trace analysis.

    key_averages() holds CPU operators and device events (kernels, memcpys, memsets) side by side. A
    CPU operator's self device time is the time of the kernels it launched, so summing self device
    time over every row counts each kernel twice: device time is summed over device rows only. Those
    include the GPU side of record_function ranges (`gpu_user_annotation` in the trace: ProfilerStep#N,
    DistributedDataParallel.forward, Optimizer.step, each spanning whole steps), which are no device
    work and are left out.
    """

    events = prof.key_averages()
    self_cpu_us = sum(e.self_cpu_time_total for e in events)
    on_device = [e for e in events if getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU]
    # A range's GPU side carries is_user_annotation where torch sets it, and always its CPU side's name.
    cpu_names = {e.key for e in events if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU}
    device_rows = [e for e in on_device if not getattr(e, "is_user_annotation", False) and e.key not in cpu_names]
    # Renamed over torch versions: self_cuda_time_total (<=2.3) -> self_device_time_total.
    device_us = sum(
        getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0 for e in device_rows
    )
    kernel_calls = sum(e.count for e in device_rows if not e.key.startswith(DEVICE_COPY_PREFIXES))
    op_calls = {e.key: e.count for e in events if e.key.startswith("aten::")}
    return {
        "self_cpu_time_total_us": float(self_cpu_us),
        "self_device_time_total_us": float(device_us),
        "device_events": int(sum(e.count for e in device_rows)),
        "kernel_calls": int(kernel_calls),
        "conv2d_calls": int(op_calls.get("aten::conv2d", 0)),
        "op_calls": op_calls,
    }


@dataclasses.dataclass(frozen=True)
class RankChoice:
    """What profiler.ranks needs of a rank: who it is and, where every rank's timing decides (auto over 16
    ranks, hpc/settings/profranks.py), a collective that gathers one value from every rank and this rank's own
    work per step so far. No `gather` (a user's script, whose collectives are its own): node leaders only."""

    rank: int
    local_rank: int = 0
    world_size: int = 1
    gather: Callable[[object], list[object]] | None = None
    own_work_s: Callable[[], float | None] = lambda: None


class Choice:
    """Whether this rank records: decided at once, or before the profiler's first window from every rank's
    own work so far (all ranks call `decide` at the same step, as a collective needs)."""

    def __init__(self, setting: str, who: RankChoice, wait: int = 0):
        self.setting = setting
        self.who = who
        static = static_choice(setting, who.rank, who.world_size)
        if static is None and (setting == "leaders" or who.gather is None):
            static = who.local_rank == 0
        self.records: bool | None = static
        # Undecided, the first window opens no earlier than TIMED_BEFORE_CHOICE steps after the first (whose
        # own work is warm-up, not the rank's pace): every rank's schedule moves by the same `delay`.
        self.delay = max(0, 1 + TIMED_BEFORE_CHOICE - wait) if static is None else 0

    def decide(self) -> None:
        who = self.who
        assert who.gather is not None  # undecided only with a collective to decide by
        pairs = [p if isinstance(p, tuple) else (1, None) for p in who.gather((who.local_rank, who.own_work_s()))]
        ranks = chosen([int(p[0]) for p in pairs], [p[1] if isinstance(p[1], float) else None for p in pairs])
        self.records = who.rank in ranks
        if who.rank == 0:
            log.info(
                f"profiler.ranks {self.setting}: {len(ranks)} of {who.world_size} ranks record traces, each node's "
                f"first rank and the slowest by own work per step: ranks {','.join(map(str, ranks))}"
                + (f" (the window opens {self.delay} step(s) after profiler.wait, to time them)" if self.delay else "")
            )

    def shifted(self, base: Callable[[int], ProfilerAction]) -> Callable[[int], ProfilerAction]:
        """The profiler's schedule, `delay` steps later."""
        return lambda step: base(step - self.delay) if step >= self.delay else ProfilerAction.NONE

    def schedule(self, base: Callable[[int], ProfilerAction]) -> Callable[[int], ProfilerAction]:
        """What this rank's profiler does: the shifted schedule if it records, nothing otherwise."""
        moved = self.shifted(base)
        return lambda step: moved(step) if self.records else ProfilerAction.NONE


class Profiling:
    """Steps the profiler and keeps each cycle's totals.

    On CUDA it also measures the peak allocated memory of each recorded window (the allocator's
    peak is reset as recording starts), so it can be set beside the trace's `[memory]` events, which
    see only that window. The run's overall peak is kept across those resets in `run_peak_bytes`.
    """

    def __init__(
        self,
        prof: profile,
        cycles: list[JsonObject],
        base: Callable[[int], ProfilerAction],
        cuda: bool,
        choice: Choice,
    ):
        self._prof = prof
        self._base = choice.shifted(base)
        self.choice = choice
        self._schedule = choice.schedule(base)
        self._cuda = cuda
        self._steps = 0
        self._host_s = 0.0  # inside prof.step() since the last cycle ended
        self.cycles = cycles  # per finished cycle, in order: window peak, key_average_totals() if asked
        self.run_peak_bytes = {"allocated": 0, "reserved": 0}
        self.failed: list[TraceFailure] = []  # exports that could not be written: file, error, step
        self.window_replays = 0  # the recorded steps of the current cycle that were CUDA graph replays

    def _recording(self, step: int) -> bool:
        return self._schedule(step) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def recording_now(self) -> bool:
        """Whether the profiler records now (between the last step() and the next)."""
        return self._recording(self._steps)

    def on_now(self) -> bool:
        """Whether the profiler is on (warming up or recording) for the step in progress."""
        return self._schedule(self._steps) != ProfilerAction.NONE

    def take_window_replays(self) -> int:
        """The cycle's replayed steps, counted afresh for the next cycle."""
        replays, self.window_replays = self.window_replays, 0
        return replays

    def step(self, replayed: bool = False) -> None:
        """The end of a step (`replayed`: it was a CUDA graph replay)."""
        done = len(self.cycles)
        if replayed and self._recording(self._steps):
            self.window_replays += 1
        if self.choice.records is None and self._base(self._steps + 1) != ProfilerAction.NONE:
            self.choice.decide()  # the first window opens with the next step: who records it
        start = time.perf_counter()
        self._prof.step()  # a cycle's start, stop and export happen in here
        self._host_s += time.perf_counter() - start
        self._steps += 1
        if len(self.cycles) > done:
            # end_step: this process's steps up to the cycle's end (the index in StepClock's times)
            self.cycles[-1].update(profiler_host_s=round(self._host_s, 4), end_step=self._steps)
            self._host_s = 0.0
        if self._cuda and self._recording(self._steps) and not self._recording(self._steps - 1):
            self.run_peak_bytes = {
                "allocated": max(self.run_peak_bytes["allocated"], torch.cuda.max_memory_allocated()),
                "reserved": max(self.run_peak_bytes["reserved"], torch.cuda.max_memory_reserved()),
            }
            torch.cuda.reset_peak_memory_stats()

    def window_peak_bytes(self) -> int | None:
        if not self._cuda:
            return None

        return int(torch.cuda.max_memory_allocated())


def _ends_whole(path: Path) -> bool:
    """A Chrome trace is one JSON object: a file cut short by a full disk does not end with its brace."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 64))
            return size > 0 and f.read().rstrip().endswith(b"}")
    except OSError:
        return False


def _why_not_written(folder: Path) -> str:
    """Kineto does not say why a write failed: the file system does (read before the temp files go)."""
    try:
        fs = os.statvfs(folder)
    except OSError as e:
        return e.strerror or "the trace folder cannot be read"
    if fs.f_flag & os.ST_RDONLY:
        return os.strerror(errno.EROFS)
    if fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES:
        return os.strerror(errno.ENOSPC)
    return "the profiler could not write it whole (its log line above says more)"


def publish_trace(prof: profile, folder: Path, worker: str) -> tuple[str, str | None]:
    """Export the cycle's trace as folder/<worker>.<ns>.pt.trace.json, whole or not at all: (its name,
    None), or (the name it would have had, why it was not written)."""
    name = f"{worker}.{time.time_ns()}.pt.trace.json"
    final = folder / name
    tmp = temp_name(final)
    reason: str | None = None
    try:
        prof.export_chrome_trace(str(tmp))
        if _ends_whole(tmp):
            inject.at(
                "trace"
            )  # the fault point (armed only by HPC_FAULT_INJECT): between the export and its publication
            os.replace(tmp, final)
            return name, None
    except (OSError, RuntimeError) as e:
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())[:120]
    reason = reason or _why_not_written(folder)
    for leftover in (tmp, tmp.with_name(tmp.name + ".tmp")):  # ours, and Kineto's own temp name
        # Emptied first: Kineto keeps a failed file open until the next cycle, and a removed file still
        # fills the disk while it is open.
        with contextlib.suppress(OSError):
            os.truncate(leftover, 0)
        leftover.unlink(missing_ok=True)
    return name, reason


def start_notes(cfg: ProfilerConfig, steps: int, cuda: bool) -> list[str]:
    """What the profiler's set-up says once at the start of training (see window_note and memory_note)."""
    return [note for note in (window_note(cfg, steps), memory_note(cfg, cuda)) if note]


def memory_note(cfg: ProfilerConfig, cuda: bool) -> str | None:
    """With memory recorded on the CPU, torch's CPU allocator prints (once a process, from C++, so it
    cannot be filtered here) 'Memory block of unknown size was allocated before the profiling started':
    a block made before the window opened was freed inside it. Said once, in our words, beside it."""
    if not cfg.enabled or cuda or not (cfg.profile_memory or cfg.memory_categories):
        return None
    return (
        "profiler: memory is recorded from the window's start; torch's warning 'Memory block of unknown size "
        "was allocated before the profiling started' means a block made before it was freed inside it: the "
        "memory view leaves out that free, and nothing else"
    )


def window_note(cfg: ProfilerConfig, steps: int) -> str | None:
    """Said at start-up when a run of `steps` more steps ends before the profiler's first window closes
    (its trace would be missing, or cut to the steps it reached), else None."""
    needed = cfg.wait + cfg.warmup + cfg.active
    if not cfg.enabled or steps >= needed:
        return None
    what = "no trace will be written" if steps <= cfg.wait else "its trace will hold fewer steps than profiler.active"
    return (
        f"profiler: this run has {steps} step(s) to go, and the profiler's window closes after {needed} "
        f"(profiler.wait {cfg.wait} + warmup {cfg.warmup} + active {cfg.active}): {what}"
    )


def detach_cupti_after_cycles() -> None:
    """TEARDOWN_CUPTI=1, which kineto reads as each cycle stops, unless the user set it: on CUDA >= 12.6
    only, as PyTorch's profiler itself decides (before 12.6, teardown and CUDA graphs crash)."""

    cuda_version = getattr(torch.version, "cuda", None)
    if cuda_version and TorchVersion(cuda_version) >= "12.6":
        os.environ.setdefault("TEARDOWN_CUPTI", "1")


def categories(prof: profile, device: torch.device, replays: int) -> JsonObject:
    """The cycle's peak memory by category, or why not: a CUDA graph's replay allocates nothing (its
    tensors were made in the graph's pool at capture, before any window), so the memory profiler sees
    none of the step's tensors (seen on an H200: 36 MB of 'other' against 883 MB allocated)."""
    if replays:
        return {
            "error": f"{replays} of the window's steps were CUDA graph replays, whose tensors were allocated at "
            "capture, before the window: the memory profiler cannot see them (--cuda-graph false gives the categories)"
        }
    from hpc.training import memcat  # torch's memory profiler, only when asked for

    return memcat.at_peak(prof, device)


def memory_device(cuda: bool) -> torch.device:
    """The device whose memory the categories describe: this rank's GPU, else the CPU."""

    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


@contextlib.contextmanager
def maybe_profile(
    cfg: ProfilerConfig, trace_dir: Path, who: RankChoice, cuda: bool, step_of: Callable[[], int] | None = None
) -> Iterator[Profiling | None]:
    """The profiler of rank `who` (None: profiling is off, or profiler.ranks leaves this rank out).
    `step_of`: the optimizer step a failed trace is recorded at (default: the profiler's own step count)."""
    choice = Choice(str(cfg.ranks), who, cfg.wait)
    if not cfg.enabled or choice.records is False:
        yield None
        return
    rank = who.rank

    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    cycles: list[JsonObject] = []
    sched = schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat)
    profiling: Profiling | None = None

    def on_trace_ready(prof: profile) -> None:
        start = time.perf_counter()
        totals = key_average_totals(prof) if cfg.key_averages else {}
        totals["key_averages_s"] = round(time.perf_counter() - start, 4)
        totals["cuda_max_memory_allocated_bytes"] = profiling.window_peak_bytes() if profiling else None
        replays = profiling.take_window_replays() if profiling else 0
        totals["graph_replays"] = replays
        if cfg.memory_categories:
            began = time.perf_counter()
            totals["memory_categories"] = categories(prof, memory_device(cuda), replays)
            totals["memory_categories_s"] = round(time.perf_counter() - began, 4)
        began = time.perf_counter()
        name, failure = publish_trace(prof, trace_dir, trace_worker(rank))
        totals["export_s"] = round(time.perf_counter() - began, 4)
        totals.update(cupti_detached=os.environ.get("TEARDOWN_CUPTI") == "1", trace=None if failure else name)
        cycles.append(totals)
        if failure and profiling is not None:
            step = step_of() if step_of is not None else prof.step_num
            profiling.failed.append(TraceFailure(file=name, error=failure, step=step))

    if cuda and cfg.detach_cupti:
        detach_cupti_after_cycles()
    if not cuda:  # Kineto probes for a GPU at every export and logs its absence as an ERROR: not one here
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if choice.records is None and choice.shifted(sched)(0) != ProfilerAction.NONE:  # never with a delay
        choice.decide()
    with profile(
        activities=activities,
        schedule=choice.schedule(sched),
        on_trace_ready=on_trace_ready,
        record_shapes=cfg.record_shapes or cfg.memory_categories,  # the memory profiler needs all three
        profile_memory=cfg.profile_memory or cfg.memory_categories,
        with_stack=cfg.with_stack or cfg.memory_categories,
    ) as prof:
        profiling = Profiling(prof, cycles, sched, cuda, choice)
        if cuda and profiling._recording(0):  # wait = warmup = 0: the first step is recorded
            torch.cuda.reset_peak_memory_stats()
        yield profiling
