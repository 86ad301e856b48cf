"""Profiling a script that has never seen this toolkit, with no change to it: the start-up hook
(hpc/training/hook/startup/sitecustomize.py, put on PYTHONPATH by the launcher) arms it
(hpc/training/hook/scripthooks.py): once torch's optimizer module is imported it registers one global
optimizer step hook (torch.optim.optimizer.register_optimizer_step_post_hook, torch's public hook,
the one Kineto's own step tracker uses). From the first optimizer step on, the toolkit's profiler
(hpc/training/profiling.py: its schedule, its whole-or-nothing trace export) runs in the process and
steps on every step of that first optimizer (a second optimizer would count each step twice), writing
RUN/traces/rank{R}.*.pt.trace.json, and what the analysis needs beside the traces (steps, step times,
each step's own work up to its first gradient (hpc/training/steptimes.py's StepClock, the training's
instrument too), peak memory, the device) to RUN/ranks/rank{R}.facts.json,
at every cycle's end and at exit. `guard` keeps ours from ever running beside a profiler of the
script's own; an error of ours turns the hook off (`fail`), never the script.

Limits, said in the README: no torch.optim step, no profile (the launcher says so); a step inside a
torch.compile'd function may not call the hook; a profiler the script runs itself wins: where one is
seen running (at the first step, or between our windows), ours stands down, says so in one line and
records nothing more, never two at once (a second torch.profiler silently cancels the first).

Torch is imported only when the script imports it: this module is loaded at start-up in every Python
process of the command (DataLoader workers started with spawn, helper scripts), most of which never
train.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import msgspec

from hpc.core.rundir import RunPaths
from hpc.core.summary import OomRecord, RankFacts, attempt_of, write_facts
from hpc.settings.schema import ProfilerConfig
from hpc.training.steptimes import StepClock, Timeline, measures, startup_record

if TYPE_CHECKING:  # for the annotations only: torch is imported when the script imports it (module doc)
    import torch

    from hpc.training.profiling import Profiling

log = logging.getLogger(__name__)

STEP_HOOK_MODULE = "torch.optim.optimizer"  # holds register_optimizer_step_post_hook
PROFILER_MODULE = "torch.profiler.profiler"  # holds _KinetoProfile, whose prepare_trace starts any profile


def _profiler_running() -> bool:
    """Whether a torch profiler is enabled in this process now (ours or another's)."""
    import torch

    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    return bool(enabled()) if callable(enabled) else False


def collectives_so_far() -> int | None:
    """How many collectives this process's groups have run: the sum of their sequence numbers (each of
    gloo's and NCCL's collectives counts one, DDP's gradient all-reduces included, whatever group the
    script made them in). None where this torch cannot say (the counter is c10d's, not public API)."""
    import torch.distributed.distributed_c10d as c10d

    try:
        groups: list[Any] = list(c10d._world.pg_map)  # the counter is no public API: untyped
        return sum(int(group._get_sequence_number_for_group()) for group in groups)
    except Exception:  # a backend without the counter, or a torch without the map: unknown, not zero
        return None


class Traffic:
    """Whether a rank's steps communicate: of the intervals between its optimizer steps, how many saw a
    collective. Under DDP every one does (the gradients' all-reduce); ranks that only share a process
    group (pytorch/examples' imagenet/main.py on a CPU: a sampler, no DDP) see none, or one an epoch."""

    SAY_AFTER = 4  # intervals without a collective before it is said during the run

    def __init__(self) -> None:
        self.last: int | None = None
        self.intervals = 0
        self.talking = 0  # intervals with a collective
        self.said = False
        self.unknown = False

    def count(self) -> bool:
        """At a step: one more interval counted (False where the counter is unknown)."""
        if self.unknown:
            return False
        now = collectives_so_far()
        if now is None:
            self.unknown = True
            return False
        if self.last is not None:
            self.intervals = self.intervals + 1
            self.talking = self.talking + (now > self.last)
        self.last = now
        return True

    def silent_line(self, ranks: int) -> str | None:
        """The line, once, for a process group whose first SAY_AFTER step intervals ran no collective."""
        if self.said or self.intervals != self.SAY_AFTER or self.talking:
            return None
        self.said = True
        return (
            f"{ranks} ranks each train a separate copy: the script's process group ran no collective in its "
            f"first {self.SAY_AFTER + 1} optimizer steps (no DistributedDataParallel, no all-reduce of the "
            "gradients), so its ranks never wait for each other and each updates its own weights; wrap the "
            "model in torch.nn.parallel.DistributedDataParallel to train one model on every rank's data"
        )

    def record(self) -> dict[str, int] | None:
        """summary.json's `collectives_in_steps`: {intervals, with_collectives}; None: not measured."""
        if self.unknown or not self.intervals:
            return None
        return {"intervals": self.intervals, "with_collectives": self.talking}


class StepHook:
    """The global optimizer step hook's state: the clock (the first optimizer seen), the profiler once
    started, the step times, what listens to the steps (hpc/training/hook/scriptwatch.py), and the facts file
    written at each cycle's end and at exit. `settings`: the profiler section (None or enabled false: the
    steps are counted, nothing is profiled)."""

    def __init__(self, settings: ProfilerConfig | None, run_dir: Path):
        self.settings = settings or ProfilerConfig(enabled=False)
        self.paths = RunPaths(run_dir)
        self.counted: int | None = None  # id() of the optimizer whose steps count
        self.steps = 0
        # each counted step's end and own work (to its last backward's first gradient), as the training's
        self.clock = StepClock()
        self.timeline = Timeline()  # the phases a script's hook sees (hpc/training/steptimes.py PHASES)
        self.profiling: Profiling | None = None
        self.context: contextlib.ExitStack | None = None
        self.note: str | None = None
        self.active = False  # the profiler runs (started, and not stood down)
        self.ours = False  # inside a call of our own profiler: a profile starting now is ours
        self.script_profiles: str | None = None  # why ours must not start: the script's own runs
        self.broken = False  # an error of ours turned the hook off
        self.listeners: list[Callable[[StepHook], None]] = []  # called after each counted step
        self.oom: OomRecord | None = None  # hpc/training/hook/scriptoom.py's record
        self.rank = int(os.environ.get("RANK") or 0)
        self.world_size = 1
        self.cuda = False
        self.grouped: bool | None = None  # in a torch.distributed process group at its first step
        self.traffic = Traffic()  # whether collectives ran between the steps (ranks that never talk: copies)
        self.accelerate: dict[str, str] | None = None  # what the user's accelerate config set (scriptaccelerate.py)

    def __call__(self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, Any]) -> None:
        if self.broken:
            return
        try:
            self.on_step(optimizer)
        except Exception as e:  # never the user's run: ours goes off, theirs goes on
            self.fail(e)

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.counted is None:
            self.counted = id(optimizer)
            self.start(optimizer)
        if id(optimizer) != self.counted:
            return
        profiled = self.active and self.profiling is not None and self.profiling.on_now()
        self.steps = self.steps + 1
        try:
            self.after_step()
        finally:  # the step ends after our profiler's own step (a trace's export is this step's, as in the training)
            self.clock.ended(profiled)
            self.timeline.mark("last_step", again=True)

    def after_step(self) -> None:
        """What a counted step sets off: the separate-copies line, the listeners, our profiler's step."""
        if self.grouped and self.traffic.count() and self.rank == 0:
            said = self.traffic.silent_line(self.world_size)
            if said:
                log.warning(f"hpc: {said}")
        for listener in self.listeners:
            listener(self)
        if not self.active or self.profiling is None:
            return
        if not self.profiling.recording_now() and _profiler_running():
            self.stand_down("the script started a torch.profiler of its own")
            return
        done = len(self.profiling.cycles)
        with self.own_calls():
            self.profiling.step()
        if len(self.profiling.cycles) > done:
            self.write()

    @contextlib.contextmanager
    def own_calls(self) -> Iterator[None]:
        """Our profiler's own calls: a profile that starts inside is ours, not the script's."""
        self.ours = True
        try:
            yield
        finally:
            self.ours = False

    def start(self, optimizer: torch.optim.Optimizer) -> None:
        """At the first step: who this rank is, where it trains, and the profiler, unless another runs."""
        import torch.distributed as tdist

        grouped = self.grouped = tdist.is_available() and tdist.is_initialized()
        self.rank = tdist.get_rank() if grouped else int(os.environ.get("RANK") or 0)
        self.world_size = tdist.get_world_size() if grouped else int(os.environ.get("WORLD_SIZE") or 1)
        said = separate_copies_line(self.world_size) if not grouped else world_mismatch(self.world_size, os.environ)
        if said and self.rank == 0:
            log.warning(f"hpc: {said}")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.cuda = self.clock.cuda = bool(params) and params[0].device.type == "cuda"
        atexit.register(self.finish)
        self.clock.watch(params)
        if self.script_profiles or _profiler_running():
            self.stand_down(self.script_profiles or "the script runs a torch.profiler of its own")
            return
        if not self.settings.enabled:
            return
        from hpc.training.profiling import RankChoice, maybe_profile

        self.context = contextlib.ExitStack()
        # profiler.ranks: a script's collectives are its own, so over 16 ranks its node leaders record
        who = RankChoice(self.rank, int(os.environ.get("LOCAL_RANK") or 0), self.world_size)
        with self.own_calls():
            self.profiling = self.context.enter_context(maybe_profile(self.settings, self.paths.traces, who, self.cuda))
        self.active = self.profiling is not None
        if self.active:
            self.timeline.mark("profiler_started")

    def script_profiler_starts(self) -> None:
        """A profile the script started (torch's start of a trace, seen before it happens): ours stands
        down first, or never starts."""
        if self.ours or self.broken:
            return
        try:
            why = "the script started a torch.profiler of its own"
            if self.active:
                self.stand_down(why)
            elif self.counted is None:
                self.script_profiles = "the script runs a torch.profiler of its own"
        except Exception as e:
            self.fail(e)

    def stand_down(self, why: str) -> None:
        self.note = f"{why}: the toolkit's profiler stood down (never two at once) and recorded nothing more"
        log.warning(f"hpc: rank {self.rank}: {self.note}")
        self.active = False
        self.close()
        self.write()

    def fail(self, error: Exception) -> None:
        """An error of ours: said once, the hook turned off (its profiler closed as far as it can be)."""
        self.broken = True
        self.active = False
        with contextlib.suppress(Exception):
            self.clock.remove()
        self.note = f"the toolkit's step hook failed ({type(error).__name__}: {error}) and turned itself off"
        log.warning(f"hpc: rank {self.rank}: {self.note}; the script goes on")
        with contextlib.suppress(Exception):
            self.close()
        self.write()

    def close(self) -> None:
        """Stop the profiler: a window still open is exported as far as it got."""
        context, self.context = self.context, None
        if context is not None:
            with self.own_calls():
                context.close()

    def finish(self) -> None:
        self.timeline.mark("exit")
        with contextlib.suppress(Exception):  # at exit too, never the user's run's end
            self.close()
        self.write()

    def facts(self) -> RankFacts:
        """What the analysis reads beside the traces (summary.json's per-rank record takes them over)."""
        import torch

        clock, profiling = self.clock, self.profiling
        # from the first counted step's end to now: the steps' wall time, as the training's loop
        wall_s = time.time() - clock.first_step_unix if clock.first_step_unix is not None else None
        facts = {
            "rank": self.rank,
            "world_size": self.world_size,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "attempt": attempt_of(os.environ),
            "device": "cuda" if self.cuda else "cpu",
            "device_name": torch.cuda.get_device_name() if self.cuda else "cpu",
            "torch": str(torch.__version__),
            "steps": self.steps,
            "process_group": self.grouped,
            "collectives_in_steps": self.traffic.record(),
            **measures(clock, profiling, wall_s, startup_record(None, None, clock.first_step_unix, self.timeline)),
            "profiler": {
                "cycles": profiling.cycles if profiling is not None else [],
                "traces": self.paths.rank_traces(self.rank),
                "failed": profiling.failed if profiling is not None else [],
                "note": self.note,
            },
        }
        if self.accelerate is not None:
            facts["accelerate"] = {k.removeprefix("ACCELERATE_").lower(): v for k, v in self.accelerate.items()}
            facts["mixed_precision"] = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        return msgspec.convert({**facts, "oom": self.oom}, RankFacts)

    def write(self) -> None:
        try:
            write_facts(self.paths, self.facts())
        except Exception as e:  # never the user's run's end: a full disk loses this file, not the run
            log.warning(f"hpc: rank {self.rank}: {self.paths.rank_facts(self.rank)} not written ({e})")


