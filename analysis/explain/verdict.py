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
from collections.abc import Iterable
from typing import TypedDict

from analysis.records import ModelFacts, RunRow, SlowRank, TraceRecord, Verdict
from analysis.runs.fold import model_facts
from analysis.runs.ranks import slow_rank_words
from hpc.core.summary import RunRecord
from hpc.placement.scaling import PERLMUTTER_BUSBW_GBS

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
SECONDARY_SHARE = 0.10  # a second class named beside the first needs at least this share (not its threshold)
HOST_GAP_SHARE = 0.50  # host-launch needs at least half the busiest stream's gap time to be host wait
# DDP adds work per step, so a scaling efficiency above this says more about the 1-GPU point than the run.
SUPERLINEAR_DOUBT = 1.2

# Dense peak TFLOP/s by device-name substring (NVIDIA's data sheets; SXM parts), for compute's share of peak.
DEVICE_PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "tf32": 494.0},
    "H100": {"bf16": 989.0, "tf32": 494.0},
    "A100": {"bf16": 312.0, "tf32": 156.0},
}

REMEDIES = {
    HOST_LAUNCH: "graph mode (train.cuda_graph: true, or auto, the default outside the study's eager profile; "
    "DDP included) replays the whole step as one launch; a larger per-GPU batch gives each launch more work",
    COMMUNICATION: "a larger train.ddp_bucket_cap_mb (fewer, larger all-reduces that overlap backward), or fewer "
    "nodes for the same GPUs (the inter-node link is the slow one)",
    DATA: "data.loader: device (the whole uint8 set on the GPU, augmented there), or more data.num_workers",
    MEMORY: "data.loader: device moves no batch over PCIe each step",
}
# The same remedies for your own script (hpc.submit -- COMMAND), in terms its author can act on.
SCRIPT_REMEDIES = {
    HOST_LAUNCH: "capture the training step as a CUDA graph (torch.cuda.graphs, or torch.compile with "
    "mode='reduce-overhead'), replayed as one launch; a larger per-GPU batch gives each launch more work",
    COMMUNICATION: "a larger bucket_cap_mb in DistributedDataParallel(...) (fewer, larger all-reduces that "
    "overlap backward), or fewer nodes for the same GPUs (the inter-node link is the slow one)",
    DATA: "more DataLoader num_workers with pin_memory=True and persistent_workers=True, or the whole set on "
    "the GPU when it fits",
    MEMORY: "pin_memory=True and .to(device, non_blocking=True), or the whole set on the GPU when it fits",
}
# A run with no device timeline (CPU ranks): its steps wait on the CPU, and no GPU remedy applies.
CPU_REMEDIES = {
    DATA: "more data.num_workers (each worker a core of its own; on a CPU run they share the ranks' cores)",
}
CPU_SCRIPT_REMEDIES = {
    DATA: "more DataLoader num_workers with persistent_workers=True (each worker a core of its own; on a CPU "
    "run they share the ranks' cores)",
}
# A run whose step is already one CUDA graph waits on the host between replays, not inside them.
GRAPHED_HOST_REMEDY = (
    "the step is already a CUDA graph: the wait is between replays (the batch's copy, the loop's Python); "
    "a larger per-GPU batch gives each replay more work"
)


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
    data_step_shares: list[float] | None = None  # of each profiled step (every rank's), the DataLoader's share
    step_us: float | None = None  # the profiled steps' time (the CPU span when there are none)
    kernels_per_step: float | None = None
    ranks: int = 1
    nodes: int = 1
    busbw_GBps: float | None = None  # measured all-reduce bus bandwidth
    step_mean_us: float | None = None  # mean over ranks of their mean step
    step_max_us: float | None = None  # the slowest rank's
    slowest_step: str | None = None  # which rank that is, on which node: no imbalance verdict without it
    straggler_rank: int | None = None
    straggler_share: float | None = None
    slow_rank: SlowRank | None = None  # from every rank's own work per step (analysis/runs/ranks.py)
    # why no straggler is named where a mean says one (its evidence does not hold step by step)
    imbalance_unproven: str | None = None
    achieved_tflops: float | None = None  # where the model's FLOPs are known
    peak_tflops: float | None = None
    graphed: bool = False  # the run's step is a replayed CUDA graph (train.cuda_graph)
    # whose run: a script's (remedies in its terms), the toolkit's training (its keys), or None: traces alone,
    # whoever's (both)
    script: bool | None = None

    @property
    def host_gap_share(self) -> float | None:
        """Of the busiest stream's gap time, the part that waited for the host (None: no gaps measured)."""
        gaps = sum(v or 0.0 for v in (self.host_wait_us, self.kernel_wait_us, self.other_wait_us))
        return (self.host_wait_us or 0.0) / gaps if gaps > 0 else None


