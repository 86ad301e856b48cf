"""Two profiles side by side, per step, and the term that accounts for most of their difference.

A `Profile` is one rank's traces folded per profiled step (a trace without `ProfilerStep#` counts as
one step, said in `note`): device time by kernel class, kernel calls, the host's launch time and the
device's idle split, every operator and kernel, collectives, peak memory. `compare(a, b)` sets two
side by side (a difference for every figure) and `explain` names the largest term.

The terms of a step (`step_terms`) add up to the device timeline's span per step: the temporal
breakdown (analysis/measure/device.py) with its computation split by kernel class (each class's share of the
compute kernels' summed time) and its idle time split as the idle breakdown splits the busiest
stream's gaps (waiting for the host to launch, and the rest). A trace with no device activity (a CPU
run) has the operators' self CPU time as its terms instead. No torch import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

import msgspec

from analysis.measure.kernels import KERNEL_CLASSES
from analysis.records import TraceRecord, max_present
from hpc.core.files import JsonObject

COMPUTE_CLASSES = [c for c in KERNEL_CLASSES if c != "communication"]
TOP_CHANGES = 10  # operators and kernels listed by change


@dataclass
class CollectiveSum:
    """One kind of collective per step: calls, bytes and time summed, the best bus bandwidth seen."""

    calls: float = 0.0
    bytes: float = 0.0
    time_us: float = 0.0
    busbw_GBps: float | None = None


COLLECTIVE_FIELDS = tuple(f.name for f in fields(CollectiveSum))


@dataclass(frozen=True)
class Profile:
    """One side of a comparison: its traces folded, every figure per step."""

    label: str
    files: list[str]
    steps: int
    note: str | None = None
    step_time_us: float | None = None  # mean ProfilerStep duration (the CPU's view of a step)
    terms_us: dict[str, float] = field(default_factory=dict)  # what a step's time is made of (module doc)
    kernel_calls: float | None = None
    kernel_calls_by_class: dict[str, float] = field(default_factory=dict)
    kernel_time_by_class_us: dict[str, float] = field(default_factory=dict)
    launch_us: float | None = None  # host time in runtime calls
    idle_us: dict[str, float] = field(default_factory=dict)  # host_wait / kernel_wait / other
    ops: dict[str, list[float]] = field(default_factory=dict)  # name -> [calls, self CPU µs, self device µs]
    kernels: dict[str, list[float]] = field(default_factory=dict)  # name -> [calls, µs]
    collectives: dict[str, CollectiveSum] = field(default_factory=dict)
    peak_gpu_mem_bytes: int | None = None
    peak_cpu_mem_bytes: int | None = None


def _add(into: dict[str, float], items: Iterable[tuple[str, float | None]], scale: float) -> None:
    for k, v in items:
        if v is not None:
            into[k] = into.get(k, 0.0) + v * scale


def _add_lists(into: dict[str, list[float]], key: str, values: list[float], scale: float) -> None:
    row = into.setdefault(key, [0.0] * len(values))
    for i, v in enumerate(values):
        row[i] += (v or 0.0) * scale


def profile(label: str, records: list[TraceRecord]) -> Profile:
    """The records (one rank's cycles, analysed with every operator and kernel: analyze_trace(top_n=None))
    folded per step."""
    steps = sum(r.steps for r in records)
    note = None if all(r.steps for r in records) else "a trace without ProfilerStep# counts as one step"
    n = steps + sum(1 for r in records if not r.steps)
    per = 1.0 / n
    terms: dict[str, float] = {}
    calls: dict[str, float] = {}
    time: dict[str, float] = {}
    idle: dict[str, float] = {}
    ops: dict[str, list[float]] = {}
    kernels: dict[str, list[float]] = {}
    colls: dict[str, CollectiveSum] = {}
    kernel_calls: float | None = None
    launch: float | None = None
    for r in records:
        _add(terms, step_terms(r).items(), per)
        _add(calls, (r.kernel_calls_by_class or {}).items(), per)
        _add(time, (r.kernel_time_by_class_us or {}).items(), per)
        _add(idle, ((k[:-3], v) for k, v in (r.idle_breakdown_us or {}).items() if k != "stream"), per)
        for op in r.top_ops:
            _add_lists(ops, op["name"], [op["calls"], op["self_cpu_us"], op["self_device_us"]], per)
        for k in r.top_kernels or []:
            _add_lists(kernels, k["name"], [k["calls"], k["total_us"]], per)
        for c in r.collectives or []:
            row = colls.setdefault(c["kind"], CollectiveSum())
            row.calls += c["calls"] * per
            row.bytes += (c["bytes_per_call"] or 0.0) * c["calls"] * per
            row.time_us += c["time_us"] * per
            row.busbw_GBps = c["busbw_GBps"] if row.busbw_GBps is None else max(row.busbw_GBps, c["busbw_GBps"] or 0)
        if r.kernel_calls is not None:
            kernel_calls = (kernel_calls or 0.0) + r.kernel_calls * per
        if r.runtime_us is not None:
            launch = (launch or 0.0) + r.runtime_us * per
    return Profile(
        label=label,
        files=[r.file for r in records],
        steps=n,
        note=note,
        step_time_us=sum(sum(r.step_time_us) for r in records) / steps if steps else None,
        terms_us=terms,
        kernel_calls=kernel_calls,
        kernel_calls_by_class=calls,
        kernel_time_by_class_us=time,
        launch_us=launch,
        idle_us=idle,
        ops=ops,
        kernels=kernels,
        collectives=colls,
        peak_gpu_mem_bytes=max_present(r.peak_gpu_mem_bytes for r in records),
        peak_cpu_mem_bytes=max_present(r.peak_cpu_mem_bytes for r in records),
    )


def step_terms(r: TraceRecord) -> dict[str, float]:
    """What the trace's time is made of (µs over the whole trace; the module doc says how)."""
    tb = r.temporal_breakdown_us
    if not tb:  # no device: the operators' self CPU time
        return {f"cpu: {op['name']}": op["self_cpu_us"] for op in r.top_ops}
    by_class = r.kernel_time_by_class_us or {}
    compute_sum = sum(by_class.get(c, 0.0) for c in COMPUTE_CLASSES)
    terms = {
        c: tb["computation_us"] * by_class.get(c, 0.0) / compute_sum if compute_sum else 0.0 for c in COMPUTE_CLASSES
    }
    terms["communication (exposed)"] = tb["communication_us"]
    terms["memory copies (exposed)"] = tb["memory_us"]
    idle = r.idle_breakdown_us or {}
    gaps = sum(idle.get(k, 0.0) for k in ("host_wait_us", "kernel_wait_us", "other_us"))
    host_share = idle.get("host_wait_us", 0.0) / gaps if gaps else 0.0
    terms["idle: waiting for the host"] = tb["idle_us"] * host_share
    terms["idle: other"] = tb["idle_us"] * (1.0 - host_share)
    return terms


def delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def changes(a: dict[str, list[float]], b: dict[str, list[float]], at: int, n: int = TOP_CHANGES) -> list[JsonObject]:
    """The n names whose value (index `at` of their row) changed most, A's and B's and the difference."""
    none = [0.0] * (at + 1)
    moved = sorted(
        ((b.get(k, none), a.get(k, none), k) for k in set(a) | set(b)), key=lambda m: (-abs(m[0][at] - m[1][at]), m[2])
    )
    return [
        {"name": k, "calls_a": ra[0], "calls_b": rb[0], "us_a": ra[at], "us_b": rb[at], "delta_us": rb[at] - ra[at]}
        for rb, ra, k in moved[:n]
    ]


def side_by_side(a: Mapping[str, float], b: Mapping[str, float]) -> list[dict]:
    """Each key of either mapping: A, B and B - A (a key missing on one side counts as 0 there)."""
    keys = list(dict.fromkeys([*a, *b]))
    return [{"name": k, "a": a.get(k, 0.0), "b": b.get(k, 0.0), "delta": b.get(k, 0.0) - a.get(k, 0.0)} for k in keys]


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """Why B's step differs from A's: the term that changed most (None: none did), by how much, its share
    of the change (of the step's terms, or of the time that moved between them), the step's total change,
    and the sentence that says it."""

    term: str | None
    delta_us: float
    share_pct: float | None
    total_delta_us: float
    sentence: str


def explain(a: Profile, b: Profile) -> Explanation:
    """The term with the largest change and its share of the total change of the step's terms. Where the
    total does not change, time moved between terms: the share is of all the terms' changes together."""
    rows = side_by_side(a.terms_us, b.terms_us)
    total_a, total_b = sum(r["a"] for r in rows), sum(r["b"] for r in rows)
    total = total_b - total_a
    moved = sum(abs(r["delta"]) for r in rows)
    rows.sort(key=lambda r: (-abs(r["delta"]), r["name"]))
    scale = max(abs(total_a), abs(total_b), 1e-9)
    if not rows or moved <= 1e-9 * scale:
        return Explanation(term=None, delta_us=0.0, share_pct=None, total_delta_us=total, sentence=_same(a, b))
    top = rows[0]
    share = 100.0 * top["delta"] / total if abs(total) > 0.01 * moved else 100.0 * abs(top["delta"]) / moved
    whole = "the step's terms" if abs(total) > 0.01 * moved else "the time that moved between terms"
    sentence = (
        f"{b.label} vs {a.label}: {_what(rows)} {_ms(total_a)} -> {_ms(total_b)} ms per step ({_signed(total)} ms); "
        f"most of it is {top['name']}: {_signed(top['delta'])} ms, {share:.0f}% of {whole}"
    )
    if abs(total) <= 0.01 * moved and len(rows) > 1:
        sentence += f", against {rows[1]['name']}: {_signed(rows[1]['delta'])} ms"
    return Explanation(
        term=top["name"], delta_us=top["delta"], share_pct=share, total_delta_us=total, sentence=sentence
    )


def _what(rows: list[dict]) -> str:
    """What the terms add up to: operators' self CPU time (a CPU run), else the device timeline's span."""
    return "CPU time" if all(r["name"].startswith("cpu: ") for r in rows) else "device timeline"


def _same(a: Profile, b: Profile) -> str:
    return f"{b.label} vs {a.label}: no difference in what a step is made of"


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f}"


