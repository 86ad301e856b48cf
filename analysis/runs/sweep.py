"""A sweep: every point's run folded (analysis/runs/fold.py), then each multi-GPU point set against the 1-GPU
point of the same data fraction and per-GPU batch: speed-up, scaling efficiency, where the extra step
time went (`loss_us`, parts that add up to the measured difference), and what the scaling model
(hpc/placement/scaling.py) predicts from the point's own measured bandwidth.

A sweep directory is what `hpc.study run` writes (hpc/core/rundir.py): index.json
names each point's run directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from analysis.read.discover import Warnings, run_traces
from analysis.records import RunRow, TracePoint, TraceRecord
from hpc.core.rundir import SweepIndex, SweepPaths, read_sweep_index
from hpc.placement.scaling import scaling_prediction

# The pipeline's own (analysis/pipeline.py): every file's record at once, and one run from its records
AnalyzeFiles = Callable[[Iterable[Path], Warnings], list[TraceRecord]]
AnalyzeRun = Callable[[Path, Warnings, list[TraceRecord]], tuple[list[TraceRecord], RunRow | None]]


def fold_sweep(
    sweep_dir: Path, warnings: Warnings, analyze_files: AnalyzeFiles, analyze_run: AnalyzeRun
) -> tuple[list[TraceRecord], list[RunRow]]:
    """Per-trace records of every point and one row per point (data fraction x batch x GPUs x nodes), each
    point's traces analysed together (`analyze_files`) and folded into its run (`analyze_run`), in order;
    not yet set against their 1-GPU points (with_scaling)."""
    sweep = SweepPaths(sweep_dir)
    traces: list[TraceRecord] = []
    rows: list[RunRow] = []
    index = read_sweep_index(sweep.index, warnings.append)
    points, replicas = index.points, replica_axis(index)
    files = {p.run_dir: run_traces(sweep.run(p.run_dir).root) for p in points}
    by_file = {rec.file: rec for rec in analyze_files([f for fs in files.values() for f in fs], warnings)}
    for point in points:
        run_dir = sweep.run(point.run_dir).root
        recs, run = analyze_run(run_dir, warnings, [by_file[str(f)] for f in files[point.run_dir] if str(f) in by_file])
        words = swept_words(point.values, replicas)
        where = TracePoint(point.data_fraction, point.batch_size, point.gpus, words["swept"])
        traces.extend(dataclasses.replace(rec, point=where) for rec in recs)
        if run is None:
            warnings.append(
                f"{run_dir}: no usable trace for point {point.data_fraction}/{point.batch_size}/{point.gpus}"
            )
            continue
        share, wall_s = point.node_share, run.wall_time_s
        node_hours = wall_s / 3600 * share if wall_s is not None and share is not None else None
        rows.append(
            dataclasses.replace(
                run,
                data_fraction=point.data_fraction,
                batch_size_per_gpu=point.batch_size,
                gpus=point.gpus,
                nodes=point.nodes,
                **words,
                job_id=point.job or None,
                qos=point.qos,
                metric_wanted=index.metric,
                metric_mode=index.mode,
                node_hours=node_hours,
            )
        )
    rows.sort(
        key=lambda r: (r.swept or "", -(r.data_fraction or 0), r.batch_size_per_gpu or 0, r.nodes or 1, r.gpus or 0)
    )
    return traces, rows


def replica_axis(index: SweepIndex) -> str | None:
    """The sweep's replica axis (sweep.replicas, as index.json's header records the sweep), where its points
    have it."""
    named = index.replicas
    return named if named is not None and any(named in p.values for p in index.points) else None


def swept_words(values: dict, replicas: str | None) -> dict[str, Any]:
    """A point's values as the tables say them (swept), without its replica (series), and its replica."""

    def words(keys: list[str]) -> str | None:
        return ", ".join(f"{k}={values[k]}" for k in keys) or None

    return {
        "values": dict(values) or None,
        "swept": words(list(values)),
        "series": words([k for k in values if k != replicas]),
        "replica": words([replicas]) if replicas is not None and replicas in values else None,
    }


