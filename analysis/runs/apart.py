"""Which traces are one run. A folder that is not a run may hold several: runs of ours side by side
(runs/resnet18/ after a few local runs), or traces in TensorBoard's layout (logdir/RUN/*.pt.trace.json,
what torch.profiler.tensorboard_trace_handler writes, one folder a run), or traces gathered from
anywhere. Ranks of one run share their world: its size, its backend and its device; traces whose
worlds differ are never judged as one run (an imbalance between two unrelated traces is no imbalance).
No torch import.
"""

from __future__ import annotations

from pathlib import Path

from analysis.records import TraceRecord
from hpc.core.rundir import RunPaths

TOP = "."  # the traces lying in the folder itself, not in a subfolder


def runs_in_folder(path: Path) -> list[Path]:
    """The run directories right under `path` when it is a folder of our runs, not a run itself; [] otherwise."""
    if RunPaths(path).holds_run():
        return []
    try:
        found = sorted(d for d in path.iterdir() if d.is_dir() and RunPaths(d).holds_run())
    except OSError:
        return []
    return found if len(found) > 1 else []


def world_of(rec: TraceRecord) -> tuple[str, str, str]:
    """What ranks of one run share, as said by the trace (unknown parts as '?')."""
    return (
        "?" if rec.world_size is None else str(rec.world_size),
        rec.backend or "?",
        rec.device_name or "?",
    )


def world_words(world: tuple[str, str, str]) -> str:
    size, backend, device = world
    words = [f"world {size}" if size != "?" else "", backend if backend != "?" else "", device if device != "?" else ""]
    return ", ".join(w for w in words if w) or "no world said"


def trace_runs(path: Path, records: list[TraceRecord]) -> list[tuple[str, list[TraceRecord]]]:
    """`records` (traces found under the folder `path`) as runs, each (name, its traces): one per subfolder
    they lie in (TensorBoard's layout), the folder's own files one more; within each, one per world
    (`world_of`). One run alone keeps the folder's name."""
    by_folder: dict[str, list[TraceRecord]] = {}
    for rec in records:
        try:
            parts = Path(rec.file).relative_to(path).parts
        except ValueError:
            parts = ()
        by_folder.setdefault(parts[0] if len(parts) > 1 else TOP, []).append(rec)
    runs: list[tuple[str, list[TraceRecord]]] = []
    for folder, recs in sorted(by_folder.items()):
        name = path.name if folder == TOP else folder
        worlds: dict[tuple[str, str, str], list[TraceRecord]] = {}
        for rec in recs:
            worlds.setdefault(world_of(rec), []).append(rec)
        if len(worlds) == 1:
            runs.append((name, recs))
        else:
            runs += [(f"{name} ({world_words(w)})", some) for w, some in sorted(worlds.items())]
    return runs