def _signed(us: float) -> str:
    return f"{us / 1e3:+.3f}"


def compare(a: Profile, b: Profile) -> JsonObject:
    """Everything side by side, per step, and the explanation (the command renders it)."""
    return {
        "a": {"label": a.label, "files": a.files, "steps": a.steps, "note": a.note},
        "b": {"label": b.label, "files": b.files, "steps": b.steps, "note": b.note},
        "explanation": msgspec.to_builtins(explain(a, b)),
        "summary": side_by_side(_scalars(a), _scalars(b)),
        "terms_us": sorted(side_by_side(a.terms_us, b.terms_us), key=lambda r: -abs(r["delta"])),
        "kernel_time_by_class_us": side_by_side(a.kernel_time_by_class_us, b.kernel_time_by_class_us),
        "kernel_calls_by_class": side_by_side(a.kernel_calls_by_class, b.kernel_calls_by_class),
        "idle_us": side_by_side(a.idle_us, b.idle_us),
        "top_operators": changes(a.ops, b.ops, 2 if _has_device(a, b) else 1),
        "top_kernels": changes(a.kernels, b.kernels, 1),
        "collectives": _collectives(a, b),
    }


def _has_device(a: Profile, b: Profile) -> bool:
    return bool(a.kernel_time_by_class_us or b.kernel_time_by_class_us)


def _scalars(p: Profile) -> dict[str, float]:
    return {
        k: v
        for k, v in {
            "step_time_us": p.step_time_us,
            "kernel_calls": p.kernel_calls,
            "launch_us": p.launch_us,
            "peak_gpu_mem_bytes": p.peak_gpu_mem_bytes,
            "peak_cpu_mem_bytes": p.peak_cpu_mem_bytes,
        }.items()
        if v is not None
    }


def _collectives(a: Profile, b: Profile) -> list[dict]:
    rows = []
    for kind in dict.fromkeys([*a.collectives, *b.collectives]):
        ca, cb = a.collectives.get(kind), b.collectives.get(kind)
        rows.append(
            {
                "kind": kind,
                **{f"{k}_a": getattr(ca, k) if ca else None for k in COLLECTIVE_FIELDS},
                **{f"{k}_b": getattr(cb, k) if cb else None for k in COLLECTIVE_FIELDS},
                "delta_time_us": (cb.time_us if cb else 0.0) - (ca.time_us if ca else 0.0),
            }
        )
    return rows
