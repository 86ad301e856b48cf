"""Per-trace records -> per-run and per-sweep tables; CSV, Markdown, JSON, text; the study's figures.

A run directory is what hpc.train writes (traces/, summary.json, config.yaml); a sweep directory is
what `hpc.submit --sweep` writes (index.json naming each point's run directory).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable

from analysis.trace import TraceError, analyze_trace

TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.json", "*.json.gz")
# Numbers summed over a rank's profiling cycles (a rank may write several traces); peaks take the max.
_SUMMED = ("steps", "cpu_time_us", "cuda_time_us", "gpu_busy_us", "kernel_calls", "comm_time_us")
_PEAKS = ("peak_gpu_mem_bytes", "peak_gpu_reserved_bytes", "peak_cpu_mem_bytes")


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


def analyze_files(paths: Iterable[Path]) -> list[dict]:
    records = []
    for path in paths:
        try:
            rec = analyze_trace(path)
        except TraceError as e:
            warn(f"{path}: skipped: {e}")
            continue
        if rec["bad_events"]:
            warn(f"{path}: {rec['bad_events']} event(s) with mistyped fields skipped")
        records.append(rec)
    return records


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


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _max(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _sum_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def analyze_run(run_dir: Path) -> tuple[list[dict], dict | None]:
    """Per-trace records of a run (with the run's summary attached) and the run-level record."""
    traces_dir = run_dir / "traces" if (run_dir / "traces").is_dir() else run_dir
    records = analyze_files(find_traces(traces_dir))
    summary = read_summary(run_dir / "summary.json")
    by_rank_summary = {r["rank"]: r for r in (summary or {}).get("ranks", [])}
    for rec in records:
        s = by_rank_summary.get(rec["rank"])
        if s is None:
            continue
        rec["peak_cpu_mem_bytes"] = _number_or_none(s.get("peak_rss_bytes"))
        # The profiler's own totals for the same cycle, for cross-checking (trace i <-> cycle i).
        profiler = s.get("profiler") if isinstance(s.get("profiler"), dict) else {}
        names = profiler.get("traces") if isinstance(profiler.get("traces"), list) else []
        cycles = profiler.get("cycles") if isinstance(profiler.get("cycles"), list) else []
        name = Path(rec["file"]).name
        if name in names and names.index(name) < len(cycles) and isinstance(cycles[names.index(name)], dict):
            cyc = cycles[names.index(name)]
            rec["key_averages"] = {k: _number_or_none(cyc.get(k)) for k in
                                   ("self_cpu_time_total_us", "self_device_time_total_us", "conv2d_calls")}
    # A run that ran out of memory gets no timings: a trace it left covers an aborted window only.
    oom = oom_record(run_dir, summary) if isinstance(summary, dict) else None
    if oom is not None or not records:
        return records, oom
    return records, run_record(run_dir, records, summary)


def oom_record(run_dir: Path, summary: dict) -> dict | None:
    """The run-level row of a run that ended out of memory (hpc/oom.py): a result with no timings."""
    oom = summary.get("oom")
    if summary.get("outcome") != "oom" or not isinstance(oom, dict):
        return None
    cfg = summary.get("config") or {}
    batch = oom.get("batch_size_per_gpu")
    return {"run_dir": str(run_dir), "traces": 0, "ranks": 0, "outcome": "oom",
            "arch": _config_value(cfg, "model", "arch", str), "batch_size_per_gpu": batch if _is_count(batch) else None,
            "gpus": summary.get("world_size"),
            "data_fraction": _number_or_none(_config_value(cfg, "data", "fraction", (int, float))), "oom": oom}


def _config_value(cfg: dict, section: str, key: str, kind) -> Any:
    body = cfg.get(section)
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def run_record(run_dir: Path, records: list[dict], summary: dict | None) -> dict:
    ranks: dict[Any, dict] = {}
    for rec in records:  # fold several cycles of one rank into one
        r = ranks.setdefault(rec["rank"], {k: [] for k in _SUMMED + _PEAKS + ("step_time_us_mean",)})
        for k in _SUMMED + _PEAKS + ("step_time_us_mean",):
            r[k].append(rec.get(k))
    per_rank = {}
    for rank, r in ranks.items():
        per_rank[rank] = {k: _sum_or_none(r[k]) for k in _SUMMED}
        per_rank[rank].update({k: _max(r[k]) for k in _PEAKS})
        per_rank[rank]["step_time_us_mean"] = _mean(r["step_time_us_mean"])
        steps = per_rank[rank]["steps"]
        for k in ("cpu_time_us", "cuda_time_us", "kernel_calls"):
            v = per_rank[rank][k]
            per_rank[rank][f"{k}_per_step"] = v / steps if (v is not None and steps) else None
    out: dict[str, Any] = {"run_dir": str(run_dir), "traces": len(records), "ranks": len(per_rank)}
    for k in ("cpu_time_us", "cuda_time_us", "gpu_busy_us", "kernel_calls", "comm_time_us", "step_time_us_mean",
              "cpu_time_us_per_step", "cuda_time_us_per_step", "kernel_calls_per_step") + _PEAKS:
        values = [p.get(k) for p in per_rank.values()]
        out[f"{k}_mean"] = _mean(values)
        out[f"{k}_max"] = _max(values)
    step_times = [p["step_time_us_mean"] for p in per_rank.values() if p["step_time_us_mean"]]
    out["rank_imbalance"] = max(step_times) / min(step_times) if len(step_times) > 1 else (1.0 if step_times else None)
    cfg = (summary or {}).get("config") or {}
    first = ((summary or {}).get("ranks") or [{}])[0]
    out.update({
        "arch": _config_value(cfg, "model", "arch", str),
        "batch_size_per_gpu": first.get("batch_size_per_gpu") if _is_count(first.get("batch_size_per_gpu")) else None,
        "gpus": (summary or {}).get("world_size") or len(per_rank),
        "data_fraction": _number_or_none(_config_value(cfg, "data", "fraction", (int, float))),
        "images_per_s": _number_or_none(first.get("global_images_per_s")),
        "outcome": "done" if first.get("complete") else ("stopped" if summary else None),
    })
    return out


def analyze_sweep(sweep_dir: Path) -> tuple[list[dict], list[dict]]:
    """Per-trace records of every point and one row per point (data fraction x batch x GPUs)."""
    traces: list[dict] = []
    rows: list[dict] = []
    for point in read_index(sweep_dir / "index.json"):
        run_dir = sweep_dir / point["run_dir"]
        recs, run = analyze_run(run_dir)
        for rec in recs:
            rec["point"] = {k: point.get(k) for k in ("data_fraction", "batch_size", "gpus")}
        traces.extend(recs)
        if run is None:
            warn(f"{run_dir}: no usable trace for point {point.get('data_fraction')}/{point.get('batch_size')}/"
                 f"{point.get('gpus')}")
            continue
        run.update({"data_fraction": point.get("data_fraction"), "batch_size_per_gpu": point.get("batch_size"),
                    "gpus": point.get("gpus"), "job_id": point.get("job_id")})
        rows.append(run)
    add_scaling(rows)
    rows.sort(key=lambda r: (-(r["data_fraction"] or 0), r["batch_size_per_gpu"] or 0, r["gpus"] or 0))
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


def add_scaling(rows: list[dict]) -> None:
    """Speed-up and scaling efficiency against the 1-GPU row of the same data fraction and batch size.

    Speed-up is the ratio of global throughput (images/s) when the summary gives it, else of step time
    (per-GPU batch fixed, so the same work per step per GPU: global throughput ~ gpus / step time)."""
    base = {(r["data_fraction"], r["batch_size_per_gpu"]): r for r in rows if r["gpus"] == 1}
    for r in rows:
        b = base.get((r["data_fraction"], r["batch_size_per_gpu"]))
        speedup = None
        if b is not None:
            if r.get("images_per_s") and b.get("images_per_s"):
                speedup = r["images_per_s"] / b["images_per_s"]
            elif r.get("step_time_us_mean_max") and b.get("step_time_us_mean_max"):
                speedup = r["gpus"] * b["step_time_us_mean_max"] / r["step_time_us_mean_max"]
        r["speedup"] = speedup
        r["scaling_efficiency"] = speedup / r["gpus"] if speedup is not None and r["gpus"] else None


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------

TRACE_COLUMNS = ["file", "rank", "steps", "cpu_time_us", "cuda_time_us", "gpu_busy_us", "kernel_calls",
                 "peak_gpu_mem_bytes", "peak_gpu_reserved_bytes", "peak_cpu_mem_bytes", "comm_time_us",
                 "comm_overlap_pct"]
RUN_COLUMNS = ["arch", "data_fraction", "batch_size_per_gpu", "gpus", "outcome", "ranks", "step_time_us_mean_max",
               "rank_imbalance", "cpu_time_us_per_step_mean", "cuda_time_us_per_step_mean",
               "kernel_calls_per_step_mean", "peak_cpu_mem_bytes_max", "peak_gpu_mem_bytes_max", "images_per_s",
               "speedup", "scaling_efficiency"]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def rows_to_csv(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    return buf.getvalue()


def rows_to_markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def rows_to_table(rows: list[dict], columns: list[str]) -> str:
    cells = [[c for c in columns]] + [[_fmt(r.get(c)) if c != "file" else Path(str(r.get(c))).name
                                       for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in cells) + "\n"


def render(rows: list[dict], columns: list[str], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt == "csv":
        return rows_to_csv(rows, columns)
    if fmt == "md":
        return rows_to_markdown(rows, columns)
    return rows_to_table(rows, columns)


FIGURE_METRICS = [  # (key, title, y label, scale), in the study's order: Figures 1-15
    ("cpu_time_us_per_step_mean", "CPU runtime", "CPU time per step (ms)", 1e-3),
    ("cuda_time_us_per_step_mean", "CUDA runtime", "CUDA time per step (ms)", 1e-3),
    ("kernel_calls_per_step_mean", "Number of calls", "kernel calls per step", 1.0),
    ("peak_cpu_mem_bytes_max", "Maximum CPU memory", "peak CPU memory (GiB)", 1 / 2**30),
    ("peak_gpu_mem_bytes_max", "Maximum GPU memory", "peak GPU memory allocated (GiB)", 1 / 2**30),
]


def mark_oom(ax, oom_rows: list[dict]) -> None:
    """Points that ran out of memory: a red cross on the top edge at their batch size, labelled OOM."""
    for r in oom_rows:
        x = r["batch_size_per_gpu"]
        ax.plot([x], [1.0], marker="x", color="red", markersize=9, transform=ax.get_xaxis_transform(), clip_on=False)
        ax.annotate(f"OOM ({r['gpus']} GPU{'s' if r['gpus'] != 1 else ''})", (x, 1.0),
                    xycoords=ax.get_xaxis_transform(), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize=7, color="red")


def plot_sweep(rows: list[dict], out_dir: Path) -> list[Path]:
    """One PNG per (metric, data fraction): metric against batch size, one line per GPU count; plus
    scaling efficiency. Metrics a run does not have (CUDA time on CPU runs) are left out, not drawn as 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    fractions = sorted({r["data_fraction"] for r in rows if r["data_fraction"] is not None})
    gpus_values = sorted({r["gpus"] for r in rows})
    for key, title, ylabel, scale in FIGURE_METRICS:
        for fraction in fractions:
            sel = [r for r in rows if r["data_fraction"] == fraction and r.get(key) is not None]
            if not sel:
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            for g in gpus_values:
                pts = sorted((r["batch_size_per_gpu"], r[key] * scale) for r in sel if r["gpus"] == g)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{g} GPU{'s' if g > 1 else ''}")
            mark_oom(ax, [r for r in rows if r["data_fraction"] == fraction and r.get("outcome") == "oom"])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size per GPU")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title}, data fraction {fraction:g}")
            ax.grid(True, alpha=0.3)
            ax.legend()
            fig.tight_layout()
            path = out_dir / f"{key}_fraction{fraction:g}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
    sel = [r for r in rows if r.get("scaling_efficiency") is not None and r["gpus"] > 1]
    if sel:
        fig, ax = plt.subplots(figsize=(6, 4))
        for fraction in fractions:
            for g in gpus_values:
                pts = sorted((r["batch_size_per_gpu"], r["scaling_efficiency"]) for r in sel
                             if r["data_fraction"] == fraction and r["gpus"] == g)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"fraction {fraction:g}, {g} GPUs")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size per GPU")
        ax.set_ylabel("scaling efficiency vs 1 GPU")
        ax.set_title("Scaling efficiency")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "scaling_efficiency.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
