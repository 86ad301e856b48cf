"""Human units for what a person reads (text and Markdown tables, report.html): times in s or ms, sizes in
GiB or MiB, shares in %, the unit in the column's header. The records, JSON and CSV keep their raw
numbers (µs, bytes, fractions) under their unchanged column names.

A column's unit follows from its name (`_us`, `_ms`, `_s`, `_bytes`, `_pct`, `_share`, `_efficiency`,
`_GBps`) and, for times and sizes, from its largest value, so that one column has one unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

Formatter = Callable[[object], str]  # a table cell's value (a number, a word, None) as shown

_TIME_US = re.compile(r"^(.*)_us(_.*)?$")
_BYTES = re.compile(r"^(.*)_bytes(_.*)?$")
_FRACTION = re.compile(r"^(.*_(?:share|efficiency))(_.*)?$")
_FIXED = {"_ms": "ms", "_s": "s", "_pct": "%", "_GBps": "GB/s"}


def number(value: object) -> str:
    """A number as a person reads it: three significant figures, no exponent, '-' for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) and abs(value) >= 1000:
        return f"{value:,}"
    magnitude = abs(value)
    digits = 2 if magnitude < 10 else 1 if magnitude < 100 else 0
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def _scaled(scale: float) -> Formatter:
    return lambda v: number(v / scale) if isinstance(v, (int, float)) and not isinstance(v, bool) else number(v)


def _largest(values: Iterable[object]) -> float:
    present = [abs(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return max(present, default=0.0)


def human_column(name: str, values: list[object]) -> tuple[str, Formatter]:
    """(header with its unit, how each value is shown) for a column and its values."""
    if name.endswith("_per_s"):  # a rate (images/s) is shown as it is
        return name, number
    if name == "data_fraction":  # a sweep axis, read as the study writes it (1, 0.5, 0.1)
        return name, lambda v: f"{v:g}" if isinstance(v, float) else number(v)
    if m := _TIME_US.match(name):
        base = m.group(1) + (m.group(2) or "")
        return (f"{base} (s)", _scaled(1e6)) if _largest(values) >= 1e6 else (f"{base} (ms)", _scaled(1e3))
    if m := _BYTES.match(name):
        base = m.group(1) + (m.group(2) or "")
        return (f"{base} (GiB)", _scaled(2**30)) if _largest(values) >= 2**30 else (f"{base} (MiB)", _scaled(2**20))
    if m := _FRACTION.match(name):
        return f"{m.group(1) + (m.group(2) or '')} (%)", _scaled(0.01)
    for suffix, unit in _FIXED.items():
        if name.endswith(suffix):
            return f"{name[: -len(suffix)]} ({unit})", number
    return name, number


def human_columns(rows: Sequence[Mapping[str, object]], columns: list[str]) -> list[tuple[str, Formatter]]:
    return [human_column(c, [r.get(c) for r in rows]) for c in columns]
