"""Peak memory by category, from torch's own memory profiler (profiler.memory_categories).

torch.profiler's memory profiler follows every tensor of a profiled cycle through the autograd graph
and the optimizer and names what it holds: parameter, gradient, optimizer state, activation, input,
temporary, autograd detail, or unknown. `export_memory_timeline` writes that timeline to a file (and is
deprecated in favour of the allocator's snapshot, which knows no categories); `at_peak` reads the same
timeline in memory (`MemoryProfileTimeline._coalesce_timeline`, what the export itself calls) and keeps
the moment the categories' total peaks: the bytes of each category then, and the study's five
(parameters, gradients, optimizer state, activations, other = input + temporary + autograd detail +
unknown). No public torch API gives the categories; the private one is isolated here, and a torch
without it records the reason instead of failing the run.

Cost: the memory profiler needs record_shapes, profile_memory and with_stack during the cycle (more
host time per operator) and builds its graph when the cycle ends (seconds for ResNet152: recorded in
each cycle as `memory_categories_s`).
"""

from __future__ import annotations

import logging

import torch

from hpc.core.files import JsonObject

log = logging.getLogger(__name__)

STUDY_CATEGORIES = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer_state",
    "activation": "activations",
}  # every other torch category (input, temporary, autograd_detail, unknown) is "other"


def torch_category_names() -> list[str]:
    """The column names of torch's coalesced timeline: slot 0 unused, then its categories in its order."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

    return ["unused"] + [c.name.lower() if c is not None else "unknown" for c in _CATEGORY_TO_INDEX]


def peak_of(times: list[int], sizes: list[list[int]], names: list[str]) -> JsonObject | None:
    """The moment the total peaks (the first such moment), and each category's bytes then."""
    if not times:
        return None
    totals = [sum(row) for row in sizes]
    i = max(range(len(totals)), key=lambda k: (totals[k], -k))
    by_torch = {n: int(v) for n, v in zip(names, sizes[i], strict=True) if n != "unused"}
    study = dict.fromkeys([*STUDY_CATEGORIES.values(), "other"], 0)
    for name, value in by_torch.items():
        study[STUDY_CATEGORIES.get(name, "other")] += value
    return {"peak_bytes": int(totals[i]), "at_us": int(times[i]), "categories": study, "torch_categories": by_torch}


def at_peak(prof: torch.profiler.profile, device: torch.device) -> JsonObject:
    """This cycle's peak on `device`, by category; {"error": why} where torch cannot say."""
    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        timeline = MemoryProfileTimeline(prof._memory_profile())
        times, sizes = timeline._coalesce_timeline(str(device))
        names = torch_category_names()
    except Exception as e:  # a private API: whatever it raises, the run goes on without the split
        log.warning("memory categories unavailable: %s: %s", type(e).__name__, e)
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    return peak_of(times, sizes, names) or {"error": f"no tensor on {device} in the cycle"}
