"""The study in one command, its status, and resubmission: `python -m hpc.study run|status|resubmit`.

    python -m hpc.study run profiles/study.yaml --account m1234 [--wait]   # + any hpc.submit option
    python -m hpc.study status runs/study/sweep-<time>
    python -m hpc.study resubmit runs/study/sweep-<time> --failed --missing --account m1234

`run` validates every point, submits the sweep's job arrays (hpc.submit's plan), then a small analysis
job that depends on them (`--dependency=afterany:...`, resources from the cluster profile's
`analysis_*` keys: on Perlmutter a CPU job of the shared QOS) and writes the tables, figures and
report.html into SWEEP/analysis/. `status` reads squeue (sacct too, where it works), the run
directories and the job logs. `resubmit` submits the chosen points again into the same sweep (their
earlier job ids kept in index.json's `history`), and a new analysis job rebuilds the report.
No torch import here (fast CLI).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from analysis.report import metrics_records, read_index
from hpc.cli import Parser, UsageError
from hpc.config import write_atomic
from hpc.submit import JobRequest, build_parser, execute, make_plan, point_key, print_plan, sbatch_text, setup_lines

COMMANDS = ("run", "status", "resubmit")
STATES = ("pending", "running", "requeued", "done", "oom", "failed", "timeout", "stopped", "missing")


# ----------------------------------------------------------------------------------------------
# The analysis job
# ----------------------------------------------------------------------------------------------


class AnalysisJob:
    """The submitted callable: analyses the sweep directory into SWEEP/analysis (tables, figures, report)."""

    def __init__(self, sweep_dir: str):
        self.sweep_dir = sweep_dir

    def __call__(self) -> str:
        from analysis.__main__ import main

        main([self.sweep_dir, "--report", "--format", "md"])
        return str(Path(self.sweep_dir) / "analysis" / "report.html")


def analysis_parameters(cluster, account: str | None, dependency: str, name: str) -> dict:
    """submitit SlurmExecutor parameters of the analysis job: one CPU task, the profile's analysis_* keys."""
    params = {"job_name": f"{name}-analysis", "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": cluster.analysis_cpus,
              "time": cluster.analysis_time_min, "qos": cluster.analysis_qos, "constraint": cluster.analysis_constraint,
              "partition": cluster.analysis_partition or cluster.partition, "account": account or cluster.account,
              "dependency": dependency,
              "setup": setup_lines(cluster, JobRequest(1, 1, cluster.analysis_time_min, f"{name}-analysis"))}
    return {k: v for k, v in params.items() if v is not None}


def submit_analysis(cluster, sweep_dir: Path, array_ids: list[str], account: str | None) -> str:
    """Submit the analysis job after every array has ended (afterany: failed points are results too)."""
    import submitit

    executor = submitit.SlurmExecutor(folder=sweep_dir / "analysis-jobs" / "%j")
    executor.update_parameters(**analysis_parameters(cluster, account, "afterany:" + ":".join(array_ids),
                                                     sweep_dir.parent.name))
    job = executor.submit(AnalysisJob(str(sweep_dir)))
    record = _read_json(sweep_dir / "study.json") or {}
    record.setdefault("analysis_jobs", []).append(job.job_id)
    write_atomic(sweep_dir / "study.json", json.dumps(record, indent=2))
    return job.job_id


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------
# run / resubmit
# ----------------------------------------------------------------------------------------------


def submit_and_analyse(plan, account: str | None, wait: bool) -> int:
    """Submit the plan (hpc.submit's), then the analysis job after it; print where everything lands."""
    local_failures = execute(plan, wait=False)  # --local: every point has run when this returns
    index = _read_json(plan.sweep_dir / "index.json") or {"points": []}
    report = plan.sweep_dir / "analysis" / "report.html"
    if plan.local:
        from analysis.__main__ import main as analyse

        analyse([str(plan.sweep_dir), "--report"])
        print(f"sweep:  {plan.sweep_dir}\nreport: {report}")
        return 1 if local_failures else 0
    submitted = {point_key(point) for spec in plan.specs for point, _ in spec.points}
    arrays = sorted({p["job_id"].split("_")[0] for p in index["points"] if point_key(p) in submitted})
    analysis_id = submit_analysis(plan.cluster, plan.sweep_dir, arrays, account)
    print(f"sweep:    {plan.sweep_dir}\narrays:   {' '.join(arrays)}\nanalysis: job {analysis_id} "
          f"(after the arrays)\nreport:   {report} (when job {analysis_id} has run)\n"
          f"status:   python -m hpc.study status {plan.sweep_dir}")
    return wait_for_report(plan.sweep_dir, analysis_id) if wait else 0


