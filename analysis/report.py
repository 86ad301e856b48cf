"""Per-trace records -> per-rank totals -> per-run and per-sweep records (analysis/records.py); CSV,
Markdown, JSON, text; the study's figures.

A run directory is what hpc.train writes (traces/, summary.json, config.yaml); a sweep directory is
what `hpc.submit --sweep` writes (index.json naming each point's run directory).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from analysis.records import SPREAD_FIELDS, RankTotals, RunRecord, Spread, TraceRecord
from analysis.trace import TraceError, analyze_trace

TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.json", "*.json.gz")


WARNINGS: list[str] = []  # what was skipped, said once the command knows whether it has a result


def warn(message: str) -> None:
    """Note a skipped file, event or field; `flush_warnings` prints them (one line each)."""
    WARNINGS.append(" ".join(message.split())[:400])


def flush_warnings() -> list[str]:
    """Print and forget the pending warnings; return them."""
    pending = WARNINGS[:]
    WARNINGS.clear()
    for message in pending:
        print(f"analysis: warning: {message}", file=sys.stderr)
    return pending


def find_traces(directory: Path) -> list[Path]:
    found: set[Path] = set()
    for pattern in TRACE_PATTERNS:
        found.update(p for p in directory.rglob(pattern) if p.is_file())
    # Our own side files are JSON too; they are not traces.
    skip = {"summary.json", "index.json", "metrics.json", "records.json"}
    return sorted(p for p in found if p.name not in skip and not p.name.endswith(".tmp"))


def _analyze_one(path: Path) -> tuple[TraceRecord | None, str | None]:
    """(record, warning) of one file; runs in a worker process, so the warning travels back."""
    try:
        rec = analyze_trace(path)
    except TraceError as e:
        return None, f"{path}: skipped: {e}"
    return rec, (f"{path}: {rec.bad_events} event(s) with mistyped fields skipped" if rec.bad_events else None)


def analyze_files(paths: Iterable[Path], workers: int | None = None) -> list[TraceRecord]:
    """The records of the usable files, in order, analysed in parallel over the machine's cores
    (`workers`, default: one per core, at most one per file); unusable files are warned about."""
    paths = list(paths)
    workers = min(len(paths), workers or os.cpu_count() or 1)
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_analyze_one, paths))
    else:
        results = [_analyze_one(p) for p in paths]
    for _, message in results:
        if message:
            warn(message)
    return [rec for rec, _ in results if rec is not None]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable ({' '.join(str(e).split())[:200]})")
        return None


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 20


def read_summary(path: Path) -> dict | None:
    """summary.json as hpc.train writes it, or None (warned) when it is not that shape. Rank records
    that are not mappings with an integer rank are dropped, each warned about."""
    if not path.exists():
        return None
    data = _read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("ranks", []), list):
        warn(f"{path}: ignored: expected a mapping with a 'ranks' list, got {type(data).__name__}")
        return None
    ranks = []
    for i, r in enumerate(data.get("ranks", [])):
        if isinstance(r, dict) and _is_count(r.get("rank")):
            ranks.append(r)
        else:
            warn(f"{path}: ranks[{i}] ignored: not a record with an integer 'rank'")
    for key in ("config", "oom"):
        if key in data and not isinstance(data[key], dict):
            warn(f"{path}: {key!r} ignored: not a mapping")
            data = {k: v for k, v in data.items() if k != key}
    if "world_size" in data and not _is_count(data["world_size"]):
        warn(f"{path}: world_size {str(data['world_size'])[:40]!r} ignored: not a count")
        data = {k: v for k, v in data.items() if k != "world_size"}
    return {**data, "ranks": ranks}


def _number_or_none(value: Any) -> Any:
    return value if type(value) in (int, float) and math.isfinite(value) else None


def _sum_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _max_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def run_traces(run_dir: Path) -> list[Path]:
    return find_traces(run_dir / "traces" if (run_dir / "traces").is_dir() else run_dir)


def analyze_run(run_dir: Path, records: list[TraceRecord] | None = None) -> tuple[list[TraceRecord], RunRecord | None]:
    """Per-trace records of a run (with the run's summary attached) and the run-level record; the
    records are made here unless given (a sweep analyses all its points' traces at once)."""
    records = analyze_files(run_traces(run_dir)) if records is None else records
    summary = read_summary(run_dir / "summary.json")
    by_rank_summary = {r["rank"]: r for r in (summary or {}).get("ranks", [])}
    for rec in records:
        s = by_rank_summary.get(rec.rank)
        if s is not None:
            attach_summary(rec, s)
    # A run that ran out of memory gets no timings: a trace it left covers an aborted window only.
    oom = oom_record(run_dir, summary) if isinstance(summary, dict) else None
    if oom is not None or not records:
        return records, oom
    return records, run_record(run_dir, records, summary)


def attach_summary(rec: TraceRecord, rank_summary: dict) -> None:
    """What summary.json knows about the trace's rank: its peak RSS, and the profiler's own totals for
    the same cycle (trace i <-> cycle i), for cross-checking."""
    rec.peak_cpu_mem_bytes = _number_or_none(rank_summary.get("peak_rss_bytes"))
    profiler = rank_summary.get("profiler") if isinstance(rank_summary.get("profiler"), dict) else {}
    names = profiler.get("traces") if isinstance(profiler.get("traces"), list) else []
    cycles = profiler.get("cycles") if isinstance(profiler.get("cycles"), list) else []
    name = Path(rec.file).name
    if name in names and names.index(name) < len(cycles) and isinstance(cycles[names.index(name)], dict):
        cyc = cycles[names.index(name)]
        rec.key_averages = {k: _number_or_none(cyc.get(k)) for k in
                            ("self_cpu_time_total_us", "self_device_time_total_us", "conv2d_calls")}


def oom_record(run_dir: Path, summary: dict) -> RunRecord | None:
    """The run-level row of a run that ended out of memory (hpc/oom.py): a result with no timings."""
    oom = summary.get("oom")
    if summary.get("outcome") != "oom" or not isinstance(oom, dict):
        return None
    cfg = summary.get("config") or {}
    batch = oom.get("batch_size_per_gpu")
    return RunRecord(run_dir=str(run_dir), outcome="oom", arch=_config_value(cfg, "model", "arch", str),
                     batch_size_per_gpu=batch if _is_count(batch) else None, gpus=summary.get("world_size"),
                     data_fraction=_number_or_none(_config_value(cfg, "data", "fraction", (int, float))), oom=oom)


def _config_value(cfg: dict, section: str, key: str, kind) -> Any:
    body = cfg.get(section)
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _breakdown_sum(recs: list[TraceRecord], key: str) -> float | None:
    return _sum_or_none([r.temporal_breakdown_us[key] if r.temporal_breakdown_us else None for r in recs])


def rank_totals(records: list[TraceRecord], steps_per_epoch: dict | None = None) -> list[RankTotals]:
    """Fold each rank's traces (one per profiling cycle) into one: sums of counts and times, peaks' max."""
    by_rank: dict[Any, list[TraceRecord]] = {}
    for rec in records:
        by_rank.setdefault(rec.rank, []).append(rec)
    totals = []
    for rank, recs in by_rank.items():
        step_means = [r.step_time_us_mean for r in recs if r.step_time_us_mean is not None]
        totals.append(RankTotals(
            rank=rank, steps=sum(r.steps for r in recs), steps_per_epoch=(steps_per_epoch or {}).get(rank),
            cpu_time_us=_sum_or_none([r.cpu_time_us for r in recs]),
            cuda_time_us=_sum_or_none([r.cuda_time_us for r in recs]),
            gpu_busy_us=_sum_or_none([r.gpu_busy_us for r in recs]),
            kernel_calls=_sum_or_none([r.kernel_calls for r in recs]),
            comm_time_us=_sum_or_none([r.comm_time_us for r in recs]),
            step_time_us_mean=sum(step_means) / len(step_means) if step_means else None,
            peak_gpu_mem_bytes=_max_or_none([r.peak_gpu_mem_bytes for r in recs]),
            peak_gpu_reserved_bytes=_max_or_none([r.peak_gpu_reserved_bytes for r in recs]),
            peak_cpu_mem_bytes=_max_or_none([r.peak_cpu_mem_bytes for r in recs]),
            **{k: _breakdown_sum(recs, f"{k}") for k in ("computation_us", "communication_us", "memory_us",
                                                          "idle_us", "span_us")}))
    return totals


def steps_per_epoch_by_rank(summary: dict | None) -> dict:
    """Optimizer steps per epoch of each rank: as recorded, else from its data and batch (older runs:
    the sampler gives each rank ceil(images / ranks) images)."""
    out = {}
    for r in (summary or {}).get("ranks", []):
        value = r.get("steps_per_epoch")
        if not _is_count(value):
            images, world, batch = r.get("train_images"), r.get("world_size"), r.get("batch_size_per_gpu")
            ok = all(type(v) is int and v > 0 for v in (images, world, batch))
            value = math.ceil(math.ceil(images / world) / batch) if ok else None
        out[r["rank"]] = value
    return out


def run_record(run_dir: Path, records: list[TraceRecord], summary: dict | None) -> RunRecord:
    ranks = rank_totals(records, steps_per_epoch_by_rank(summary))
    cfg = (summary or {}).get("config") or {}
    first = ((summary or {}).get("ranks") or [{}])[0]
    run = RunRecord(
        run_dir=str(run_dir), traces=len(records), ranks=len(ranks),
        arch=_config_value(cfg, "model", "arch", str),
        batch_size_per_gpu=first.get("batch_size_per_gpu") if _is_count(first.get("batch_size_per_gpu")) else None,
        gpus=(summary or {}).get("world_size") or len(ranks),
        data_fraction=_number_or_none(_config_value(cfg, "data", "fraction", (int, float))),
        images_per_s=_number_or_none(first.get("global_images_per_s")),
        # no summary.json: the run crashed (or, in a live sweep, is still running)
        outcome="done" if first.get("complete") else ("stopped" if summary else "unfinished"),
        epoch_time_s=epoch_time_s(run_dir / "metrics.jsonl"), step_skew_us=step_skew_us(records),
        allreduce_busbw_GBps=_mean_or_none([_all_reduce(r, "busbw_GBps") for r in records]),
        allreduce_bytes_per_step=_mean_or_none([_all_reduce_bytes_per_step(r) for r in records]))
    for name in SPREAD_FIELDS:
        setattr(run, name, Spread.of([getattr(r, name) for r in ranks]))
    step_times = [r.step_time_us_mean for r in ranks if r.step_time_us_mean]
    run.rank_imbalance = max(step_times) / min(step_times) if len(step_times) > 1 else (1.0 if step_times else None)
    run.straggler_rank, run.straggler_share = straggler(records)
    return run


def _mean_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _all_reduce(rec: TraceRecord, key: str) -> Any:
    return next((c[key] for c in rec.collectives or [] if c["kind"] == "all_reduce"), None)


def _all_reduce_bytes_per_step(rec: TraceRecord) -> float | None:
    per_call, calls = _all_reduce(rec, "bytes_per_call"), _all_reduce(rec, "calls")
    return per_call * calls / rec.steps if per_call is not None and rec.steps else None


def metrics_records(metrics: Path):
    """The records of a run's metrics.jsonl, one mapping at a time; lines that are not JSON objects
    (a line cut off by a kill) are skipped, and a missing file has none."""
    try:
        with open(metrics, errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield rec
    except OSError:
        return


def epoch_time_s(metrics: Path) -> float | None:
    """The mean measured epoch wall time of the run's `epoch` records (metrics.jsonl), or None."""
    return _mean_or_none([_number_or_none(r.get("epoch_time_s")) for r in metrics_records(metrics)
                          if r.get("kind") == "epoch"])


def _by_rank_and_step(records: list[TraceRecord], values) -> dict[Any, dict[int, Any]]:
    """{rank: {ProfilerStep number: value}} from each trace's per-step lists."""
    out: dict[Any, dict[int, Any]] = {}
    for rec in records:
        out.setdefault(rec.rank, {}).update(zip(rec.step_numbers, values(rec) or []))
    return out


def step_skew_us(records: list[TraceRecord]) -> float | None:
    """Mean over the profiled steps all ranks have of (slowest rank's step time - fastest rank's)."""
    by_rank = _by_rank_and_step(records, lambda r: r.step_time_us)
    if len(by_rank) < 2:
        return None
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    skews = [max(s[n] for s in by_rank.values()) - min(s[n] for s in by_rank.values()) for n in common]
    return sum(skews) / len(skews) if skews else None


def straggler(records: list[TraceRecord]) -> tuple[Any, float | None]:
    """The rank that launches a collective last most often (each rank's launch time measured from its
    own step start, so clocks need not agree across nodes), and the share of collectives it was last."""
    by_rank = _by_rank_and_step(records, lambda r: r.collective_launch_us)
    if len(by_rank) < 2:
        return None, None
    last: Counter = Counter()
    for n in set.intersection(*(set(steps) for steps in by_rank.values())):
        launches = {rank: steps[n] for rank, steps in by_rank.items()}
        for j in range(min(len(v) for v in launches.values())):
            last[max(launches, key=lambda rank: launches[rank][j])] += 1
    if not last:
        return None, None
    rank, count = last.most_common(1)[0]
    return rank, count / sum(last.values())


def analyze_sweep(sweep_dir: Path) -> tuple[list[TraceRecord], list[RunRecord]]:
    """Per-trace records of every point and one row per point (data fraction x batch x GPUs)."""
    traces: list[TraceRecord] = []
    rows: list[RunRecord] = []
    points = read_index(sweep_dir / "index.json")
    files = {p["run_dir"]: run_traces(sweep_dir / p["run_dir"]) for p in points}
    by_file = {rec.file: rec for rec in analyze_files([f for fs in files.values() for f in fs])}  # all cores at once
    for point in points:
        run_dir = sweep_dir / point["run_dir"]
        recs, run = analyze_run(run_dir, [by_file[str(f)] for f in files[point["run_dir"]] if str(f) in by_file])
        for rec in recs:
            rec.point = {k: point.get(k) for k in ("data_fraction", "batch_size", "gpus")}
        traces.extend(recs)
        if run is None:
            warn(f"{run_dir}: no usable trace for point {point.get('data_fraction')}/{point.get('batch_size')}/"
                 f"{point.get('gpus')}")
            continue
        run.data_fraction, run.batch_size_per_gpu, run.gpus = point["data_fraction"], point["batch_size"], point["gpus"]
        run.nodes = point["nodes"] if _is_count(point.get("nodes")) and point["nodes"] > 0 else None
        job_id = point.get("job_id")
        run.job_id = str(job_id) if type(job_id) in (str, int) else None
        rows.append(run)
    add_scaling(rows)
    rows.sort(key=lambda r: (-(r.data_fraction or 0), r.batch_size_per_gpu or 0, r.nodes or 1, r.gpus or 0))
    return traces, rows


POINT_FIELDS = {"data_fraction": (int, float), "batch_size": int, "gpus": int}


def read_index(path: Path) -> list[dict]:
    """The points of a sweep's index.json; a point with a missing or mistyped field, or a run
    directory outside the sweep directory, is warned about and skipped."""
    index = _read_json(path)
    if index is None:
        return []
    if not isinstance(index, dict) or not isinstance(index.get("points"), list):
        warn(f"{path}: ignored: expected a mapping with a 'points' list")
        return []
    points = []
    for i, point in enumerate(index["points"]):
        problem = _point_problem(point)
        if problem:
            warn(f"{path}: points[{i}] skipped: {problem}")
        else:
            points.append(point)
    return points


def _point_problem(point: Any) -> str | None:
    if not isinstance(point, dict):
        return f"not a mapping ({type(point).__name__})"
    run_dir = point.get("run_dir")
    if not isinstance(run_dir, str) or not run_dir or Path(run_dir).is_absolute() or ".." in Path(run_dir).parts:
        return f"run_dir {str(run_dir)[:80]!r} is not a directory name inside the sweep"
    for key, kind in POINT_FIELDS.items():
        value = point.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            return f"{key} {str(value)[:40]!r} is not a positive number"
    return None


def add_scaling(rows: list[RunRecord]) -> None:
    """Speed-up and scaling efficiency against the 1-GPU row of the same data fraction and batch size,
    where the time went (`loss_us`), and what the scaling model predicts from the run's own numbers.

    Speed-up is the ratio of global throughput (images/s) when the summary gives it, else of step time
    (per-GPU batch fixed, so the same work per step per GPU: global throughput ~ gpus / step time)."""
    base = {(r.data_fraction, r.batch_size_per_gpu): r for r in rows if r.gpus == 1 and (r.nodes or 1) == 1}
    for r in rows:
        b = base.get((r.data_fraction, r.batch_size_per_gpu))
        speedup = None
        total_gpus = r.gpus * (r.nodes or 1) if r.gpus else None
        if b is not None and total_gpus:
            if r.images_per_s and b.images_per_s:
                speedup = r.images_per_s / b.images_per_s
            elif r.step_time_us_mean.max and b.step_time_us_mean.max:
                speedup = total_gpus * b.step_time_us_mean.max / r.step_time_us_mean.max
        r.speedup = speedup
        r.scaling_efficiency = speedup / total_gpus if speedup is not None else None
        if b is not None and b is not r:
            r.loss_us = efficiency_loss_us(r, b)
            r.predicted_efficiency = predicted_efficiency(r, b)


def step_parts_us(r: RunRecord) -> dict[str, float] | None:
    """A run's step time (its slowest rank's) in parts that add up to it: the ranks' mean per-step
    computation, exposed communication and memory time on the device, the rest of the mean step
    (`idle`: the device waiting on the host, on data, on other ranks), and the slowest rank's excess
    over the mean (`imbalance`)."""
    comp, comm, mem = r.computation_us_per_step.mean, r.communication_us_per_step.mean, r.memory_us_per_step.mean
    mean, slowest = r.step_time_us_mean.mean, r.step_time_us_mean.max
    if None in (comp, comm, mem, mean, slowest):
        return None
    return {"computation": comp, "communication": comm, "memory": mem, "idle": mean - comp - comm - mem,
            "imbalance": slowest - mean}


def efficiency_loss_us(r: RunRecord, base: RunRecord) -> dict[str, float] | None:
    """Per part, how much longer a step takes than at the 1-GPU point (same fraction, same per-GPU
    batch); the parts add up to `total`, the measured step-time difference. None without device data."""
    mine, theirs = step_parts_us(r), step_parts_us(base)
    if mine is None or theirs is None:
        return None
    loss = {k: mine[k] - theirs[k] for k in mine}
    loss["total"] = r.step_time_us_mean.max - base.step_time_us_mean.max
    return loss


def predicted_efficiency(r: RunRecord, base: RunRecord) -> float | None:
    """hpc.scaling's model, fed with the 1-GPU point's step time and this run's measured gradient
    bytes per step and all-reduce bus bandwidth."""
    from hpc.scaling import scaling_prediction

    if not (base.step_time_us_mean.max and r.allreduce_busbw_GBps and r.allreduce_bytes_per_step and r.gpus):
        return None
    measured = {"intra_node": r.allreduce_busbw_GBps, "inter_node": r.allreduce_busbw_GBps}
    return scaling_prediction(base.step_time_us_mean.max / 1e6, r.allreduce_bytes_per_step, r.gpus, r.nodes or 1,
                              busbw_gbs=measured)["efficiency"]
