"""The why, in words: what bounds a trace or a run, from the numbers the analysis already has, with the
evidence and the toolkit's own remedy where it has one; and for a multi-GPU sweep point, why it falls
short of linear scaling.

Each class has a share: the part of the profiled time it explains (of the device's span for the
device-side classes, of the step for data loading and imbalance). A class is a candidate when its
share reaches its threshold (THRESHOLDS, documented in the README); the verdict is the candidate with
the largest share, and a second candidate with at least SECONDARY_SHARE is named beside it. When no
class reaches its threshold the verdict is `unknown`, and says what was measured instead of guessing.

    host-launch     the GPU idle, waiting for the host to launch work: idle share x the share of the
                    busiest stream's gaps that began before the next kernel was even launched
    communication   collectives not hidden by compute: exposed communication's share of the span
    data-loading    the DataLoader's time (`enumerate(DataLoader)...` ranges) in the profiled steps
    memory-copies   memcpy/memset covered by no kernel: their share of the span
    imbalance       the slowest rank's step over the mean: (max - mean) / max (runs of several ranks)
    compute         kernels busy: computation's share of the span (the healthy case)

Data loading, when it is a candidate, explains the host's lateness: host-launch is then not named
beside it. No torch import: `python -m analysis`, report.html, hpc.study status and the quickstart
use this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from analysis.scaling import PERLMUTTER_BUSBW_GBS

HOST_LAUNCH, COMMUNICATION, DATA, MEMORY, IMBALANCE, COMPUTE, UNKNOWN = (
    "host-launch",
    "communication",
    "data-loading",
    "memory-copies",
    "imbalance",
    "compute",
    "unknown",
)
CLASSES = (HOST_LAUNCH, COMMUNICATION, DATA, MEMORY, IMBALANCE, COMPUTE)

# The least share of the profiled time that makes a class a candidate (README: "Verdicts").
THRESHOLDS = {HOST_LAUNCH: 0.30, COMMUNICATION: 0.20, DATA: 0.25, MEMORY: 0.20, IMBALANCE: 0.10, COMPUTE: 0.60}
SECONDARY_SHARE = 0.10  # a second class named beside the first needs at least this share, and its threshold
HOST_GAP_SHARE = 0.50  # host-launch needs at least half the busiest stream's gap time to be host wait

# Dense peak TFLOP/s by device-name substring (NVIDIA's data sheets; SXM parts), for compute's share of peak.
DEVICE_PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "tf32": 494.0},
    "H100": {"bf16": 989.0, "tf32": 494.0},
    "A100": {"bf16": 312.0, "tf32": 156.0},
}

REMEDIES = {
    HOST_LAUNCH: "graph mode (train.cuda_graph: true) replays the whole step as one launch; a larger per-GPU "
    "batch gives each launch more work",
    COMMUNICATION: "a larger train.ddp_bucket_cap_mb (fewer, larger all-reduces that overlap backward), or fewer "
    "nodes for the same GPUs (the inter-node link is the slow one)",
    DATA: "data.loader: device (the whole uint8 set on the GPU, augmented there), or more data.num_workers",
    MEMORY: "data.loader: device moves no batch over PCIe each step",
}


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a verdict is decided from: times in µs, summed over what is judged (a trace, or a run's ranks)."""

    span_us: float | None = None  # first device event's start to the last one's end
    computation_us: float | None = None
    communication_us: float | None = None  # exposed
    memory_us: float | None = None
    idle_us: float | None = None
    host_wait_us: float | None = None  # the busiest stream's gaps, by cause (HTA's idle breakdown)
    kernel_wait_us: float | None = None
    other_wait_us: float | None = None
    dataloader_us: float | None = None  # DataLoader ranges in the profiled steps
    step_us: float | None = None  # the profiled steps' time (the CPU span when there are none)
    kernels_per_step: float | None = None
    ranks: int = 1
    nodes: int = 1
    busbw_GBps: float | None = None  # measured all-reduce bus bandwidth
    step_mean_us: float | None = None  # mean over ranks of their mean step
    step_max_us: float | None = None  # the slowest rank's
    straggler_rank: int | None = None
    straggler_share: float | None = None
    achieved_tflops: float | None = None  # where the model's FLOPs are known
    peak_tflops: float | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    bound: str
    secondary: str | None
    shares: dict[str, float]  # each class's measured share (0..1)
    evidence: str  # the numbers behind the verdict, one sentence
    remedy: str | None

    def line(self) -> str:
        """`bound [+ secondary]: evidence; remedy: ...` in one line."""
        head = self.bound + (f" (then {self.secondary})" if self.secondary else "")
        return f"{head}: {self.evidence}" + (f"; remedy: {self.remedy}" if self.remedy else "")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "line": self.line()}


