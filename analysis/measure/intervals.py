"""Interval arithmetic on numpy arrays of starts and ends (µs): merged segments, union, overlap."""

from __future__ import annotations

import numpy as np


def segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint sorted segments (vectorised)."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > running_end[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def union_us(starts: np.ndarray, ends: np.ndarray) -> float:
    seg_s, seg_e = segments(starts, ends)
    return float((seg_e - seg_s).sum())


def overlap_us(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """|union(a) ∩ union(b)| = |union(a)| + |union(b)| - |union(a ∪ b)|."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    both = (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return union_us(*a) + union_us(*b) - union_us(*both)
