"""What each node's GPUs did during a run, from NVML (nvidia-ml-py), whoever's command ran on them.

One sampler per node (the runner of the node's local rank 0; the toolkit's training itself when it runs
without the runner, under torchrun alone) appends to RUN/gpus/{node}.jsonl: a first line naming the GPUs
(or saying why there is none to sample), then a few samples a second of each GPU's utilisation, memory,
power and clocks. `summarize` reads every node's file into summary.json's `gpus`, with one line that
names a GPU allocated to the run but idle. NVML reads the driver's counters, so the sampler costs the
GPUs nothing; it is a thread, and an error inside it is said once and stops it (never the run).

Why by hand: NVML's Python binding is the library; what none does is keep a run's samples beside its
other records and say, per GPU, whether it was used. No torch import.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import msgspec

from hpc.core.files import append_line, read_json, write_atomic

log = logging.getLogger(__name__)

PERIOD_S = 0.25
SUM_EVERY_S = 5.0  # the running figures written beside the samples: summary.json reads those, not every line
# A GPU never busier than this in any sample is named idle: one that worked only in part of a short run
# (set-up, a profiler's host-side analysis) still reached full use in its steps.
IDLE_UTIL_PCT = 5.0
FIELDS = ("util_pct", "mem_util_pct", "mem_used_bytes", "power_w", "sm_mhz", "mem_mhz")


class GpuAbout(msgspec.Struct, kw_only=True):
    """A GPU as NVML names it, in its node's first line: its index on the node, name, UUID and memory."""

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None


