"""How a run stands, from its directory alone: `run_state(RunPaths)`.

The run directory is the truth, whatever the queue says or whether anyone is left to ask: summary.json
(written at the end), checkpoints/last.json (written with every checkpoint: the step it holds and the
run's last step) and nothing else. hpc.train uses the same rule to decide that a finished run whose
summary is missing or stale only needs its summary written, and hpc.study status to show a point.
No torch import; nothing else of the project but core.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hpc.core.files import Warn, ignore
from hpc.core.rundir import RunPaths, read_checkpoint_info
from hpc.core.summary import read_summary, summary_outcome


@dataclasses.dataclass(frozen=True)
class RunState:
    """outcome: "done" (trained to its last step, its last epoch's evaluation recorded), "oom", "stopped"
    (a checkpoint to resume from short of that), or None (nothing to resume: never started, or failed
    before its first checkpoint).
    step: the last step the run reached and kept (the checkpoint's or the summary's), None if none.
    stop_at: the run's last step, where a checkpoint says it. summary_current: summary.json exists and
    says what the checkpoint says (a run killed between its last checkpoint and its summary has not)."""

    outcome: str | None
    step: int | None
    stop_at: int | None
    summary_current: bool

    @property
    def complete(self) -> bool:
        return self.outcome == "done"


def _summary_step(summary: dict[str, Any] | None) -> int | None:
    ranks = (summary or {}).get("ranks") or []
    steps = ranks[0].get("steps") if ranks else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def run_state(paths: RunPaths, warn: Warn = ignore) -> RunState:
    """The run's state from its files (see RunState); unreadable files are warned about and read as absent."""
    summary = read_summary(paths.summary, warn)
    said = summary_outcome(summary)
    info = read_checkpoint_info(paths, warn)
    step_said = _summary_step(summary)
    if said == "oom":
        return RunState("oom", info["step"] if info else None, info["stop_at"] if info else None, True)
    if info is None:  # no checkpoint to compare with (or one written before last.json existed): the summary says
        return RunState(said if said in ("done", "stopped") else None, step_said, None, summary is not None)
    step_saved, stop_at = int(info["step"]), int(info["stop_at"])
    # At the last step but its epoch's end (evaluation, record) still owed: not done. Older files lack it.
    done = info["complete"] if isinstance(info.get("complete"), bool) else step_saved >= stop_at
    current = summary is not None and step_said == step_saved and (said == "done") == done
    return RunState("done" if done else "stopped", step_saved, stop_at, current)