def wait_for_report(sweep_dir: Path, analysis_id: str, poll_s: float = 3.0) -> int:
    """Block until the analysis job has left the queue; print the sweep table; 1 when no report came."""
    while _in_queue([analysis_id]):
        time.sleep(poll_s)
    report = sweep_dir / "analysis" / "report.html"
    if not report.exists():
        print(f"hpc.study: the analysis job {analysis_id} ended without {report}; see {sweep_dir / 'analysis-jobs'}",
              file=sys.stderr)
        return 1
    print((sweep_dir / "analysis" / "sweep.md").read_text(), end="")
    print(f"report: {report}")
    return 0


def _in_queue(job_ids: list[str]) -> dict[str, str]:
    """{job id: Slurm state} of the jobs (array tasks one by one) squeue still lists."""
    if not job_ids or not shutil.which("squeue"):
        return {}
    q = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(sorted(set(job_ids)))],
                       capture_output=True, text=True)
    if q.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in q.stdout.splitlines() if len(line.split()) == 2)


def run_command(argv: list[str]) -> int:
    """`run SWEEP.yaml [hpc.submit options]`: hpc.submit's command line, its --wait meaning "until the
    report exists"."""
    if not argv or argv[0].startswith("-"):
        raise UsageError("hpc.study run: give the sweep YAML first (e.g. profiles/study.yaml)")
    args = build_parser().parse_args(["--sweep", *argv])
    plan = make_plan(args)
    if args.dry_run:
        print_plan(plan)
        print(f"# then the analysis job, after the arrays (job ids known once they are submitted)\n"
              f"{analysis_sbatch_text(plan, args.account)}", end="")
        return 0
    return submit_and_analyse(plan, args.account, args.wait)


def analysis_sbatch_text(plan, account: str | None) -> str:
    """The analysis job's sbatch script as submitit would write it, with placeholder array ids."""
    import submitit

    executor = submitit.SlurmExecutor(folder=plan.sweep_dir / "analysis-jobs" / "%j")
    executor.update_parameters(**analysis_parameters(plan.cluster, account, "afterany:<array ids>",
                                                     plan.sweep_dir.parent.name))
    return sbatch_text(executor)


def resubmit_command(argv: list[str]) -> int:
    """Submit the failed and/or missing points again into the same sweep, and a new analysis job."""
    import dataclasses

    p = Parser(prog="python -m hpc.study resubmit", description="Submit chosen points of a sweep again.",
               epilog="Other options (--account, --profile, --export, --max-parallel, --local ...) are hpc.submit's.")
    p.add_argument("sweep_dir")
    p.add_argument("--failed", action="store_true",
                   help="points that failed or timed out (they start afresh, in a new run directory)")
    p.add_argument("--missing", action="store_true", help="points never run (no run directory, not queued)")
    p.add_argument("--wait", action="store_true", help="wait for the new report and print the sweep table")
    args, rest = p.parse_known_args(argv)
    sweep_dir = existing_sweep(args.sweep_dir)
    if not (args.failed or args.missing):
        raise UsageError("hpc.study resubmit: say which points: --failed, --missing or both")
    wanted = ({"failed", "timeout"} if args.failed else set()) | ({"missing"} if args.missing else set())
    keys = {point_key(r) for r in sweep_status(sweep_dir) if r["state"] in wanted}
    if not keys:
        print(f"hpc.study: no {' or '.join(sorted(wanted))} points in {sweep_dir}")
        return 0
    submit_args = build_parser().parse_args(["--sweep", str(sweep_dir / "sweep.yaml"), *rest])
    plan = make_plan(submit_args)
    specs = tuple(dataclasses.replace(spec, folder=sweep_dir / "%j", points=chosen)
                  for spec in plan.specs
                  if (chosen := tuple((pt, cfg) for pt, cfg in spec.points if point_key(pt) in keys)))
    print(f"resubmitting {sum(len(s.points) for s in specs)} point(s) into {sweep_dir}")
    plan = dataclasses.replace(plan, specs=specs, sweep_dir=sweep_dir)
    return submit_and_analyse(plan, submit_args.account, args.wait)


def existing_sweep(path: str) -> Path:
    sweep_dir = Path(path)
    if not (sweep_dir / "index.json").is_file() or not (sweep_dir / "sweep.yaml").is_file():
        raise UsageError(f"{path}: not a sweep directory (no index.json and sweep.yaml; hpc.study run writes them)")
    return sweep_dir.absolute()


# ----------------------------------------------------------------------------------------------
# status
# ----------------------------------------------------------------------------------------------

QUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "RUNNING": "running", "COMPLETING": "running",
                "REQUEUED": "requeued", "REQUEUE_HOLD": "requeued", "REQUEUE_FED": "requeued", "SUSPENDED": "pending"}
SACCT_STATES = {"COMPLETED": "done", "FAILED": "failed", "TIMEOUT": "timeout", "OUT_OF_MEMORY": "failed",
                "CANCELLED": "failed", "NODE_FAIL": "failed", "PREEMPTED": "stopped", "BOOT_FAIL": "failed"}