def verdict(
    bound: str, secondary: str | None, measured: dict[str, float], evidence: str, remedy: str | None
) -> Verdict:
    """A verdict with its line: `bound [+ secondary]: evidence; remedy: ...`."""
    said = f"; remedy: {remedy}" if remedy else ""
    return Verdict(bound, secondary, measured, evidence, remedy, f"{headline(bound, secondary)}: {evidence}{said}")


def headline(bound: str, secondary: str | None) -> str:
    """`bound (then secondary)`: a verdict in a word or two (a status column, the head of its line)."""
    return bound + (f" (then {secondary})" if secondary else "")


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
    idle, host = _share(e.idle_us, e.span_us), e.host_gap_share
    if idle is not None and host is not None:
        out[HOST_LAUNCH] = idle * host
    if e.ranks > 1 and e.step_mean_us and e.step_max_us and e.slowest_step:
        out[IMBALANCE] = (e.step_max_us - e.step_mean_us) / e.step_max_us
    # Under DDP every rank's step ends at the same all-reduce, so whole steps come out alike: the wait for
    # the slowest rank's own work (all ranks', from summary.json) is the measure that sees a straggler.
    waited = e.slow_rank.wait_share if e.slow_rank is not None and e.slow_rank.holds else None
    by_mean = out.get(IMBALANCE) or 0.0
    if waited is not None and waited > by_mean:  # pragma: no mutate (>= would set the same value)
        out[IMBALANCE] = waited
    return {k: min(max(v, 0.0), 1.0) for k, v in out.items() if v is not None}


def _host_gaps_dominate(e: Evidence) -> bool:
    return (e.host_gap_share or 0.0) >= HOST_GAP_SHARE


def eligible(e: Evidence, measured: dict[str, float]) -> dict[str, float]:
    """The measured shares of the classes that may be named: host-launch only where host wait dominates
    the gaps, and not beside data loading (the host is late because it is loading data: one cause)."""
    out = dict(measured)
    if HOST_LAUNCH in out and (not _host_gaps_dominate(e) or out.get(DATA, 0.0) >= THRESHOLDS[DATA]):
        del out[HOST_LAUNCH]
    return out


def judge(e: Evidence) -> Verdict:
    """The verdict for the evidence (see the module doc): the largest class that reaches its threshold;
    beside it the next largest other than compute with at least SECONDARY_SHARE."""
    measured = shares(e)
    named = sorted(eligible(e, measured).items(), key=lambda kv: -kv[1])
    reached = [(k, v) for k, v in named if v >= THRESHOLDS[k]]
    found = [(k, v) for k, v in reached if unsteady(e, k) is None]
    unproven = f"; no straggler named: {e.imbalance_unproven}" if e.imbalance_unproven else ""
    for k, _ in reached:
        if (why := unsteady(e, k)) is not None:
            unproven += f"; no {k} named: {why}"
    if not found:
        return verdict(UNKNOWN, None, measured, undecided(e, measured) + unproven, None)
    bound = found[0][0]
    secondary = next((k for k, v in named if k not in (bound, COMPUTE) and v >= SECONDARY_SHARE), None)
    remedy = GRAPHED_HOST_REMEDY if bound == HOST_LAUNCH and e.graphed else remedy_for(bound, e)
    return verdict(bound, secondary, measured, describe(bound, e, measured) + unproven, remedy)


