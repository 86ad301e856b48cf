"""A script's own metrics (loss, accuracy), read from what scripts already write, with no change to them
(issue 88): TensorBoard event files (torch's SummaryWriter, Lightning's TensorBoardLogger, the HF Trainer's),
Lightning's CSVLogger metrics.csv, the HF Trainer's trainer_state.json, and any JSONL or CSV file of records
under the run directory, the toolkit's own metrics.jsonl among them, through the same code; and where a
command writes them outside its run directory, where command.metrics says.

Event files are read by TensorBoard's own reader (EventAccumulator), not by hand. A metric is a named series
of (step, value); `summarise` makes its final and best values, `choose` the metric a sweep is judged by.
No torch import.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import msgspec

from analysis.read.discover import Warnings
from analysis.records import MetricSummary
from hpc.core.rundir import RunPaths
from hpc.core.summary import metrics_place

MAX_DEPTH = 5  # RUN/out/runs/<time_host>/events...: a logger's folders lie a few levels down
MAX_ENTRIES = 20_000  # looking stops here: a run directory is no disk to walk
MAX_LINE_FILES = 50  # JSONL and CSV files read at most: a script's data files are not its metrics
SKIPPED_DIRS = frozenset({"traces", "ranks", "logs", "checkpoints", "__pycache__", ".git"})
# Not metrics: counters and placeholders the loggers write beside them (Lightning's hp_metric is -1 until set),
# a name or its last part after / or . (Lightning's own valid_loss_step and train_loss_epoch are metrics).
NOT_METRICS = re.compile(r"(^|[/.])(step|global_step|epoch|time|timestamp|hp_metric|rank|kind)$", re.I)
SAYS_LOSS = re.compile(r"loss", re.I)
SAYS_ACCURACY = re.compile(r"acc|top-?1|top-?5", re.I)
SAYS_EVALUATION = re.compile(r"(^|[/_.])(val|valid|validation|eval|test)([/_.]|$)", re.I)


class Series(msgspec.Struct, frozen=True):
    """One metric as a run logged it: its name, the file it came from (relative to the run), (step, value)."""

    name: str
    source: str
    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Choice:
    """The metric a sweep is judged by: its name, min or max, and why it was taken, in words."""

    name: str
    mode: str
    why: str


def summarise(series: Series) -> MetricSummary:
    return MetricSummary(
        final=series.values[-1],
        last_step=series.steps[-1],
        lowest=min(series.values),
        highest=max(series.values),
        points=len(series.values),
        source=series.source,
    )


def mode_of(name: str) -> str:
    """min for a loss (or an error), max for anything else (accuracy)."""
    return "min" if SAYS_LOSS.search(name) or re.search(r"err|perplexity", name, re.I) else "max"


def choose(names: Iterable[str], metric: str | None = None, mode: str | None = None) -> Choice | None:
    """The metric to judge by: `metric` where set (None if no run logged it: the caller says so), else the
    first of `names` whose name says loss or accuracy, an evaluation's before training's, an epoch's before
    one batch's (Lightning's _step), a loss before an accuracy. None where none does."""
    names = list(dict.fromkeys(names))
    if metric is not None:
        if metric not in names:
            return None
        return Choice(metric, mode or mode_of(metric), f"{metric} ({mode or mode_of(metric)}), as set")
    candidates = [n for n in names if SAYS_LOSS.search(n) or SAYS_ACCURACY.search(n)]
    if not candidates:
        return None

    def rank(name: str) -> tuple[int, int, int]:  # Lightning's valid_loss_step is one batch's: its _epoch first
        per_batch = 1 if name.lower().endswith("_step") else 0
        return (0 if SAYS_EVALUATION.search(name) else 1, per_batch, 0 if SAYS_LOSS.search(name) else 1)

    name = min(candidates, key=rank)  # min keeps the first found among equals
    kind = "evaluation" if SAYS_EVALUATION.search(name) else "training"
    taken = mode or mode_of(name)
    why = f"{name} ({taken}): the first {kind} loss or accuracy found; sweep.metric chooses another"
    return Choice(name, taken, why)


def logged_metrics(run_dir: Path, warnings: Warnings | None = None) -> dict[str, Series]:
    """Every metric found under `run_dir`, and where its command writes them outside it (command.metrics, as
    task.json records it), by name. A name found in several files keeps the series with the most points (a
    checkpoint's trainer_state.json is the start of the final one); a file that cannot be read is said in
    `warnings` and skipped."""
    found: dict[str, Series] = {}
    said = warnings if warnings is not None else []
    place = metrics_place(RunPaths(run_dir))
    for root in (run_dir, place):
        if root is None or not root.exists():
            if root is not None:
                said.append(f"{root}: no such file or folder (command.metrics)")
            continue
        for series in _read_tree(root, run_dir, said):
            kept = found.get(series.name)
            if kept is None or len(series.steps) > len(kept.steps):
                found[series.name] = series
    return found


def _read_tree(root: Path, run_dir: Path, warnings: Warnings) -> Iterator[Series]:
    event_dirs: list[Path] = []
    line_files: list[Path] = []
    states: list[Path] = []
    for path in _files(root, warnings) if root.is_dir() else iter([root]):
        name = path.name
        if name.startswith("events.out.tfevents."):
            if path.parent not in event_dirs:
                event_dirs.append(path.parent)
        elif name == "trainer_state.json":
            states.append(path)
        elif name.endswith((".jsonl", ".csv")) and len(line_files) < MAX_LINE_FILES:
            line_files.append(path)
    for path in states:
        yield from _guarded(path, run_dir, warnings, _trainer_state)
    for path in line_files:
        yield from _guarded(path, run_dir, warnings, _jsonl if path.name.endswith(".jsonl") else _csv)
    for folder in event_dirs:
        yield from _guarded(folder, run_dir, warnings, _events)


def _files(root: Path, warnings: Warnings) -> Iterator[Path]:
    seen = 0
    for top, dirs, files in os.walk(root, onerror=lambda e: None):
        depth = len(Path(top).relative_to(root).parts)
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if d not in SKIPPED_DIRS)
        seen += len(dirs) + len(files)
        if seen > MAX_ENTRIES:
            warnings.append(f"{root}: stopped looking for metrics after {MAX_ENTRIES:,} entries")
            return
        for name in sorted(files):
            path = Path(top) / name
            if not path.is_symlink():
                yield path


Reader = Callable[[Path], dict[str, list[tuple[int, float]]]]


def _guarded(path: Path, run_dir: Path, warnings: Warnings, reader: Reader) -> Iterator[Series]:
    source = str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)
    try:
        points = reader(path)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as e:
        warnings.append(f"{path}: not read as metrics ({type(e).__name__}: {e})")
        return
    for name, pairs in points.items():
        if not pairs or NOT_METRICS.search(name):
            continue
        ordered = _by_step(pairs)
        yield Series(name, source, tuple(s for s, _ in ordered), tuple(v for _, v in ordered))


def _by_step(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """One value a step, the last written (a resumed run logs its steps again), in step order."""
    return sorted(dict(pairs).items())


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _step(record: Mapping[str, object], fallback: int) -> int:
    for key in ("step", "global_step", "Step", "iteration"):
        number = _number(record.get(key))
        if number is not None:
            return int(number)
    return fallback


def _add(points: dict[str, list[tuple[int, float]]], record: Mapping[str, object], step: int, prefix: str) -> None:
    for key, value in record.items():
        number = _number(value) if not isinstance(value, str) else None
        if number is not None:
            points.setdefault(prefix + key, []).append((step, number))


def _trainer_state(path: Path) -> dict[str, list[tuple[int, float]]]:
    """The HF Trainer's trainer_state.json: its log_history, a record per logging or evaluation step."""
    state = json.loads(path.read_bytes())
    points: dict[str, list[tuple[int, float]]] = {}
    history = state.get("log_history") if isinstance(state, dict) else None
    for i, record in enumerate(history if isinstance(history, list) else []):
        if isinstance(record, dict):
            _add(points, record, _step(record, i), "")
    return points


def _jsonl(path: Path) -> dict[str, list[tuple[int, float]]]:
    """A JSON object a line (a line that is not one is skipped: a kill cuts the last); a string `kind` (the
    toolkit's metrics.jsonl: train, epoch) prefixes the names: epoch/eval_loss."""
    points: dict[str, list[tuple[int, float]]] = {}
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                kind = record.get("kind")
                _add(points, record, _step(record, i), f"{kind}/" if isinstance(kind, str) else "")
    return points


def _csv(path: Path) -> dict[str, list[tuple[int, float]]]:
    """A CSV file with a header (Lightning's CSVLogger: a row per logging call, empty where a column was not
    logged); its `step` column, else the row's number."""
    points: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f)):
            clean = {k: v for k, v in row.items() if k is not None and v not in (None, "")}
            step = _step({k: _number(v) for k, v in clean.items()}, i)
            for key, value in clean.items():
                number = _number(value)
                if number is not None:
                    points.setdefault(key, []).append((step, number))
    return points


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """A folder of TensorBoard event files, by TensorBoard's own reader: every scalar, all of its points."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags().get(event_accumulator.SCALARS, [])}
