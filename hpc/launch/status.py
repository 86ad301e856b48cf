"""`python -m hpc.study status SWEEP`: every point of a sweep and how it stands, from the queue (squeue;
sacct where slurmdbd makes it work) and the run directories; the job logs give only the words of an error.
No torch import.

A point is pending, running or requeued (the queue lists it); oom, done, stopped or preempted (its run
directory says so: hpc/core/summary.py run_state; or Slurm's accounting, PREEMPTED); timeout (Slurm ended
it at the time limit: scontrol's reason as its batch shell recorded it, or sacct); cancelled (a person's
scancel, as Slurm's accounting or the run's records say); missing (never ran); failed (with the last error
line of its log); or unknown, when the queue could not
be read and the run directory alone cannot tell (a point not finished may still be running): then the
command says why in one line on stderr and exits 1. A silent queue that no point needed (every one settled
by its run directory) changes no answer: the status is whole, exit 0. Every word is hpc/core/ending.py's (POINT_STATES),
Slurm's through its one table (SLURM_STATES).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from analysis.api import latest_metrics, render, reported_headlines, run_verdict
from hpc.core.cli import Parser, inspect_path
from hpc.core.ending import POINT_STATES, SLURM_CANCELLED, SLURM_TIMEOUT, Outcome, PointState, slurm_state
from hpc.core.errors import EXIT_FAILED, EXIT_OK, QueueError, UsageError
from hpc.core.rundir import RunPaths, SweepPaths, read_index, read_metrics, read_sweep_index
from hpc.core.summary import attempt_restarts, latest_attempt, read_records, run_state, scheduler_said
from hpc.launch.submission.queue import Queued, accounted, listed

STATUS_COLUMNS = [
    "data_fraction",
    "batch_size",
    "gpus",
    "nodes",
    "job_id",
    "state",
    "requeues",
    "steps",
    "metric",
    "verdict",
    "error",
]
_ERROR_LINE = re.compile(r"(Error|Exception|error:|CANCELLED|Killed)")


def existing_sweep(path: str) -> Path:
    sweep_dir = Path(path)
    inspect_path(sweep_dir, "sweep directory")
    if not SweepPaths(sweep_dir).is_sweep():
        raise UsageError(f"{path}: not a sweep directory (no index.json and sweep.yaml; hpc.study run writes them)")
    return sweep_dir.absolute()


@dataclasses.dataclass(frozen=True)
class PointStatus:
    """How a point stands (point_state): its state (hpc/core/ending.py POINT_STATES), its requeues, the
    steps it reached, and the line that says why where it failed, timed out or stopped."""

    state: PointState | Outcome
    requeues: int
    steps: int | None
    error: str | None


def last_error(run: RunPaths, job_id: str) -> str | None:
    """The last error line of the job's logs: what a failed, timed-out or stopped point shows, in words (its
    state comes from Slurm and the run's records, never from this text)."""
    text = ""
    for log in run.job_logs(job_id):
        try:
            text += log.read_text(errors="replace")[-200_000:] + "\n"
        except OSError:
            pass
    errors = [line.strip() for line in text.splitlines() if _ERROR_LINE.search(line) and "submitit INFO" not in line]
    return errors[-1][:200] if errors else None


def steps_reached(run: RunPaths, kept: int | None) -> int | None:
    """The steps a point reached: what its checkpoint or summary keeps, else its last metrics record."""
    if kept is not None:
        return kept
    steps = [r.step for r in read_metrics(run.metrics) if r.step is not None]
    return steps[-1] if steps else None


def point_state(
    run_dir: Path, job_id: str, queued: Queued | None, sacct_state: str | None, queue_known: bool = True
) -> PointStatus:
    """The state of one point (hpc/core/ending.py POINT_STATES), from the queue (squeue: its state and
    restarts), the run directory (its records, and Slurm's word at the job's end that its batch shell
    recorded) and sacct. With the queue unknown, only what the run directory settles (done, oom) is more
    than unknown."""
    run = RunPaths(run_dir)
    files = run_state(run)
    outcome = files.leaves
    # Slurm's count of the job's restarts: squeue's while it is listed, else as its latest start recorded it
    requeues = queued.restarts if queued is not None else attempt_restarts(latest_attempt(read_records(run)))
    ended_as = scheduler_said(run).state  # TIMEOUT: scontrol's reason when Slurm ended the job (requeue.py)
    state: PointState | Outcome
    if queued is not None:
        state = slurm_state(queued.state)
        if state == PointState.PENDING and (files.step is not None or requeues):
            state = PointState.REQUEUED  # waiting to run again: it ran before (a checkpoint, Slurm's restarts)
    elif outcome in (Outcome.OOM, Outcome.DONE) and (queue_known or files.summary_current):
        state = Outcome(outcome)  # without the queue, only a run that wrote its end: it may still be running
    elif not queue_known:
        state = PointState.UNKNOWN
    elif ended_as == SLURM_TIMEOUT or slurm_state(sacct_state) == PointState.TIMEOUT:
        state = PointState.TIMEOUT
    elif sacct_state == SLURM_CANCELLED or files.said == Outcome.CANCELLED:
        state = Outcome.CANCELLED  # a person's scancel (sacct's word, or the follower's record): not a failure
    elif not run_dir.is_dir():
        state = PointState.MISSING
    elif outcome == Outcome.STOPPED and files.summary_current:  # it said so itself: a checkpoint, and ended
        state = Outcome.PREEMPTED if files.said == Outcome.PREEMPTED else Outcome.STOPPED
    else:  # an ended job that said nothing of itself: as Slurm's accounting has it (none: it failed)
        state = slurm_state(sacct_state) if sacct_state else Outcome.FAILED
    explained = state in (Outcome.FAILED, PointState.TIMEOUT, Outcome.STOPPED, Outcome.PREEMPTED)
    note = last_error(run, job_id) if explained and run_dir.is_dir() else None
    if state == Outcome.DONE and not files.summary_current:
        note = "summary.json missing or out of date: run the point again to write it"
    return PointStatus(state, requeues, steps_reached(run, files.step), note)


