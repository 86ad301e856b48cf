"""How a command's run ended, from its ranks' records (RUN/ranks/rank{R}.exit.json, written by
hpc/launch/rank.py, and .steps.json, by the profiler's hook): which attempt is the latest, which rank
failed first (the root cause), the run's outcome, the one line that says it, and summary.json made of
them. Pure functions over the records, and the one writer of a command's summary.json. No torch.

The root cause is torchelastic's rule taken across every node: among the latest attempt's ranks that
failed on their own (kind `failed`: an exit code or a signal nobody sent them), the one that ended
first (nanosecond clocks; same instant: the lower rank). Ranks stopped because of it (`peer`), killed
with the job (no exit record), or stopped by a signal are its victims, never its cause.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.files import read_json, write_atomic
from hpc.core.rundir import RunPaths, is_count, write_summary

OUTCOMES = ("done", "failed", "stopped", "preempted", "running")
TAIL_BYTES = 8192
# what summary.json's rank record takes over from the profiler hook's facts
FACTS = ("device", "device_name", "torch", "steps", "step_time_s", "cuda_max_memory_allocated_bytes",
         "peak_rss_bytes", "profiler")  # fmt: skip


def attempt_of(env: Mapping[str, str]) -> str:
    """This start of the job, alike on every rank: the job id (an array's task included) and Slurm's
    restart count (a requeue), and torchrun's restart of its worker group."""
    job = env.get("SLURM_ARRAY_JOB_ID") and f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    job = job or env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or "here"
    return f"{job}.{env.get('SLURM_RESTART_COUNT') or 0}.{env.get('TORCHELASTIC_RESTART_COUNT') or 0}"


def tail_lines(path: Path, count: int = 10) -> list[str]:
    """The last non-empty lines of a log (at most TAIL_BYTES of it), each cut to 300 characters."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip()[:300] for line in text.splitlines() if line.strip()][-count:]


# A Python exception's last line, as a traceback ends (torch's launchers prefix `[rankN]: `).
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def last_said(lines: list[str]) -> str | None:
    """What a failed rank said last: its last exception line where there is one (a process that raised and
    then aborted at its exit, as gloo's threads make it, still says why), else its last line."""
    return next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1] if lines else None)


def read_records(paths: RunPaths) -> list[dict[str, Any]]:
    """Every rank's exit record of the latest attempt (the one started last), by rank."""
    found = []
    for path in sorted(paths.ranks.glob("rank*.exit.json")) if paths.ranks.is_dir() else []:
        record = read_json(path)
        if isinstance(record, dict) and is_count(record.get("rank")) and isinstance(record.get("attempt"), str):
            found.append(record)
    if not found:
        return []
    newest = max(found, key=lambda r: r.get("started_ns") or 0)["attempt"]
    return sorted((r for r in found if r["attempt"] == newest), key=lambda r: r["rank"])


def failed_mark(paths: RunPaths, attempt: str) -> Path:
    """Made by a rank that failed: one file every other rank can look for with one stat, where reading
    every rank's record would not scale (a thousand ranks on a parallel file system)."""
    return paths.ranks / f".failed.{attempt}"


def failed_peers(paths: RunPaths, attempt: str, me: int) -> list[int]:
    """The ranks of `attempt` other than `me` that failed on their own (read only once the mark is there)."""
    if not failed_mark(paths, attempt).exists():
        return []
    return [r["rank"] for r in read_records(paths) if r["attempt"] == attempt and r["rank"] != me
            and r.get("kind") == "failed"]  # fmt: skip