def world_mismatch(group_size: int, env: Mapping[str, str]) -> str | None:
    """The line for a process group whose size is not the job's ranks (WORLD_SIZE): a framework's own
    world (Lightning's devices x num_nodes) set otherwise than the job's --nodes x --gpus."""
    job = env.get("WORLD_SIZE", "")
    if not job.isdigit() or int(job) == group_size:
        return None
    return (
        f"the script's process group has {group_size} rank(s), the job {job}: its own world (Lightning's "
        "Trainer(devices=..., num_nodes=...), accelerate's num_processes) must be the job's --gpus a node and "
        "--nodes"
    )


def separate_copies_line(ranks: int) -> str | None:
    """The line for ranks that never join a process group: each trains alone (None for one rank)."""
    if ranks < 2:
        return None
    return (
        f"{ranks} ranks each train a separate copy: the script made no torch.distributed process group by its "
        "first optimizer step, so its ranks never communicate (each trains on the whole data and writes the "
        "same files); for a single-process script (nn.DataParallel: one process using every GPU of a node) "
        "use one rank a node: --set cluster.launcher=node (--nodes 1)"
    )


def register(module: ModuleType, hook: StepHook) -> None:
    """The global optimizer step hook, on torch's optimizer module (just imported)."""
    hook.timeline.mark("imports")  # torch's, as far as its optimizers: the script's own go on
    add = getattr(module, "register_optimizer_step_post_hook", None)
    if add is None:
        log.warning("hpc: this torch has no global optimizer step hook (torch >= 2.0 has): not profiled")
        return
    add(hook)