def sweep_status(sweep_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """One row per point of the sweep's index (the point, its job id, state, requeues, steps, error), and
    why the queue could not be read (None when it could)."""
    sweep = SweepPaths(sweep_dir)
    points = read_index(sweep.index)
    job_ids = [p.job for p in points]
    problem = None
    try:
        in_queue = listed([j.split("_")[0] for j in job_ids if j])
    except QueueError as e:
        in_queue, problem = {}, str(e)
    ended = accounted([j for j in job_ids if j]) if problem is None else {}
    rows = []
    for p, job_id in zip(points, job_ids, strict=True):
        root = sweep.run(p.run_dir).root
        row = {
            "data_fraction": p.data_fraction,
            "batch_size": p.batch_size,
            "gpus": p.gpus,
            "nodes": p.nodes,
            **p.values,  # the sweep's other axes, by name
            "job_id": job_id,
            "run_dir": str(root),
            **({"values": p.values} if p.values else {}),  # what tells the point apart (resubmit)
        }
        row.update(
            dataclasses.asdict(point_state(root, job_id, in_queue.get(job_id), ended.get(job_id), problem is None))
        )
        rows.append(row)
    return rows, problem


def reported_verdicts(sweep: SweepPaths) -> dict[str, str]:
    """Each point's verdict as the analysis job wrote it (analysis/runs.json), by run directory name."""
    return reported_headlines(sweep.runs_json)


def verdict_of(run_dir: Path, reported: dict[str, str]) -> str | None:
    """What bounds a finished point (analysis/explain/verdict.py): the class, and the next one. From the report
    where it has the point (reading every point's traces at each status would take a minute on a full
    study), else from the point's own traces."""
    if run_dir.name in reported:
        return reported[run_dir.name]
    return run_verdict(run_dir)


def status_command(argv: list[str]) -> int:
    p = Parser(
        prog="python -m hpc.study status", description="Every point of a sweep and how it stands.", needs_args=True
    )
    p.add_argument(
        "sweep_dir",
        metavar="SWEEP_DIR",
        help="a sweep's directory, as hpc.study run printed it (runs/<name>/sweep-<time>)",
    )
    p.add_argument("--format", choices=["table", "csv", "json", "md"], default="table", help="how the table is printed")
    args = p.parse_args(argv)
    sweep_dir = existing_sweep(args.sweep_dir)
    reported = reported_verdicts(SweepPaths(sweep_dir))
    points, problem = sweep_status(sweep_dir)
    index = read_sweep_index(SweepPaths(sweep_dir).index)
    metric = latest_metrics([Path(r["run_dir"]) for r in points], index.metric, index.mode)
    rows = [
        {
            **r,
            "metric": metric.get(Path(r["run_dir"])),  # the script's own, latest: how the point is doing
            "verdict": verdict_of(Path(r["run_dir"]), reported) if r["state"] == Outcome.DONE else None,
        }
        for r in points
    ]
    axes = list(dict.fromkeys(k for p in index.points for k in p.values))
    columns = [*STATUS_COLUMNS[:4], *axes, *STATUS_COLUMNS[4:]]
    sys.stdout.write(render(rows, columns, args.format))
    if args.format == "table":
        counts = {s: sum(r["state"] == s for r in rows) for s in POINT_STATES}
        report = SweepPaths(sweep_dir).report
        print(
            ", ".join(f"{n} {s}" for s, n in counts.items() if n)
            + f"; report: {report if report.exists() else 'not yet'}"
        )
    unknown = sum(r["state"] == PointState.UNKNOWN for r in rows)
    if problem is not None and unknown:  # a queue that could not be read, where a point needed it
        print(
            f"hpc.study: {problem}; {unknown} point(s) shown as unknown (their run directories alone cannot tell)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK
