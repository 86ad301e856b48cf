"""One run: its per-trace records, with what summary.json knows about each rank attached, folded per rank
(one trace per profiling cycle) and spread over ranks into the run's record (analysis/records.py).

A run directory is what hpc.train writes (hpc/core/rundir.py: traces/, summary.json, metrics.jsonl);
its files are read through the core's readers, and anything of the wrong shape is warned about and
left out, never guessed.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

from analysis.read.metrics import logged_metrics, summarise
from analysis.records import (
    SPREAD_FIELDS,
    MetricSummary,
    ModelFacts,
    N,
    RankTotals,
    RunRow,
    Spread,
    TraceRecord,
    in_steps,
    max_present,
    mean_present,
)
from analysis.runs.ranks import profiled_step_consistency, separate_copies, slow_rank, step_skew_us, straggler
from hpc.core.ending import Outcome, PointState
from hpc.core.errors import ConfigError
from hpc.core.rundir import RunPaths, is_count, read_metrics
from hpc.core.summary import RankEntry, RunRecord, current_summary
from hpc.settings.config import run_config_from_dict
from hpc.settings.schema import RunConfig

BREAKDOWN_PARTS = ("computation_us", "communication_us", "memory_us", "idle_us", "span_us")


def number_or_none(value: object) -> float | int | None:
    return value if (type(value) is int or type(value) is float) and math.isfinite(value) else None


def _sum_or_none(values: list[N | None]) -> N | None:
    present = [v for v in values if v is not None]
    return sum(present[1:], present[0]) if present else None


def fold_run(
    run_dir: Path, records: list[TraceRecord], summary: RunRecord | None
) -> tuple[list[TraceRecord], RunRow | None, bool]:
    """A run's per-trace records with its summary attached, its run-level record (None: no trace), and
    whether that record has timings to judge (not a run out of memory)."""
    by_rank_summary = {r.rank: r for r in ranks_of(summary)}
    records = [with_summary(rec, by_rank_summary[rec.rank]) if rec.rank in by_rank_summary else rec for rec in records]
    # A run that ran out of memory gets no timings: a trace it left covers an aborted window only.
    oom = oom_record(run_dir, summary) if summary is not None else None
    metrics = run_metrics(run_dir)
    if oom is not None or not records:
        row = oom if oom is not None else metrics_row(run_dir, summary) if metrics else None
        return records, with_metrics(row, metrics, summary) if row is not None else None, False
    return records, with_metrics(run_record(run_dir, records, summary), metrics, summary), True


def with_metrics(row: RunRow, metrics: dict[str, MetricSummary] | None, summary: RunRecord | None) -> RunRow:
    """The row with the run's own metrics; your own command's data is its own, never named CIFAR-100."""
    script = summary is not None and summary.kind == "command"
    return dataclasses.replace(row, metrics=metrics, data_source="script" if script else row.data_source)


def run_metrics(run_dir: Path) -> dict[str, MetricSummary] | None:
    """The run's own metrics (loss, accuracy) as its loggers wrote them under its directory, by name."""
    return {name: summarise(series) for name, series in logged_metrics(run_dir).items()} or None


def metrics_row(run_dir: Path, summary: RunRecord | None) -> RunRow:
    """The row of a run that left its metrics and no trace (a script run with the profiler off): what it
    was and how it ended, its metrics added by the caller; no timings."""
    return RunRow(
        run_dir=str(run_dir),
        outcome=outcome_of(summary),
        arch=command_name(summary),
        ranks=len(ranks_of(summary)),
        gpus=summary.world_size if summary is not None else None,
        **run_facts(first_rank(summary)),
    )


def with_summary(rec: TraceRecord, rank_summary: RankEntry) -> TraceRecord:
    """The record with what summary.json knows about its rank: the peak RSS, and the profiler's own
    totals for the same cycle (trace i <-> cycle i), for cross-checking."""
    profiler = rank_summary.profiler
    names, cycles = (profiler.traces, profiler.cycles) if profiler is not None else ([], [])
    name = Path(rec.file).name
    key_averages = rec.key_averages
    if name in names and names.index(name) < len(cycles):
        cycle = cycles[names.index(name)]
        key_averages = {
            k: number_or_none(cycle.get(k))
            for k in ("self_cpu_time_total_us", "self_device_time_total_us", "conv2d_calls")
        }
    return dataclasses.replace(rec, peak_cpu_mem_bytes=rank_summary.peak_rss_bytes, key_averages=key_averages)


def first_rank(summary: RunRecord | None) -> RankEntry:
    """Rank 0's record in summary.json, where the run-wide facts are; an empty one (rank 0, nothing said)
    without one."""
    first = summary.first_rank if summary is not None else None
    return first if first is not None else RankEntry(rank=0)


def ranks_of(summary: RunRecord | None) -> list[RankEntry]:
    """summary.json's rank records; none without one."""
    return summary.ranks if summary is not None else []


def config_of(summary: RunRecord | None) -> RunConfig | None:
    """The run config summary.json records (the toolkit's training's), as its RunConfig; None for a command,
    without one, or for one this toolkit cannot read (a later toolkit's: its numbers stand without it)."""
    if summary is None or not summary.config:
        return None
    try:
        return run_config_from_dict(summary.config, f"{summary.run_dir}/summary.json config")
    except ConfigError:
        return None


def step_mode(summary: RunRecord | None) -> str | None:
    """How the run's steps ran, eager or graph (train.cuda_graph): summary.json's fact, or for a summary
    written before it had one, its config."""
    said = first_rank(summary).step_mode
    if said is not None:
        return said
    cfg = config_of(summary)
    graphed = cfg.train.cuda_graph if cfg is not None else None
    return {True: "graph", False: "eager"}.get(graphed) if isinstance(graphed, bool) else None


def oom_record(run_dir: Path, summary: RunRecord) -> RunRow | None:
    """The run-level row of a run that ended out of memory (hpc/training/oom.py): a result with no timings."""
    oom = summary.oom
    if summary.outcome != Outcome.OOM or oom is None:
        return None
    cfg = config_of(summary)
    batch = oom.batch_size_per_gpu
    return RunRow(
        run_dir=str(run_dir),
        outcome=Outcome.OOM,
        arch=cfg.model.arch if cfg is not None else None,
        step_mode=step_mode(summary),
        batch_size_per_gpu=batch if is_count(batch) else None,
        gpus=summary.world_size,
        data_fraction=cfg.data.fraction if cfg is not None else None,
        oom=oom,
        gpu_line=gpu_line(summary),
    )


def gpu_line(summary: RunRecord | None) -> str | None:
    """summary.json's line of the node's GPUs as NVML sampled them (hpc/core/gpusample.py), if any."""
    line = summary.gpus.line if summary is not None and summary.gpus is not None else None
    return line[:2000] if line is not None else None


def rank_totals(records: list[TraceRecord], steps_per_epoch: dict[int, int | None] | None = None) -> list[RankTotals]:
    """Fold each rank's traces (one per profiling cycle) into one: sums of counts and times, peaks' max."""
    by_rank: dict[int | None, list[TraceRecord]] = {}
    for rec in records:
        by_rank.setdefault(rec.rank, []).append(rec)
    per_epoch = steps_per_epoch or {}
    return [_fold_rank(rank, recs, per_epoch.get(rank) if rank is not None else None) for rank, recs in by_rank.items()]


def _fold_rank(rank: int | None, recs: list[TraceRecord], steps_per_epoch: int | None) -> RankTotals:
    step_means = [r.step_time_us_mean for r in recs if r.step_time_us_mean is not None]
    breakdown = {
        k: _sum_or_none([r.temporal_breakdown_us[k] if r.temporal_breakdown_us else None for r in recs])
        for k in BREAKDOWN_PARTS
    }
    return RankTotals(
        rank=rank,
        steps=sum(r.steps for r in recs),
        steps_per_epoch=steps_per_epoch,
        cpu_time_us=_sum_or_none([r.cpu_time_us for r in recs]),
        cuda_time_us=_sum_or_none([r.cuda_time_us for r in recs]),
        gpu_busy_us=_sum_or_none([r.gpu_busy_us for r in recs]),
        kernel_calls=_sum_or_none([r.kernel_calls for r in recs]),
        cuda_time_in_steps_us=_sum_or_none([in_steps(r.cuda_time_in_steps_us, r.cuda_time_us) for r in recs]),
        kernel_calls_in_steps=_sum_or_none([in_steps(r.kernel_calls_in_steps, r.kernel_calls) for r in recs]),
        comm_time_us=_sum_or_none([r.comm_time_us for r in recs]),
        step_time_us_mean=sum(step_means) / len(step_means) if step_means else None,
        peak_gpu_mem_bytes=max_present([r.peak_gpu_mem_bytes for r in recs]),
        peak_gpu_reserved_bytes=max_present([r.peak_gpu_reserved_bytes for r in recs]),
        peak_cpu_mem_bytes=max_present([r.peak_cpu_mem_bytes for r in recs]),
        **breakdown,
    )


def steps_per_epoch_by_rank(summary: RunRecord | None) -> dict[int, int | None]:
    """Optimizer steps per epoch of each rank: as recorded, else from its data and batch (older runs:
    the sampler gives each rank ceil(images / ranks) images)."""
    out = {}
    for r in ranks_of(summary):
        value = r.steps_per_epoch
        if value is None or not is_count(value):
            counts = [r.train_images, r.world_size, r.batch_size_per_gpu]
            known = [v for v in counts if v is not None and v > 0]
            value = math.ceil(math.ceil(known[0] / known[1]) / known[2]) if len(known) == 3 else None
        out[r.rank] = value
    return out


def slowest_step(
    ranks: list[RankTotals], summary: RunRecord | None, records: list[TraceRecord]
) -> tuple[str | None, str | None]:
    """("rank R on NODE", None) for the rank whose profiled steps took longest (its node from summary.json),
    where it was slower step by step (analysis/runs/ranks.py's consistency); else (None, why not, or None
    where fewer than two ranks were timed)."""
    timed = [r for r in ranks if isinstance(r.rank, int) and r.step_time_us_mean]
    if len(timed) < 2:
        return None, None
    rank = max(timed, key=lambda r: r.step_time_us_mean or 0.0).rank
    evidence = profiled_step_consistency(records, rank)
    if not evidence.holds:
        return None, f"profiled steps: {evidence.why_not}"
    record = next((r for r in ranks_of(summary) if r.rank == rank), None)
    node = record.node or record.hostname if record is not None else None
    return (f"rank {rank} on {node}" if node else f"rank {rank} (its node unknown: no summary.json)"), None


def run_record(run_dir: Path, records: list[TraceRecord], summary: RunRecord | None) -> RunRow:
    """The run's record: what it was (from its summary), its ranks' numbers spread over ranks, and what
    comparing the ranks shows (imbalance, skew, straggler); not yet judged (explain/verdict.py judged_run)."""
    ranks = rank_totals(records, steps_per_epoch_by_rank(summary))
    cfg = config_of(summary)
    first = first_rank(summary)
    step_times = [r.step_time_us_mean for r in ranks if r.step_time_us_mean]
    straggler_rank, straggler_share = straggler(records)
    summary_ranks = ranks_of(summary)
    alone = separate_copies(summary_ranks)  # ranks that never communicate: none waits for another
    slowest, not_slowest = (None, None) if alone else slowest_step(ranks, summary, records)
    # RunRow's Spread fields, set by their names in SPREAD_FIELDS: mypy cannot check those
    spreads: dict[str, Any] = {name: Spread.of([getattr(r, name) for r in ranks]) for name in SPREAD_FIELDS}
    facts = run_facts(first)
    facts.update(memory_by_category(summary))
    return RunRow(
        run_dir=str(run_dir),
        traces=len(records),
        ranks=len(ranks),
        arch=cfg.model.arch if cfg is not None else command_name(summary),
        step_mode=step_mode(summary),
        batch_size_per_gpu=first.batch_size_per_gpu if is_count(first.batch_size_per_gpu) else None,
        gpus=(summary.world_size if summary is not None else None) or len(ranks),
        data_fraction=cfg.data.fraction if cfg is not None else None,
        images_per_s=number_or_none(first.global_images_per_s),
        # no summary.json: the run crashed (or, in a live sweep, is still running)
        outcome=outcome_of(summary),
        epoch_time_s=epoch_time_s(RunPaths(run_dir).metrics),
        step_skew_us=step_skew_us(records),
        allreduce_busbw_GBps=mean_present([_all_reduce(r, "busbw_GBps") for r in records]),
        allreduce_bytes_per_step=mean_present([_all_reduce_bytes_per_step(r) for r in records]),
        rank_imbalance=max(step_times) / min(step_times) if len(step_times) > 1 else (1.0 if step_times else None),
        straggler_rank=straggler_rank,
        straggler_share=straggler_share,
        separate_copies=alone,
        slowest_step=slowest,
        slowest_step_not_named=not_slowest,
        slow_rank=None if alone else slow_rank(summary_ranks),
        profiled_ranks=sorted({r.rank for r in records if isinstance(r.rank, int)}),
        gpu_line=gpu_line(summary),
        **facts,
        **spreads,
    )


def why_no_trace(run_dir: Path) -> str | None:
    """Why your own command's run left no trace, from its summary.json, or None (not such a run)."""
    summary = current_summary(RunPaths(run_dir))
    if summary is None or summary.kind != "command":
        return None
    if not summary.profiled:
        return "the command ran with profiling off (--no-profile, or profiler.enabled: false)"
    ranks = summary.ranks
    notes = [p.note for r in ranks if (p := r.profiler) is not None and p.note]
    if notes:
        return notes[0]
    steps = [r.steps for r in ranks if r.steps is not None and is_count(r.steps)]
    if not steps or max(steps) == 0:
        return (
            "no torch.optim optimizer step was seen (the profiler steps on torch's optimizer step hook; a script "
            "that updates its weights by hand, or only inside torch.compile, is not profiled)"
        )
    return f"it made {max(steps)} optimizer step(s), fewer than the profiler's window (wait + warmup + active) needs"