def unsteady(e: Evidence, bound: str) -> str | None:
    """Why a class whose share of the profiled steps' sum reaches its threshold is not named: its share
    reaches the threshold in under half of the steps (a slow fetch or two, not every step's wait). The
    data-loading class only: its time is the host's, cut by each step's own range; device time is not
    (a kernel launched in one step runs into the next), so the device classes are judged on the window.
    None: named, or no step-by-step measure."""
    steps = e.data_step_shares if bound == DATA else None
    if not steps:
        return None
    at = sum(share >= THRESHOLDS[DATA] for share in steps)
    if 2 * at >= len(steps):
        return None
    return (
        f"the DataLoader took {THRESHOLDS[DATA]:.0%} of a step or more in {at} of {len(steps)} profiled steps "
        "(a class: half of them or more), the sum's share is a few slow fetches"
    )


def _data_step_shares(records: list[TraceRecord]) -> list[float] | None:
    """Each profiled step's DataLoader share, over every trace that has both."""
    out = [
        loading / step
        for r in records
        if r.dataloader_step_us
        # a cut-off trace's lists may differ in length (strict=None reads as False; True is tested)
        for loading, step in zip(r.dataloader_step_us, r.step_time_us, strict=False)  # pragma: no mutate
        if step > 0
    ]
    return out or None


def remedy_for(bound: str, e: Evidence) -> str | None:
    """The remedy the run's owner can apply: the toolkit's keys for its training, a script's own levers
    for a script, both for traces whose owner is unknown; a CPU run's (no device timeline) without the
    GPU's."""
    cpu = e.span_us is None
    toolkit = (CPU_REMEDIES if cpu else REMEDIES).get(bound)
    script = (CPU_SCRIPT_REMEDIES if cpu else SCRIPT_REMEDIES).get(bound)
    if e.script is None and toolkit and script:
        return f"{toolkit} (the toolkit's training); in a script of your own, {script}"
    return script if e.script else toolkit


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.1f}%"