def _sacct(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} from sacct where it works (it needs slurmdbd); {} elsewhere."""
    if not job_ids or not shutil.which("sacct"):
        return {}
    q = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(sorted(set(job_ids)))],
                       capture_output=True, text=True)
    if q.returncode != 0:
        return {}
    return {line.split("|")[0]: line.split("|")[1].split()[0] for line in q.stdout.splitlines() if line.count("|") == 1}


def log_facts(run_dir: Path, job_id: str) -> dict:
    """What the job's logs say: how often it was requeued, whether Slurm killed it at the time limit,
    and the last error line."""
    text = ""
    for log in sorted(run_dir.glob(f"{job_id}_*_log.err")) + sorted(run_dir.glob(f"{job_id}_*_log.out")):
        try:
            text += log.read_text(errors="replace")[-200_000:] + "\n"
        except OSError:
            pass
    errors = [line.strip() for line in text.splitlines()
              if re.search(r"(Error|Exception|error:|CANCELLED|Killed)", line) and "submitit INFO" not in line]
    return {"requeues": len(re.findall(r"Requeued job|requeued", text)),
            "timed_out": "DUE TO TIME LIMIT" in text, "error": errors[-1][:200] if errors else None}


def steps_reached(run_dir: Path, summary: dict | None) -> int | None:
    ranks = (summary or {}).get("ranks") or []
    if ranks and isinstance(ranks[0], dict) and isinstance(ranks[0].get("steps"), int):
        return ranks[0]["steps"]
    steps = [r["step"] for r in metrics_records(run_dir / "metrics.jsonl") if isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


def point_state(run_dir: Path, job_id: str, queued: str | None, accounted: str | None) -> dict:
    """The state of one point (see STATES), from the queue, the run directory, sacct and the logs."""
    summary = _read_json(run_dir / "summary.json")
    summary = summary if isinstance(summary, dict) else None
    facts = log_facts(run_dir, job_id) if run_dir.is_dir() else {"requeues": 0, "timed_out": False, "error": None}
    if queued:
        state = QUEUE_STATES.get(queued, queued.lower())
    elif summary and summary.get("outcome") == "oom":
        state = "oom"
    elif summary and all(r.get("complete") for r in summary.get("ranks") or [{}] if isinstance(r, dict)):
        state = "done"
    elif facts["timed_out"] or accounted == "TIMEOUT":
        state = "timeout"
    elif not run_dir.is_dir():
        state = "missing"
    elif summary:
        state = "stopped"  # checkpointed and ended (preempted, not requeued): resubmitting resumes it
    else:
        state = SACCT_STATES.get(accounted, "failed")
    return {"state": state, "requeues": facts["requeues"], "steps": steps_reached(run_dir, summary),
            "error": facts["error"] if state in ("failed", "timeout", "stopped") else None}


def sweep_status(sweep_dir: Path) -> list[dict]:
    """One row per point of the sweep's index: the point, its job id, state, requeues, steps, error."""
    points = read_index(sweep_dir / "index.json")
    job_ids = [str(p.get("job_id", "")) for p in points]
    queue = _in_queue([j.split("_")[0] for j in job_ids if j])
    accounted = {} if not job_ids else _sacct([j for j in job_ids if j])
    rows = []
    for p, job_id in zip(points, job_ids):
        row = {"data_fraction": p["data_fraction"], "batch_size": p["batch_size"], "gpus": p["gpus"],
               "nodes": p.get("nodes", 1), "job_id": job_id}
        row.update(point_state(sweep_dir / p["run_dir"], job_id, queue.get(job_id), accounted.get(job_id)))
        rows.append(row)
    return rows


STATUS_COLUMNS = ["data_fraction", "batch_size", "gpus", "nodes", "job_id", "state", "requeues", "steps", "error"]


def status_command(argv: list[str]) -> int:
    from analysis.tables import render

    p = Parser(prog="python -m hpc.study status", description="Every point of a sweep and how it stands.")
    p.add_argument("sweep_dir")
    p.add_argument("--format", choices=["table", "csv", "json", "md"], default="table")
    args = p.parse_args(argv)
    sweep_dir = existing_sweep(args.sweep_dir)
    rows = sweep_status(sweep_dir)
    sys.stdout.write(render(rows, STATUS_COLUMNS, args.format))
    if args.format == "table":
        counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
        report = sweep_dir / "analysis" / "report.html"
        print(", ".join(f"{n} {s}" for s, n in counts.items() if n) + f"; report: {report if report.exists() else 'not yet'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] not in COMMANDS:
        raise UsageError(f"command line: {argv[0]!r}: expected one of {', '.join(COMMANDS)}")
    return {"run": run_command, "status": status_command, "resubmit": resubmit_command}[argv[0]](argv[1:])


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.study`, or its console script): errors as one line, exit 2."""
    from hpc.cli import run

    return run("hpc.study", main, argv)


if __name__ == "__main__":
    from hpc import study  # the imported module, so its error classes are the ones hpc.cli catches

    sys.exit(study.cli())
