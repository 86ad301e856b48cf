"""Time to the first step against the job's size, on a Slurm cluster (a benchmark, not a test).

    python -m hpc.bench.startuptime --ranks 4,8,16,32 --account m1234_g -- --config profiles/smoke.yaml \
        --data-root DATA --batch-size 8 --epochs 1

Submits the same training at each size through hpc.submit (4 ranks a node, as Perlmutter's GPU nodes; the
words after `--` go to the training), waits for it, and prints where its start-up went, from Slurm's
StartTime and each rank's `startup` record in summary.json (hpc/training/summary.py):
- to process: the job's start to the last rank's process start (srun spawning the tasks);
- imports + set-up: a rank's process start to its joining the group (Python, torch, the config, the device);
- group: the last rank's arrival to the group formed (the store's handshake), and the longest any rank waited;
- to first step: the job's start to the last rank's first step end;
- RSS: each rank's peak resident memory (getrusage), median and max over ranks;
then a line of each start-up phase a rank recorded (summary.json's startup.phases: imports, group joined,
data ready, model ready, profiler started, graph checked, first step, last step, exit), in seconds after
its process started, median and slowest over ranks. A command of your own is timed the same way
(`-- -- python train.py`): its hook sees fewer phases (no group or set-up of its own: "-").
StartTime has a resolution of one second. No torch import.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, counts, run
from hpc.core.errors import EXIT_OK, UsageError
from hpc.core.rundir import RunPaths
from hpc.core.summary import RankEntry, StartupRecord, read_summary
from hpc.training.steptimes import PHASES

PER_NODE = 4


def parse_ranks(text: str) -> list[int]:
    return counts(text, "--ranks", 1, "4,8,16,32")


def job_start_unix(job: str) -> float:
    """Slurm's StartTime of the job (its last start, for a requeued one), in Unix seconds."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
    found = re.search(r"\bStartTime=(\S+)", out)
    if not found:
        raise UsageError(f"job {job}: scontrol shows no StartTime")
    return time.mktime(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))


def figures(ranks: list[RankEntry], started: float) -> dict[str, float | None]:
    """The start-up of one job from its ranks' records (hpc/training/steptimes.py's startup_record)."""
    s = [r.startup or StartupRecord() for r in ranks]
    starts = [x.process_start_unix for x in s]
    firsts = [x.first_step_end_unix for x in s]
    if None in starts or None in firsts:  # every rank times its start and first step: one that did not is no run
        raise UsageError("a rank's summary record has no process start or first step time (startup)")
    # the toolkit's training times its group's forming; a script's hook does not see it (None: not measured)
    joined = [
        (x.group_join_start_unix, x.group_join_s, x.process_start_unix)
        for x in s
        if x.group_join_start_unix is not None and x.group_join_s is not None and x.process_start_unix is not None
    ]
    arrived = [began for began, _, _ in joined]
    formed = max((began + span for began, span, _ in joined), default=None)
    rss = [r.peak_rss_bytes / 2**20 for r in ranks if r.peak_rss_bytes]
    return {
        "to_process_s": max(t for t in starts if t is not None) - started,
        "setup_s": statistics.median(began - process for began, _, process in joined) if joined else None,
        "group_after_last_s": formed - max(arrived) if formed is not None else None,
        "longest_wait_s": max((span for _, span, _ in joined), default=None),
        "to_first_step_s": max(t for t in firsts if t is not None) - started,
        "rss_median_mib": statistics.median(rss) if rss else 0.0,
        "rss_max_mib": max(rss) if rss else 0.0,
    }


def _shown(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def phase_spans(ranks: list[RankEntry]) -> list[tuple[str, float, float]]:
    """Each start-up phase a rank recorded (summary.json's startup.phases, hpc/training/steptimes.py PHASES),
    as seconds since its process started: (phase, median over the ranks that saw it, the slowest rank's),
    in the phases' order; a phase no rank saw is left out (a script's hook sees fewer than the training)."""
    out = []
    for phase in PHASES[1:]:
        seen = [(r.startup.phases.get(phase), r.startup.phases.get("process_start")) for r in ranks if r.startup]
        since = [at - began for at, began in seen if at is not None and began is not None]
        if since:
            out.append((phase, statistics.median(since), max(since)))
    return out


def measure(count: int, account: str, runs_dir: Path, train: list[str]) -> dict[str, Any]:
    nodes, gpus = max(1, -(-count // PER_NODE)), min(PER_NODE, count)
    args = ["--nodes", str(nodes), "--gpus", str(gpus), "--account", account, "--runs-dir", str(runs_dir)]
    # the words after `--` last: they may end in a command of your own (`-- -- python train.py`)
    args += ["--name", f"start{count}", "--export", "ALL,OMP_NUM_THREADS=1", "--wait", *train]
    out = subprocess.run([sys.executable, "-m", "hpc.submit", *args], capture_output=True, text=True)
    found = re.search(r"^job (\S+): run dir (\S+)", out.stdout, flags=re.M)
    if out.returncode != 0 or not found:
        raise UsageError(f"{count} ranks: hpc.submit failed (exit {out.returncode}): {out.stderr.strip()[-300:]}")
    summary = read_summary(RunPaths(Path(found.group(2))).summary)
    if not summary:
        raise UsageError(f"{count} ranks: {found.group(2)} has no readable summary")
    ranks = summary.ranks
    started = job_start_unix(found.group(1))
    return {"ranks": count, "nodes": nodes, **figures(ranks, started), "phases": phase_spans(ranks)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = Parser(prog="python -m hpc.bench.startuptime", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="4,8,16,32", help="rank counts to time (4 a node)")
    p.add_argument("--account", default="m1234_g", help="Slurm account (-A)")
    p.add_argument("--runs-dir", default="runs/startuptime", help="where the runs go")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    rank_counts = parse_ranks(args.ranks)  # before any output: a bad list is one line, nothing printed
    print(
        "| ranks | nodes | to process (s) | imports + set-up (s) | group after last (s) | longest wait (s) "
        "| to first step (s) | RSS median / max (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for count in rank_counts:
        f = measure(count, args.account, Path(args.runs_dir), train)
        print(
            f"| {count} | {f['nodes']} | {f['to_process_s']:.1f} | {_shown(f['setup_s'], 1)} "
            f"| {_shown(f['group_after_last_s'], 2)} | {_shown(f['longest_wait_s'], 1)} | {f['to_first_step_s']:.1f} "
            f"| {f['rss_median_mib']:.0f} / "
            f"{f['rss_max_mib']:.0f} |",
            flush=True,
        )
        spans = "; ".join(f"{phase} {median:.2f} / {most:.2f}" for phase, median, most in f["phases"])
        print(f"  {count} ranks, each phase in s after its process started (median / slowest): {spans}", flush=True)
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.bench.startuptime`): errors as one line, exit 2."""
    return run("hpc.bench.startuptime", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