def describe(bound: str, e: Evidence, measured: dict[str, float]) -> str:
    """The evidence for a class, in numbers the analysis has."""
    if bound == HOST_LAUNCH:
        per_step = f", {e.kernels_per_step:,.0f} kernels a step" if e.kernels_per_step else ""
        idle = _share(e.idle_us, e.span_us)
        ceiling = (
            f"; back to back the device work would take 1/{1 / (1 - idle):.1f} of the span"
            if idle is not None and idle < 1
            else ""
        )
        return (
            f"the GPU was idle {_pct(idle)} of the profiled span, "
            f"{_pct(e.host_gap_share)} of its gaps waiting for the host to launch the next "
            f"kernel (kernels ran {_pct(measured.get(COMPUTE))} of the span{per_step}){ceiling}"
        )
    if bound == COMMUNICATION:
        return f"collectives not hidden by compute took {_pct(measured[COMMUNICATION])} of the span{bandwidth(e)}"
    if bound == DATA:
        waits = "the GPU waiting for batches" if e.span_us is not None else "each step waiting for its batch"
        return f"the DataLoader took {_pct(measured[DATA])} of the profiled steps, {waits}"
    if bound == MEMORY:
        return f"memory copies and sets no kernel covered took {_pct(measured[MEMORY])} of the span"
    if bound == IMBALANCE and e.slow_rank is not None and e.slow_rank.wait_share == measured[IMBALANCE]:
        return f"{slow_rank_words(e.slow_rank)}; the others wait for it {_pct(measured[IMBALANCE])} of every step"
    if bound == IMBALANCE:
        who = (
            f"; rank {e.straggler_rank} launched collectives last {_pct(e.straggler_share)} of the time"
            if e.straggler_rank is not None
            else ""
        )
        # the class is measured from both means: never None here
        worst_us, mean_us = e.step_max_us or 0, e.step_mean_us or 0  # pragma: no mutate
        return (
            f"{e.slowest_step}: its profiled step takes {worst_us / 1e3:.2f} ms against a mean of "
            f"{mean_us / 1e3:.2f} ms over ranks: the others wait {_pct(measured[IMBALANCE])} "
            f"of every step{who}"
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
    idle, host = _share(e.idle_us, e.span_us), e.host_gap_share
    if idle is not None and idle >= THRESHOLDS[HOST_LAUNCH] and not _host_gaps_dominate(e):
        queued = 1 - host if host is not None else None
        return (
            f"the GPU was idle {_pct(idle)} of the span, but {_pct(queued)} "
            "of its gaps came with the next kernel already launched (waiting on another stream or rank): "
            "the trace does not say on what"
        )
    top = max(measured.items(), key=lambda kv: kv[1]) if measured else None
    what = f"; the largest part, {top[0]}, is {_pct(top[1])}" if top else ""
    return f"no class reaches its threshold{what}"


# --- the evidence, from what the analysis measured -------------------------------------------------------


class Breakdown(TypedDict):
    """Evidence's temporal and idle breakdowns, summed over a run's records (None: no record has one)."""

    span_us: float | None
    computation_us: float | None
    communication_us: float | None
    memory_us: float | None
    idle_us: float | None
    host_wait_us: float | None
    kernel_wait_us: float | None
    other_wait_us: float | None


def _breakdown(records: list[TraceRecord]) -> Breakdown:
    """The temporal and idle breakdowns summed over records (None where no record has one)."""

    def temporal(key: str) -> float | None:
        return _sum_present(b[key] for r in records if (b := r.temporal_breakdown_us))

    def idle(key: str) -> float | None:
        return _sum_present(b[key] for r in records if (b := r.idle_breakdown_us))

    return Breakdown(
        span_us=temporal("span_us"),
        computation_us=temporal("computation_us"),
        communication_us=temporal("communication_us"),
        memory_us=temporal("memory_us"),
        idle_us=temporal("idle_us"),
        host_wait_us=idle("host_wait_us"),
        kernel_wait_us=idle("kernel_wait_us"),
        other_wait_us=idle("other_us"),
    )


def _sum_present(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _step_basis(records: list[TraceRecord]) -> float | None:
    """The time data loading is judged against: the profiled steps, else the CPU span."""
    total = sum(sum(r.step_time_us) or (r.cpu_span_us or 0.0) for r in records)
    return total or None


def trace_evidence(rec: TraceRecord) -> Evidence:
    """One trace alone: its breakdowns, DataLoader time and collectives."""
    allreduce = next((c for c in rec.collectives or [] if c["kind"] == "all_reduce"), None)
    return Evidence(
        **_breakdown([rec]),
        dataloader_us=rec.dataloader_us,
        data_step_shares=_data_step_shares([rec]),
        step_us=_step_basis([rec]),
        kernels_per_step=rec.kernel_calls_per_step,
        ranks=rec.world_size or 1,
        busbw_GBps=allreduce.get("busbw_GBps") if allreduce else None,
        graphed=bool(rec.graph_kernel_calls),
    )


def peak_tflops(device_name: str | None, bf16: bool) -> float | None:
    for key, peaks in DEVICE_PEAK_TFLOPS.items():
        if device_name and key in device_name:
            return peaks["bf16" if bf16 else "tf32"]
    return None


def run_evidence(records: list[TraceRecord], run: RunRow, model: ModelFacts | None = None) -> Evidence:
    """A run over all its ranks' traces. `model`: what summary.json knows of the model's FLOPs per image
    (forward), the per-GPU batch and whether it trained in bf16, for compute's share of the device's peak."""
    model = model or ModelFacts()
    step_s = (run.step_time_us_mean.mean or 0.0) / 1e6
    flops, batch = model.flops_per_image, model.batch_size_per_gpu
    achieved = 3 * flops * batch / step_s / 1e12 if flops and batch and step_s else None
    device = next((r.device_name for r in records if r.device_name), None) or model.device_name
    return Evidence(
        **_breakdown(records),
        dataloader_us=_sum_present(r.dataloader_us for r in records),
        data_step_shares=_data_step_shares(records),
        step_us=_step_basis(records),
        kernels_per_step=run.kernel_calls_per_step.mean,
        ranks=run.ranks or 1,
        nodes=run.nodes or 1,
        busbw_GBps=run.allreduce_busbw_GBps,
        step_mean_us=run.step_time_us_mean.mean,
        step_max_us=run.step_time_us_mean.max,
        slowest_step=run.slowest_step,
        straggler_rank=run.straggler_rank,
        straggler_share=run.straggler_share,
        slow_rank=run.slow_rank,
        imbalance_unproven=unproven_imbalance(run),
        achieved_tflops=achieved,
        peak_tflops=peak_tflops(device, model.bf16) if achieved else None,
        # the run's summary says so, or its traces do (kernels replayed from a graph)
        graphed=model.graphed or any(r.graph_kernel_calls for r in records),
        script=model.script,
    )


def unproven_imbalance(run: RunRow) -> str | None:
    """Why no straggler is named where a mean alone would have named one (its share at the threshold or
    more): the step-by-step rule's words (analysis/runs/ranks.py), else None."""
    said = []
    s = run.slow_rank
    if s is not None and not s.holds and (s.wait_share or 0.0) >= THRESHOLDS[IMBALANCE] and s.why_not:
        said.append(f"own work: {s.why_not}")
    mean, worst = run.step_time_us_mean.mean, run.step_time_us_mean.max
    if run.slowest_step_not_named and mean and worst and (worst - mean) / worst >= THRESHOLDS[IMBALANCE]:
        said.append(run.slowest_step_not_named)
    return "; ".join(said) or None


# --- a sweep point against its 1-GPU point ------------------------------------------------------------------

LOSS_WORDS = {
    "computation": "more kernel time",
    "communication": "exposed communication",
    "memory": "memory copies",
    "idle": "the GPU idle (waiting on the host, data or other ranks)",
    "imbalance": "the slowest rank's excess over the mean",
}


def scaling_note(run: RunRow) -> str | None:
    """Why a multi-GPU point falls short of linear: the largest term of its loss decomposition."""
    if run.scaling_efficiency is None or (run.gpus or 1) * (run.nodes or 1) <= 1:
        return None
    if run.scaling_efficiency >= 1:
        doubt = (
            "; this far above, suspect the 1-GPU point (shared cores, a cold start) before a real gain"
            if run.scaling_efficiency > SUPERLINEAR_DOUBT
            else ""
        )
        return f"efficiency {run.scaling_efficiency:.2f}: at or above linear, no loss to explain{doubt}"
    if not run.loss_us:
        return (
            f"efficiency {run.scaling_efficiency:.2f}: below linear, but the traces have no device timeline "
            "to split the loss by (a CPU run)"
        )
    parts = {k: v for k, v in run.loss_us.items() if k != "total"}
    part, value = max(parts.items(), key=lambda kv: kv[1])
    total = run.loss_us["total"]
    link = (
        bandwidth(Evidence(busbw_GBps=run.allreduce_busbw_GBps, nodes=run.nodes or 1))
        if part == "communication"
        else ""
    )
    if total <= 0:
        return f"efficiency {run.scaling_efficiency:.2f}: the step is no longer than on 1 GPU"
    return (
        f"efficiency {run.scaling_efficiency:.2f}: the step is {total / 1e3:.2f} ms longer than on 1 GPU, "
        f"most of it {LOSS_WORDS[part]} ({value / 1e3:.2f} ms){link}"
    )


def judged_trace(rec: TraceRecord) -> TraceRecord:
    """A trace's record with its verdict attached."""
    return dataclasses.replace(rec, verdict=judge(trace_evidence(rec)))


def judged_run(run: RunRow, records: list[TraceRecord], summary: RunRecord | None) -> RunRow:
    """A run's record with its verdict attached: its ranks' records, and the model's work per step as its
    summary.json says it."""
    return dataclasses.replace(run, verdict=judge(run_evidence(records, run, model_facts(summary))))
