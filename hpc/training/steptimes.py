"""A rank's step times, one instrument for the toolkit's training (hpc/training/trainer.py) and a user's
script (the start-up hook, hpc/training/hook/autoprofile.py): `StepClock` marks each optimizer step's end
and its own work, `measures` makes the rank's measurement record of summary.json from it (the same keys on
both roads: RANK_MEASURES), and the last steps' own work is kept one by one, so that the analysis can
compare ranks step by step (analysis/runs/ranks.py: a straggler is a rank slower in most steps, not in a
mean). Torch is imported only where a GPU's events are asked for: the hook loads this in every process.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hpc.core.proc import process_started_unix, queued_s
from hpc.core.summary import OwnSeries, StartupRecord, StepStats
from hpc.settings.profranks import typical

if TYPE_CHECKING:  # torch's types for the annotations only: torch is imported where a GPU's events are asked for
    import torch
    from torch.utils.hooks import RemovableHandle

    from hpc.training.profiling import Profiling

log = logging.getLogger(__name__)

# The last steps whose own work each rank keeps one by one (summary.json's own_step_series): enough to see
# one rank slower in most of them (analysis/runs/ranks.py), few enough for a thousand ranks' summary.
SERIES_STEPS = 128
# The measurement keys of every rank's record in summary.json, the toolkit's training's and a script's
# alike (hpc/training/summary.py adds what only the training knows: images a second).
RANK_MEASURES = (
    "step_time_s",
    "own_step_time_s",
    "own_step_series",
    "startup",
    "step_time_after_profiler_s",
    "wall_time_s",
    "cuda_max_memory_allocated_bytes",
    "cuda_max_memory_reserved_bytes",
    "peak_rss_bytes",
)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def step_time_stats(timed: list[float]) -> StepStats:
    return StepStats(
        n=len(timed),
        mean=sum(timed) / len(timed) if timed else None,
        median=percentile(timed, 0.5),
        p90=percentile(timed, 0.9),
        min=min(timed) if timed else None,
        max=max(timed) if timed else None,
    )


def own_work_basis(own: list[float | None], profiled: list[bool]) -> list[float]:
    """The steps a rank's own work is judged on: measured, the first (which warms caches) left out, and the
    profiler's steps left out where others remain (recording slows a CPU rank's operators unevenly)."""
    steps = list(zip(own, [*profiled[: len(own)], *[False] * (len(own) - len(profiled))], strict=True))
    steps = steps[1:] if len(steps) > 2 else steps
    plain = [t for t, p in steps if t is not None and not p]
    return plain or [t for t, _ in steps if t is not None]


def own_work_series(
    own: list[float | None], profiled: list[bool], queued: list[float | None] | None = None
) -> OwnSeries | None:
    """The last SERIES_STEPS steps' own work in ms, each step in its place (null: not measured, the first
    step, or a profiled one), and the number of the first: ranks are compared step by step by it.
    `queued`: the time the rank's main thread waited for a core in the same spans (hpc/core/proc.py's
    queued_s), kept beside (`queued_ms`): a rank slower because other processes share its cores is not a
    slower rank."""
    if not own:
        return None
    first = max(0, len(own) - SERIES_STEPS)
    flags = [*profiled[: len(own)], *[False] * (len(own) - len(profiled))]

    def kept(values: list[float | None]) -> list[float | None]:
        return [
            round(t * 1e3, 3) if t is not None and not flags[i] and i > 0 and math.isfinite(t) else None
            for i, t in enumerate(values[first : len(own)], start=first)
        ]

    measured = queued is not None and len(queued) == len(own)
    return OwnSeries(
        first_step=first, ms=kept(own), queued_ms=kept(queued) if queued is not None and measured else None
    )


# A rank's start-up and end by phase, in order (summary.json's startup.phases: each one's Unix time, None where
# not seen). The toolkit's training marks every one; a script's hook those it sees from outside the script:
# torch imported (its optimizers' module), its profiler started, its first and last steps, its exit.
PHASES = (
    "process_start",
    "imports",
    "group_joined",
    "data_ready",
    "model_ready",
    "profiler_started",
    "graph_checked",
    "first_step",
    "last_step",
    "exit",
)


class Timeline:
    """When this rank reached each phase of PHASES (time.time()): the first time, or the latest with `again`
    (the last step is each step's end)."""

    def __init__(self, *reached: str) -> None:
        self.at: dict[str, float] = {}
        for phase in reached:  # now
            self.mark(phase)

    def mark(self, phase: str, when: float | None = None, again: bool = False) -> None:
        if phase not in PHASES:
            raise ValueError(f"no start-up phase {phase!r} (PHASES)")
        if again or phase not in self.at:
            self.at[phase] = time.time() if when is None else when

    def record(self, process_start: float | None) -> dict[str, float | None]:
        """Every phase's time, the process's start as read from /proc by the caller."""
        return {p: process_start if p == "process_start" else self.at.get(p) for p in PHASES}


def startup_record(
    join_began: float | None, join_ended: float | None, first_step_unix: float | None, timeline: Timeline | None = None
) -> StartupRecord:
    """Where this rank's start-up went, in Unix seconds and spans: the process started, the process group
    began to form and was formed (every rank in), the first optimizer step ended, and each phase of PHASES
    the rank's timeline saw. Compared with the job's start (Slurm's StartTime) they give its time to the
    first step (docs/scale.md)."""
    started = process_started_unix()
    phases = (timeline or Timeline()).record(started)
    phases["group_joined"] = phases["group_joined"] or join_ended
    phases["first_step"] = phases["first_step"] or first_step_unix
    return StartupRecord(
        process_start_unix=started,
        group_join_start_unix=join_began,
        group_join_s=join_ended - join_began if join_ended is not None and join_began is not None else None,
        first_step_end_unix=first_step_unix,
        to_first_step_s=first_step_unix - started if first_step_unix and started else None,
        phases=phases,
    )


# A Python call per parameter per backward costs about 3 us on a CPU (1.4 ms a step for ResNet152's 470
# parameters): after the first step only the KEEP parameters whose gradients came first keep the hook.
KEEP = 4
Mark = Any  # a perf_counter reading on a CPU, a recorded torch.cuda.Event on a GPU


class StepClock:
    """Each optimizer step's end (`ended()`) and its own work: from the previous step's end to the first
    gradient of the step's last backward pass (under DDP every rank's whole step ends at the common
    all-reduce, so only that part, which no other rank can hold up, tells a slow rank from those that wait
    for it). The gradients are seen by torch's post-accumulate-grad hook (public, torch >= 2.1) on the
    parameters `watch` is given: the same definition for the toolkit's training and a script, with no call
    inside their backward. On a GPU the marks are CUDA events (the device's time, not the host's launch
    time, read once after a synchronize); on a CPU perf_counter, with the main thread's wait for a core in
    the same span (queued_s: a rank slower because others share its cores is not a slower rank). A step
    with no gradient seen (a CUDA graph's replay, which runs no hook) has no own work (None). An error
    inside the hook is said once and turns the hook off; the run goes on."""

    def __init__(self, cuda: bool = False, params: Iterable[torch.nn.Parameter] | None = None):
        """`params`: watched at once (else by `watch`, once the parameters are known)."""
        self.cuda = cuda
        self.ends: list[Mark] = []  # each step's end
        self.spans: list[tuple[Mark, Mark] | None] = []  # each step's own work: (previous end, first gradient)
        self.queued: list[float | None] = []  # the main thread's wait for a core in that span (CPU)
        self.profiled: list[bool] = []  # per step: the profiler was on (its window slows a CPU rank)
        self.first_step_unix: float | None = None  # when this process's first step ended (time.time())
        self.since: tuple[Mark, float | None] | None = None  # the last end, and queued_s then
        self.grad: tuple[Mark, float | None] | None = None  # this step's first gradient so far
        self.handles: dict[int, RemovableHandle] = {}  # by id(parameter)
        self.fired: list[int] = []  # the first parameters to fire, in the step that chooses them
        self.pruned = False
        if params is not None:
            self.watch(params)

    def _mark(self) -> tuple[Mark, float | None]:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event, None
        return time.perf_counter(), queued_s()

    def watch(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Hook the parameters' gradients; False: none, or this torch has no such hook."""
        params = [p for p in params if p.requires_grad]
        if not all(hasattr(p, "register_post_accumulate_grad_hook") for p in params):
            return False
        self.handles = {id(p): p.register_post_accumulate_grad_hook(self) for p in params}
        return bool(self.handles)

    def __call__(self, param: torch.Tensor) -> None:  # from autograd
        try:
            if self.cuda and _capturing():
                return  # a CUDA graph being captured: its replays run no hook
            # each backward pass's first gradient is its first kept parameter's: with gradient accumulation
            # the step's own work runs to its last backward's, the one that synchronizes under DDP
            if self.grad is None or (self.pruned and self.fired and id(param) == self.fired[0]):
                self.grad = self._mark()
            if not self.pruned and len(self.fired) < KEEP:
                self.fired.append(id(param))
        except Exception as e:  # inside autograd: never the run's failure
            log.warning(f"hpc: the step clock's gradient hook failed ({type(e).__name__}: {e}) and turned itself off")
            self.remove()

    def ended(self, profiled: bool = False) -> None:
        """The optimizer step ends now (`profiled`: the profiler was on during it)."""
        now = self._mark()
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
        since, grad = self.since, self.grad
        self.spans.append((since[0], grad[0]) if since is not None and grad is not None else None)
        waited = None
        if since is not None and grad is not None and since[1] is not None and grad[1] is not None:
            waited = grad[1] - since[1]
        self.queued.append(waited)
        self.ends.append(now[0])
        self.profiled.append(profiled)
        self.since, self.grad = now, None
        if not self.pruned and self.fired:  # the first step with gradients chooses who keeps the hook
            keep = set(self.fired)
            for key in [k for k in self.handles if k not in keep]:
                self.handles.pop(key).remove()
            self.pruned = True

    def remove(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        self.handles = {}

    def _seconds(self, a: Mark, b: Mark) -> float:
        return float(a.elapsed_time(b)) / 1000 if self.cuda else float(b - a)

    def _synchronized(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def times(self) -> list[float]:
        """Seconds between consecutive step ends (one fewer than the steps)."""
        self._synchronized()
        return [self._seconds(a, b) for a, b in zip(self.ends, self.ends[1:], strict=False)]

    def own_times(self) -> list[float | None]:
        """Each step's own work in seconds (None where it was not measured), in step order."""
        self._synchronized()
        return [self._seconds(*span) if span is not None else None for span in self.spans]

    def own_so_far_s(self) -> float | None:
        """The median own work of the steps so far after the first (which warms caches; it alone where there
        is no other), the step in progress included once its first gradient came (profiler.ranks chooses
        inside a step's end, before the step's end is marked)."""
        own = self.own_times()
        if self.since is not None and self.grad is not None:
            own = [*own, self._seconds(self.since[0], self.grad[0])]
        return typical(own[1:] if len(own) > 1 else own)


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def measures(
    clock: StepClock,
    profiling: Profiling | None,
    wall_s: float | None,
    startup: StartupRecord,
    device: torch.device | None = None,
) -> dict[str, object]:
    """A rank's measurements for summary.json (RANK_MEASURES), the training's and a script's from the same
    clock: step times (the first, which warms caches, left out), own work, start-up, the speed after the
    profiler's last window, wall time and memory peaks (the profiler resets the allocator's peaks as each
    window opens: the run's maximum is kept). `device`: the CUDA device, where the clock's is not current."""
    times, own = clock.times(), clock.own_times()
    timed = times[1:] if len(times) > 2 else times
    cycles = profiling.cycles if profiling is not None else []
    ends = [end for c in cycles if isinstance(end := c.get("end_step"), int)]
    peak = reserved = None
    if clock.cuda:
        import torch

        run_peak = profiling.run_peak_bytes if profiling is not None else {}
        peak = max(int(torch.cuda.max_memory_allocated(device)), run_peak.get("allocated", 0))
        reserved = max(int(torch.cuda.max_memory_reserved(device)), run_peak.get("reserved", 0))
    basis = own_work_basis(own, clock.profiled)
    record: dict[str, object] = {
        "step_time_s": step_time_stats(timed),
        "own_step_time_s": step_time_stats(basis) if basis else None,
        "own_step_series": own_work_series(own, clock.profiled, None if clock.cuda else clock.queued),
        "startup": startup,
        # the steps after the profiler's last window: unprofiled speed, if the profiler left nothing behind
        "step_time_after_profiler_s": step_time_stats(times[max(ends) :]) if ends else None,
        "wall_time_s": wall_s,
        "cuda_max_memory_allocated_bytes": peak,
        "cuda_max_memory_reserved_bytes": reserved,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
    }
    return record