class _Line(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A line of gpus/{node}.jsonl, whichever of three: the GPUs (`node`, `period_s`, `fields`, `gpus`), a
    sample (`t`, `g`: each GPU's FIELDS) or why there is none to sample (`node`, `none`)."""

    node: str | None = None
    period_s: float | None = None
    fields: list[str] | None = None
    gpus: list[GpuAbout] | None = None
    t: float | None = None
    g: list[list[float]] | None = None
    none: str | None = None


class _GpuState(msgspec.Struct, kw_only=True):
    """One GPU's running figures as its sampler keeps them in gpus/{node}.sum.json."""

    about: GpuAbout
    n: int
    first_t: float | None
    last_t: float | None
    sums: list[float]
    maxes: list[float]


class _Sums(msgspec.Struct, kw_only=True):
    """gpus/{node}.sum.json: the node's running figures and the offset in its samples file they reach."""

    node: str | None = None
    offset: int
    gpus: list[_GpuState]


class GpuFigures(msgspec.Struct, kw_only=True):
    """One sampled GPU in summary.json's `gpus`: where it is, what NVML names it, its samples' span, and
    the means and peaks of its FIELDS (None where it has no sample)."""

    node: str
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    samples: int = 0
    seconds: float = 0.0
    util_mean_pct: float | None = None
    util_max_pct: float | None = None
    mem_util_mean_pct: float | None = None
    mem_used_max_bytes: int | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    sm_mhz_mean: float | None = None
    mem_mhz_mean: float | None = None


def allocated(env: Mapping[str, str]) -> list[str] | None:
    """The node's GPUs of this job as NVML indices or UUIDs: Slurm's step (or job) GPUs, else
    CUDA_VISIBLE_DEVICES; None: every GPU NVML sees."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        words = [w.strip() for w in env.get(name, "").split(",") if w.strip()]
        if words:
            return words
    return None


def count_here(env: Mapping[str, str]) -> int:
    """How many of this machine's GPUs the environment lets a run use (NVML; 0 without a driver)."""
    try:
        import pynvml as nvml  # type: ignore[import-untyped]  # nvidia-ml-py

        nvml.nvmlInit()
    except Exception:  # noqa: BLE001  (no library, no driver: a CPU machine)
        return 0
    try:
        return len(_open(nvml, allocated(env)))
    except Exception:  # noqa: BLE001
        return 0
    finally:
        nvml.nvmlShutdown()


def _open(nvml: ModuleType, wanted: list[str] | None) -> list[tuple[object, GpuAbout]]:
    """(handle, description) of each wanted GPU; a handle is NVML's own, passed back to it."""
    found = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = str(nvml.nvmlDeviceGetUUID(handle))
        if wanted is not None and str(index) not in wanted and uuid not in wanted:
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = str(nvml.nvmlDeviceGetName(handle))
        found.append((handle, GpuAbout(index=index, name=name, uuid=uuid, memory_total_bytes=int(memory.total))))
    return found


def _sample(nvml: ModuleType, handle: object) -> list[float]:
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    return [
        float(rates.gpu),
        float(rates.memory),
        float(nvml.nvmlDeviceGetMemoryInfo(handle).used),
        nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # milliwatts
        float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
    ]


class GpuSampler:
    """A daemon thread sampling the node's GPUs into `path` until stop(). start() says in one line when
    there is nothing to sample (no NVML, no GPU) and returns None."""

    def __init__(self, path: Path, node: str, env: Mapping[str, str], period_s: float = PERIOD_S):
        self.path = path
        self.node = node
        self.period_s = period_s
        self.wanted = allocated(env)
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.sums: list[_Gpu] = []  # each GPU's running figures, in the order of its samples

    def start(self) -> GpuSampler | None:
        try:
            import pynvml as nvml  # nvidia-ml-py

            nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001  (no library, no driver: a CPU node)
            self._none(f"NVML: {e or type(e).__name__}")
            return None
        try:
            gpus, why = _open(nvml, self.wanted), f"NVML sees none of {','.join(self.wanted or [])}"
        except Exception as e:  # noqa: BLE001
            gpus, why = [], f"NVML: {e or type(e).__name__}"
        if not gpus:
            nvml.nvmlShutdown()
            self._none(why)
            return None
        if not self._write(
            _Line(node=self.node, period_s=self.period_s, fields=list(FIELDS), gpus=[g for _, g in gpus])
        ):
            nvml.nvmlShutdown()
            return None
        self.sums = _carried(self.path, self.node, [g for _, g in gpus])  # an earlier start's figures go on
        self.thread = threading.Thread(
            target=self._run, args=(nvml, [h for h, _ in gpus]), daemon=True, name="hpc-gpu-sampler"
        )
        self.thread.start()
        return self

    def _none(self, cause: str) -> None:
        why = f"no GPU to sample on {self.node} ({cause})"
        log.debug("hpc: %s", why)  # said in summary.json's gpus and the verdict, not on every run's console
        self._write(_Line(node=self.node, none=why), quiet=True)  # a full disk: nothing was to be sampled

    def _write(self, record: _Line, quiet: bool = False) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_line(self.path, msgspec.json.encode(record).decode())
            return True
        except Exception as e:  # noqa: BLE001  (a full disk: the run goes on unsampled)
            log.log(logging.DEBUG if quiet else logging.WARNING, "hpc: GPU sampling of %s stopped: %s", self.node, e)
            return False

    def _run(self, nvml: ModuleType, handles: list[object]) -> None:
        summed_at = time.monotonic()
        try:
            while not self.done.is_set():
                try:
                    sample = [_sample(nvml, h) for h in handles]
                except Exception as e:  # noqa: BLE001  (a lost GPU, a driver error: said once, then off)
                    log.warning("hpc: GPU sampling of %s stopped: %s", self.node, e)
                    return
                t = round(time.time(), 3)
                if not self._write(_Line(t=t, g=sample)):
                    return
                for gpu, values in zip(self.sums, sample, strict=True):
                    gpu.add(t, values)
                if time.monotonic() - summed_at >= SUM_EVERY_S:
                    self._write_sums()
                    summed_at = time.monotonic()
                self.done.wait(self.period_s)
        finally:
            self._write_sums()
            nvml.nvmlShutdown()

    def _write_sums(self) -> None:
        """The running figures and how far into the samples file they reach (a reader adds the lines after)."""
        with contextlib.suppress(Exception):  # a full disk: the samples file still has every line written
            offset = self.path.stat().st_size
            sums = _Sums(node=self.node, offset=offset, gpus=[g.state() for g in self.sums])
            write_atomic(sums_path(self.path), msgspec.json.encode(sums).decode())

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def start_sampler(path: Path, node: str, env: Mapping[str, str] | None = None) -> GpuSampler | None:
    """The node's sampler, started (None: nothing to sample, said in one line). HPC_GPU_SAMPLE_S sets the
    period (0 turns sampling off)."""
    env = os.environ if env is None else env
    try:
        period_s = float(env.get("HPC_GPU_SAMPLE_S", PERIOD_S))
    except ValueError:
        log.warning(
            "hpc: HPC_GPU_SAMPLE_S=%r is not a number of seconds: sampling every %s s",
            env["HPC_GPU_SAMPLE_S"],
            PERIOD_S,
        )
        period_s = PERIOD_S
    if not period_s > 0 or not math.isfinite(period_s):
        return None
    return GpuSampler(path, node, env, period_s).start()


class _Gpu:
    """One GPU's running figures over its samples (bounded memory whatever the run's length)."""

    def __init__(self, node: str, about: GpuAbout):
        self.node = node
        self.about = about
        self.n = 0
        self.first_t = math.inf
        self.last_t = -math.inf
        self.sums = [0.0] * len(FIELDS)
        self.maxes = [0.0] * len(FIELDS)

    def add(self, t: float, values: list[float]) -> None:
        self.n += 1
        self.first_t = min(self.first_t, t)
        self.last_t = max(self.last_t, t)
        for i, v in enumerate(values[: len(FIELDS)]):
            self.sums[i] += v
            self.maxes[i] = max(self.maxes[i], v)

    def state(self) -> _GpuState:
        first, last = (self.first_t, self.last_t) if self.n else (None, None)
        return _GpuState(about=self.about, n=self.n, first_t=first, last_t=last, sums=self.sums, maxes=self.maxes)

    @classmethod
    def from_state(cls, node: str, state: _GpuState) -> _Gpu | None:
        """The figures a sampler wrote (None: not of that shape)."""
        if state.n < 0 or len(state.sums) != len(FIELDS) or len(state.maxes) != len(FIELDS):
            return None
        gpu = cls(node, state.about)
        if state.n:
            if state.first_t is None or state.last_t is None:
                return None
            gpu.first_t, gpu.last_t = state.first_t, state.last_t
        gpu.n, gpu.sums, gpu.maxes = state.n, state.sums, state.maxes
        return gpu

    def record(self) -> GpuFigures:
        about, n = self.about, self.n
        figures = GpuFigures(
            node=self.node,
            index=about.index,
            name=about.name,
            uuid=about.uuid,
            memory_total_bytes=about.memory_total_bytes,
            samples=n,
        )
        if not n:
            return figures
        mean = [s / n for s in self.sums]
        return msgspec.structs.replace(
            figures,
            seconds=round(self.last_t - self.first_t, 3),
            util_mean_pct=mean[0],
            util_max_pct=self.maxes[0],
            mem_util_mean_pct=mean[1],
            mem_used_max_bytes=int(self.maxes[2]),
            power_mean_w=mean[3],
            power_max_w=self.maxes[3],
            sm_mhz_mean=mean[4],
            mem_mhz_mean=mean[5],
        )


def sums_path(samples: Path) -> Path:
    """Where a node's running figures are kept, beside its samples (gpus/{node}.sum.json)."""
    return samples.with_name(samples.name.removesuffix(".jsonl") + ".sum.json")


def _read_sums(samples: Path, node: str) -> tuple[list[_Gpu], int] | None:
    """A node's running figures and the offset in its samples file they reach, or None (none, or damaged)."""
    try:  # read_json: a regular file of bounded size (a planted /dev/zero is no figures file)
        doc = msgspec.convert(read_json(sums_path(samples)), _Sums)
    except msgspec.ValidationError:  # none yet, or damaged: every line is read instead
        return None
    gpus = [_Gpu.from_state(doc.node or node, g) for g in doc.gpus]
    return None if None in gpus else ([g for g in gpus if g is not None], doc.offset)


def _carried(samples: Path, node: str, gpus: list[GpuAbout]) -> list[_Gpu]:
    """Each GPU's figures from an earlier start of the run on this node (a requeue), else none yet."""
    earlier: dict[tuple[str, int], _Gpu] = {}
    with contextlib.suppress(OSError):
        read_node(samples, earlier, [])
    by_uuid = {g.about.uuid: g for g in earlier.values() if g.node == node}
    return [by_uuid.get(about.uuid) or _Gpu(node, about) for about in gpus]


_LINE = msgspec.json.Decoder(_Line)


def read_node(path: Path, gpus: dict[tuple[str, int], _Gpu], none: list[str]) -> None:
    """Add one node's samples to `gpus` (keyed by node and index) and its 'nothing to sample' lines to
    `none`: its sampler's running figures and the lines written after them, else every line (a sampler
    killed before its first figures). A line cut short or of the wrong shape is skipped."""
    summed = _read_sums(path, path.stem)
    current: list[_Gpu] = []
    if summed is not None:
        current = [gpus.setdefault((g.node, g.about.index), g) for g in summed[0]]
    with open(path, "rb") as raw:
        raw.seek(summed[1] if summed is not None else 0)
        f = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        for text in f:
            try:
                line = _LINE.decode(text)
            except msgspec.DecodeError:  # cut short by a kill, or of another shape: skipped
                continue
            if line.t is not None and line.g is not None:
                for gpu, values in zip(current, line.g, strict=False):
                    gpu.add(line.t, values)
            elif line.none is not None:
                none.append(line.none)
            elif line.gpus is not None:
                node = line.node or path.stem
                current = [gpus.setdefault((node, g.index), _Gpu(node, g)) for g in line.gpus]


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def gpu_line(records: list[GpuFigures], idle: list[str], none: list[str]) -> str:
    """One line for the verdict: each GPU (or, over 8, the spread), then the idle ones named."""
    if not records:
        return none[0] if none else "no GPU samples"
    if len(records) <= 8:
        each = [
            f"{r.node} GPU {r.index} {r.util_mean_pct or 0.0:.0f}% busy, {_gib(r.mem_used_max_bytes)} of "
            f"{_gib(r.memory_total_bytes)} GiB, {r.power_mean_w or 0.0:.0f} W"
            for r in records
            if r.samples
        ]
        said = "; ".join(each)
    else:
        busy = sorted((r for r in records if r.samples), key=lambda r: r.util_mean_pct or 0.0)
        said = (
            f"{len(records)} GPUs: busy {busy[0].util_mean_pct or 0.0:.0f}% ({busy[0].node} GPU {busy[0].index}) to "
            f"{busy[-1].util_mean_pct or 0.0:.0f}%"
            if busy
            else f"{len(records)} GPUs, no samples"
        )
    named = ", ".join(idle[:8]) + (f" and {len(idle) - 8} more" if len(idle) > 8 else "")
    return f"GPUs (NVML): {said}" + (f"; allocated but idle (never {IDLE_UTIL_PCT:g}% busy): {named}" if idle else "")


class GpuSummary(msgspec.Struct, kw_only=True):
    """summary.json's `gpus`: each sampled GPU's figures (its node, what NVML names it, samples, means and
    peaks), those allocated but idle ("nid001 GPU 2"), the nodes with none to sample, and the line said."""

    sampled: bool
    gpus: list[GpuFigures]
    idle: list[str]
    none: list[str]
    line: str | None


def summarize(folder: Path) -> GpuSummary | None:
    """summary.json's `gpus`: every sampled GPU's figures, those allocated but idle, the nodes with none
    to sample, and the verdict's line; None when no node wrote samples (an older run, sampling off)."""
    paths = sorted(folder.glob("*.jsonl"))
    gpus: dict[tuple[str, int], _Gpu] = {}
    none: list[str] = []
    for path in paths:
        try:
            read_node(path, gpus, none)
        except OSError:
            continue
    if not gpus and not none:
        return None
    records = [gpus[key].record() for key in sorted(gpus)]
    idle = [f"{r.node} GPU {r.index}" for r in records if r.samples and (r.util_max_pct or 0.0) < IDLE_UTIL_PCT]
    return GpuSummary(sampled=bool(records), gpus=records, idle=idle, none=none, line=gpu_line(records, idle, none))