def _yielding(start: Callable[..., Any], hook: StepHook) -> Callable[..., Any]:  # torch's method, any signature
    @functools.wraps(start)
    def start_after_ours(*args: Any, **kwargs: Any) -> Any:  # passed on as they came
        hook.script_profiler_starts()
        return start(*args, **kwargs)

    return start_after_ours


def guard(module: ModuleType, hook: StepHook) -> None:
    """Never two profilers: every start of a torch profiler (torch.profiler's `prepare_trace`, which each
    profile, schedule or not, calls before it enables anything; the older torch.autograd.profiler's
    `__enter__`) makes ours stand down first, while the script's own goes on. Torch has no public hook
    for a profiler's start, so these two methods are wrapped, on their classes, at import (a profile
    binds its methods when it is made)."""
    import torch.autograd.profiler as legacy

    kineto = getattr(module, "_KinetoProfile", None)
    if kineto is None or not hasattr(kineto, "prepare_trace"):
        log.warning(
            "hpc: this torch's profiler has no prepare_trace: a profiler of the script's own is seen only once it runs"
        )
        return
    kineto.prepare_trace = _yielding(kineto.prepare_trace, hook)
    legacy.profile.__enter__ = _yielding(legacy.profile.__enter__, hook)  # type: ignore[method-assign]