def with_scaling(rows: list[RunRow]) -> list[RunRow]:
    """The rows with speed-up and scaling efficiency against the 1-GPU row of the same data fraction and
    batch size, where the time went (`loss_us`), and what the scaling model predicts from the run's own
    numbers.

    Speed-up is the ratio of global throughput (images/s) when the summary gives it, else of step time
    (per-GPU batch fixed, so the same work per step per GPU: global throughput ~ gpus / step time)."""
    base = {
        (r.data_fraction, r.batch_size_per_gpu, r.swept): r for r in rows if r.gpus == 1 and (r.nodes or 1) == 1
    }  # of the same values of the sweep's other axes too: lr=0.1 on 4 GPUs against lr=0.1 on 1
    out = []
    for r in rows:
        b = base.get((r.data_fraction, r.batch_size_per_gpu, r.swept))
        speedup = None
        total_gpus = r.gpus * (r.nodes or 1) if r.gpus else None
        if b is not None and total_gpus:
            if r.images_per_s and b.images_per_s:
                speedup = r.images_per_s / b.images_per_s
            elif r.step_time_us_mean.max and b.step_time_us_mean.max:
                speedup = total_gpus * b.step_time_us_mean.max / r.step_time_us_mean.max
        compared = b is not None and b is not r
        out.append(
            dataclasses.replace(
                r,
                speedup=speedup,
                scaling_efficiency=speedup / total_gpus if speedup is not None and total_gpus else None,
                loss_us=efficiency_loss_us(r, b) if compared and b else r.loss_us,
                predicted_efficiency=predicted_efficiency(r, b) if compared and b else r.predicted_efficiency,
            )
        )
    return out


def step_parts_us(r: RunRow) -> dict[str, float] | None:
    """A run's step time (its slowest rank's) in parts that add up to it: the ranks' mean per-step
    computation, exposed communication and memory time on the device, the rest of the mean step
    (`idle`: the device waiting on the host, on data, on other ranks), and the slowest rank's excess
    over the mean (`imbalance`)."""
    comp = r.computation_us_per_step.mean
    comm = r.communication_us_per_step.mean
    mem = r.memory_us_per_step.mean
    mean, slowest = r.step_time_us_mean.mean, r.step_time_us_mean.max
    if comp is None or comm is None or mem is None or mean is None or slowest is None:
        return None
    return {
        "computation": comp,
        "communication": comm,
        "memory": mem,
        "idle": mean - comp - comm - mem,
        "imbalance": slowest - mean,
    }


def efficiency_loss_us(r: RunRow, base: RunRow) -> dict[str, float] | None:
    """Per part, how much longer a step takes than at the 1-GPU point (same fraction, same per-GPU
    batch); the parts add up to `total`, the measured step-time difference. None without device data."""
    mine, theirs = step_parts_us(r), step_parts_us(base)
    if mine is None or theirs is None or r.step_time_us_mean.max is None or base.step_time_us_mean.max is None:
        return None
    loss = {k: mine[k] - theirs[k] for k in mine}
    loss["total"] = r.step_time_us_mean.max - base.step_time_us_mean.max
    return loss


def predicted_efficiency(r: RunRow, base: RunRow) -> float | None:
    """The scaling model, fed with the 1-GPU point's step time and this run's measured gradient bytes per
    step and all-reduce bus bandwidth."""
    if not (base.step_time_us_mean.max and r.allreduce_busbw_GBps and r.allreduce_bytes_per_step and r.gpus):
        return None
    measured = {"intra_node": r.allreduce_busbw_GBps, "inter_node": r.allreduce_busbw_GBps}
    prediction = scaling_prediction(
        base.step_time_us_mean.max / 1e6, r.allreduce_bytes_per_step, r.gpus, r.nodes or 1, busbw_gbs=measured
    )
    return float(prediction["efficiency"])