def outcome_of(summary: RunRecord | None) -> str:
    """How the run ended, in hpc/core/ending.py's words (its summary as its ranks' records make it, the
    toolkit's training and a command alike), or unfinished: no record at all (killed before any, traces
    copied without them)."""
    if summary is None:
        return PointState.UNFINISHED
    return str(summary.outcome) if summary.outcome is not None else str(PointState.UNKNOWN)


def command_name(summary: RunRecord | None) -> str | None:
    """Your own command's run: the script it ran (`python train.py` -> train.py), else its program."""
    words = summary.command if summary is not None else None
    if summary is None or summary.kind != "command" or not words:
        return None
    scripts = [w for w in words[1:] if w.endswith(".py")]
    return Path(scripts[0] if scripts else str(words[0])).name[:60]


class RunFacts(TypedDict, total=False):
    """RunRow's fields from rank 0's summary record (run_facts) and its memory categories (memory_by_category)."""

    device_kind: str | None
    data_source: str | None
    train_images: int | None
    wall_time_s: float | None
    graph_check: str
    graph_check_cause: str
    peak_mem_categorised_bytes: int
    peak_mem_by_category: dict[str, int]


def run_facts(first: RankEntry) -> RunFacts:
    """What the ranks trained on, from rank 0's summary record: the device kind and the data."""
    device = first.device or ""
    source = first.data_source
    images = first.train_images
    facts = RunFacts(
        device_kind="cpu" if device.startswith("cpu") else ("cuda" if device.startswith("cuda") else None),
        data_source=source if source in ("cifar100", "synthetic", "script") else None,
        train_images=images if is_count(images) else None,
        wall_time_s=number_or_none(first.wall_time_s),
    )
    facts.update(graph_check(first.graph_check))
    return facts


def graph_check(said: object) -> RunFacts:
    """summary.json's graph_check ("passed", or "failed on rank R: cause") as the short word for tables
    and the cause for JSON; nothing for a run that was not graphed (or was written before the check)."""
    if not isinstance(said, str) or not said:
        return {}
    short, _, cause = said.partition(": ")
    return RunFacts(graph_check=short[:40], graph_check_cause=cause) if cause else RunFacts(graph_check=short[:40])


def memory_by_category(summary: RunRecord | None) -> RunFacts:
    """The categories at the largest peak torch's memory profiler saw, over every rank and cycle
    (hpc/training/memcat.py); nothing where no cycle recorded them."""
    best: RunFacts | None = None
    for rank in ranks_of(summary):
        for cycle in rank.profiler.cycles if rank.profiler is not None else []:
            found = cycle.get("memory_categories")
            peak, cats = (found.get("peak_bytes"), found.get("categories")) if isinstance(found, dict) else (None, None)
            if _bytes(peak) and isinstance(cats, dict) and all(_bytes(v) for v in cats.values()):
                if best is None or peak > best.get("peak_mem_categorised_bytes", 0):
                    best = RunFacts(peak_mem_categorised_bytes=peak, peak_mem_by_category=dict(cats))
    return best or {}


def _bytes(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value < 1 << 50


def model_facts(summary: RunRecord | None) -> ModelFacts:
    """What summary.json says of the model's work per step: forward FLOPs per image, the per-GPU batch,
    the device, and whether it trained in bf16 (for compute's share of the device's peak)."""
    first = first_rank(summary)
    cfg = config_of(summary)
    amp = cfg.train.amp if cfg is not None else None
    device = first.device_name
    flops, batch = first.model_flops_per_image, first.batch_size_per_gpu
    return ModelFacts(
        flops_per_image=flops,
        batch_size_per_gpu=batch if is_count(batch) else None,
        device_name=device,
        bf16=amp == "bf16" or (amp == "auto" and device not in (None, "cpu")),
        graphed=step_mode(summary) == "graph",
        script=None if summary is None else summary.kind == "command",  # None: no summary
    )


def _all_reduce(rec: TraceRecord, key: str) -> float | None:
    return next((c[key] for c in rec.collectives or [] if c["kind"] == "all_reduce"), None)


def _all_reduce_bytes_per_step(rec: TraceRecord) -> float | None:
    per_call, calls = _all_reduce(rec, "bytes_per_call"), _all_reduce(rec, "calls")
    return per_call * calls / rec.steps if per_call is not None and calls is not None and rec.steps else None


def epoch_time_s(metrics: Path) -> float | None:
    """The mean measured epoch wall time of the run's `epoch` records (metrics.jsonl), or None."""
    return mean_present([number_or_none(r.epoch_time_s) for r in read_metrics(metrics) if r.kind == "epoch"])