def wait_for_records(paths: RunPaths, attempt: str, world_size: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """Until every rank of `attempt` has recorded its end (one listing and a few reads a poll), or timeout_s:
    rank 0 then writes the run's summary once, whole."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = [r for r in read_records(paths) if r["attempt"] == attempt and r.get("ended_ns")]
        if len(ended) >= world_size:
            return
        time.sleep(poll_s)


def root_cause(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first rank to fail on its own (see the module doc), or None."""
    failed = [r for r in records if r.get("kind") == "failed"]
    return min(failed, key=lambda r: (r.get("ended_ns") or 0, r["rank"])) if failed else None


def run_outcome(records: list[dict[str, Any]], world_size: int) -> str:
    """failed (a rank failed), stopped (ranks saved and stopped: requeue resumes), preempted (stopped
    without saying it saved, or killed after the grace time), done (every rank exited 0), running."""
    kinds = [r.get("kind") for r in records]
    if "failed" in kinds:
        return "failed"
    if any(k in ("killed", "interrupted", "peer") for k in kinds):
        return "preempted"
    if "stopped" in kinds:
        return "stopped"
    return "done" if len(records) == world_size and all(k == "ok" for k in kinds) else "running"


def failure_line(records: list[dict[str, Any]], world_size: int) -> str | None:
    """One line naming the failing rank, its host, its exit code or signal, its last stderr line and its
    log, and what became of the others; None when no rank failed."""
    cause = root_cause(records)
    if cause is None:
        return None
    others = [r["rank"] for r in records if r is not cause]
    missing = sorted(set(range(world_size)) - {r["rank"] for r in records})
    after = f"; {_ranks(others)} ended after it" if others else ""
    lost = f"; {_ranks(missing)} left no record (killed with the job)" if missing else ""
    return (
        f"rank {cause['rank']} failed first (on {cause.get('hostname')}, local rank {cause.get('local_rank')}): "
        f"{cause.get('message')}; its stderr: {cause.get('logs', {}).get('err')}{after}{lost}"
    )


def _ranks(ranks: list[int]) -> str:
    listed = ",".join(str(r) for r in ranks[:16]) + (f",... ({len(ranks)})" if len(ranks) > 16 else "")
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}"


def rank_entry(paths: RunPaths, record: dict[str, Any]) -> dict[str, Any]:
    """summary.json's record of a rank: its exit record, what the profiler hook saw, `complete`."""
    facts = read_json(paths.rank_steps(record["rank"])) if paths.rank_steps(record["rank"]).is_file() else None
    entry = {**record, "complete": record.get("kind") == "ok", "data_source": "script"}  # its own data
    if isinstance(facts, dict):
        entry.update({k: facts[k] for k in FACTS if k in facts})
    else:
        entry["profiler"] = {"traces": paths.rank_traces(record["rank"]), "cycles": [], "failed": [], "note": None}
    return entry


def command_summary(paths: RunPaths, records: list[dict[str, Any]], spec: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json of a command's run, from its ranks' records."""
    world: int = max((int(r["world_size"]) for r in records if is_count(r.get("world_size"))), default=len(records))
    point = spec.get("point") if isinstance(spec.get("point"), dict) else None
    return {
        "kind": "command",
        "run_dir": str(paths.root),
        "command": records[0].get("command") if records else spec.get("argv"),
        "point": point,
        "world_size": world,
        "attempt": records[0].get("attempt") if records else None,
        "outcome": run_outcome(records, world),
        "failure": failure_line(records, world),
        "profiled": spec.get("profiler") is not None,
        "ranks": [rank_entry(paths, r) for r in records],
    }


def write_command_summary(paths: RunPaths) -> dict[str, Any] | None:
    """summary.json made again from the records, under a lock so that two writers (rank 0 once the others
    have ended, a rank that failed, a reader such as `--wait`) do not interleave. Returns it, or None
    without records."""
    records = read_records(paths)
    if not records:
        return None
    spec = read_json(paths.command) if paths.command.is_file() else None
    with open(paths.ranks / ".summary.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = command_summary(paths, read_records(paths), spec if isinstance(spec, dict) else {})
        with contextlib.suppress(OSError):  # a full disk: the records still say it
            write_summary(paths, summary)
    return summary


def write_spec(paths: RunPaths, spec: Mapping[str, Any]) -> None:
    """command.json: what the run's ranks run (each writes the same; the rename makes it whole)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.command, json.dumps(dict(spec), indent=1))