def _share(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def shares(e: Evidence) -> dict[str, float]:
    """Each class's share of the profiled time it is judged against (classes without evidence left out)."""
    out: dict[str, float | None] = {
        COMPUTE: _share(e.computation_us, e.span_us),
        COMMUNICATION: _share(e.communication_us, e.span_us),
        MEMORY: _share(e.memory_us, e.span_us),
        DATA: _share(e.dataloader_us, e.step_us),
    }
    gaps = sum(v or 0.0 for v in (e.host_wait_us, e.kernel_wait_us, e.other_wait_us))
    idle = _share(e.idle_us, e.span_us)
    if idle is not None and gaps > 0:
        out[HOST_LAUNCH] = idle * (e.host_wait_us or 0.0) / gaps
    if e.ranks > 1 and e.step_mean_us and e.step_max_us:
        out[IMBALANCE] = (e.step_max_us - e.step_mean_us) / e.step_max_us
    return {k: min(max(v, 0.0), 1.0) for k, v in out.items() if v is not None}


def _host_gaps_dominate(e: Evidence) -> bool:
    gaps = sum(v or 0.0 for v in (e.host_wait_us, e.kernel_wait_us, e.other_wait_us))
    return gaps > 0 and (e.host_wait_us or 0.0) / gaps >= HOST_GAP_SHARE


def candidates(e: Evidence, measured: dict[str, float]) -> list[tuple[str, float]]:
    """The classes that reach their thresholds, largest share first."""
    found = [(k, v) for k, v in measured.items() if v >= THRESHOLDS[k]]
    if HOST_LAUNCH in dict(found) and not _host_gaps_dominate(e):
        found = [(k, v) for k, v in found if k != HOST_LAUNCH]
    if DATA in dict(found):  # the host is late because it is loading data: one cause, named once
        found = [(k, v) for k, v in found if k != HOST_LAUNCH]
    return sorted(found, key=lambda kv: -kv[1])


def judge(e: Evidence) -> Verdict:
    """The verdict for the evidence (see the module doc)."""
    measured = shares(e)
    found = candidates(e, measured)
    if not found:
        return Verdict(UNKNOWN, None, measured, undecided(e, measured), None)
    bound = found[0][0]
    secondary = next((k for k, v in found[1:] if v >= SECONDARY_SHARE and k != COMPUTE), None)
    return Verdict(bound, secondary, measured, describe(bound, e, measured), REMEDIES.get(bound))


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.1f}%"


def describe(bound: str, e: Evidence, measured: dict[str, float]) -> str:
    """The evidence for a class, in numbers the analysis has."""
    if bound == HOST_LAUNCH:
        gaps = sum(v or 0.0 for v in (e.host_wait_us, e.kernel_wait_us, e.other_wait_us))
        per_step = f", {e.kernels_per_step:,.0f} kernels a step" if e.kernels_per_step else ""
        return (
            f"the GPU was idle {_pct(_share(e.idle_us, e.span_us))} of the profiled span, "
            f"{_pct(_share(e.host_wait_us, gaps))} of its gaps waiting for the host to launch the next "
            f"kernel (kernels ran {_pct(measured.get(COMPUTE))} of the span{per_step})"
        )
    if bound == COMMUNICATION:
        return f"collectives not hidden by compute took {_pct(measured[COMMUNICATION])} of the span{bandwidth(e)}"
    if bound == DATA:
        return f"the DataLoader took {_pct(measured[DATA])} of the profiled steps, the GPU waiting for batches"
    if bound == MEMORY:
        return f"memory copies and sets no kernel covered took {_pct(measured[MEMORY])} of the span"
    if bound == IMBALANCE:
        who = (
            f"; rank {e.straggler_rank} launched collectives last {_pct(e.straggler_share)} of the time"
            if e.straggler_rank is not None
            else ""
        )
        return (
            f"the slowest rank's step is {_pct(measured[IMBALANCE])} longer than the mean over ranks "
            f"({(e.step_max_us or 0) / 1e3:.1f} against {(e.step_mean_us or 0) / 1e3:.1f} ms){who}"
        )
    peak = (
        f", {e.achieved_tflops:.1f} TFLOP/s = {_pct(e.achieved_tflops / e.peak_tflops)} of the device's dense peak"
        if e.achieved_tflops and e.peak_tflops
        else ", the share of peak unknown (no FLOP count)"
    )
    return f"kernels kept the GPU busy {_pct(measured[COMPUTE])} of the span (healthy){peak}"


def bandwidth(e: Evidence) -> str:
    """The measured all-reduce bus bandwidth against what the link should carry (Perlmutter's, assumed)."""
    if not e.busbw_GBps:
        return ""
    link = "inter_node" if e.nodes > 1 else "intra_node"
    return (
        f"; all-reduce bus bandwidth {e.busbw_GBps:.1f} GB/s against ~{PERLMUTTER_BUSBW_GBS[link]:.0f} GB/s "
        f"the {'network' if e.nodes > 1 else 'NVLink'} should carry"
    )


def undecided(e: Evidence, measured: dict[str, float]) -> str:
    """What was measured, when no class reaches its threshold: said, not guessed."""
    if e.span_us is None:
        data = f"; the DataLoader took {_pct(measured[DATA])} of the steps" if DATA in measured else ""
        return f"no device activity in the trace (a CPU run): the GPU classes cannot be judged{data}"
    idle = _share(e.idle_us, e.span_us)
    gaps = sum(v or 0.0 for v in (e.host_wait_us, e.kernel_wait_us, e.other_wait_us))
    if idle is not None and idle >= THRESHOLDS[HOST_LAUNCH] and not _host_gaps_dominate(e):
        queued = 1 - (e.host_wait_us or 0.0) / gaps if gaps else None
        return (
            f"the GPU was idle {_pct(idle)} of the span, but {_pct(queued)} "
            "of its gaps came with the next kernel already launched (waiting on another stream or rank): "
            "the trace does not say on what"
        )
    top = max(measured.items(), key=lambda kv: kv[1]) if measured else None
    what = f"; the largest part, {top[0]}, is {_pct(top[1])}" if top else ""
    return f"no class reaches its threshold{what}"
