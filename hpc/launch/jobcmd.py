"""One run, as you follow, query and cancel it: `python -m hpc.job log|status|cancel RUN|JOB`.

    python -m hpc.job log RUN|JOB [--follow] [--rank R] [--err] [--batch]   # rank 0's output by default
    python -m hpc.job status RUN|JOB                                          # Slurm's word and the run's
    python -m hpc.job cancel RUN|JOB                                          # scancel: final

RUN is a run directory (`hpc.submit` prints it; a hand-written script's is in its job's log); JOB a Slurm
job id (an array task as 123_4), while Slurm still knows the job. `log` prints a rank's output
(RUN/logs/rank<R>.out, or .err), or with --batch the job's own log (its batch shell: how the run ended,
requeues, the line that resumes it); --follow goes on until the job has left the queue. `status` says the
queue's state of the run's latest job and how the run stands by its records. `cancel` is `scancel` of that
job: a person's stop, final (docs/faults.md); `python -m hpc.submit --resume RUN` resumes it later. A
sweep: `python -m hpc.study status|cancel SWEEP`. No torch import.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import sys
import time
from pathlib import Path

from hpc.core.cli import Parser, command_name, run
from hpc.core.ending import RESUMABLE, Outcome, PointState, slurm_state
from hpc.core.errors import EXIT_OK, NoArguments, QueueError, UsageError
from hpc.core.rundir import RunPaths, read_checkpoint_info
from hpc.core.summary import attempt_job, current_summary, read_records
from hpc.launch.requeue import resume_line
from hpc.launch.submission.queue import ask_slurm, ended_as, queued

log = logging.getLogger(__name__)

COMMANDS = ("log", "status", "cancel")
JOB_ID = re.compile(r"\d+(_\d+)?")
FOLLOW_S = 1.0  # how often --follow looks for new lines
LOCAL_LAUNCHER = "submitit-local"  # a rank of hpc.submit --local, as its exit record names its launcher


@dataclasses.dataclass(frozen=True)
class JobAsk:
    """What `python -m hpc.job` was asked, past its command line."""

    command: str
    where: str
    follow: bool = False
    rank: int = 0
    err: bool = False
    batch: bool = False


def parse(argv: list[str]) -> JobAsk:
    parser = Parser(prog=command_name("python -m hpc.job"), description=__doc__.split("\n\n")[0], needs_args=True)
    sub = parser.add_subparsers(dest="command", metavar="{log,status,cancel}")
    for name, text in (
        ("log", "a rank's output, or the job's own log"),
        ("status", "Slurm's word on the run's latest job, and the run's own"),
        ("cancel", "scancel the run's job: final; hpc.submit --resume RUN resumes it later"),
    ):
        one = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.")
        one.add_argument("where", metavar="RUN|JOB", help="a run directory, or a Slurm job id")
        if name == "log":
            one.add_argument("-f", "--follow", action="store_true", help="go on until the job has left the queue")
            one.add_argument("--rank", type=int, default=0, help="whose output (default 0)")
            one.add_argument("--err", action="store_true", help="the rank's stderr, not its stdout")
            one.add_argument("--batch", action="store_true", help="the job's own log (its batch shell)")
    args = parser.parse_args(argv)
    if args.command is None:
        raise NoArguments(f"usage: {parser.prog} {{{','.join(COMMANDS)}}} RUN|JOB\n{parser.prog}: no command given")
    shown = {f.name: getattr(args, f.name) for f in dataclasses.fields(JobAsk) if hasattr(args, f.name)}
    return JobAsk(**shown)


def find_run(where: str) -> RunPaths:
    """The run directory `where` names: itself, or a Slurm job's (its log, where Slurm says it is, holds
    the batch shell's `run dir` line)."""
    path = Path(where)
    if (path / "task.json").is_file():
        return RunPaths(path)
    if path.exists() or not JOB_ID.fullmatch(where):
        raise UsageError(f"command line: {where}: not a run directory of the toolkit (no task.json) nor a job id")
    try:
        said = ask_slurm(["scontrol", "show", "job", "-o", where])
    except QueueError as e:
        raise UsageError(f"command line: job {where}: Slurm cannot be asked ({e}): give the run directory") from None
    out = re.search(r"(?:^|\s)StdOut=(\S+)", said.stdout) if said.returncode == 0 else None
    if out is None:
        raise UsageError(f"command line: job {where}: Slurm no longer knows it: give the run directory")
    if (Path(out.group(1)).parent / "task.json").is_file():  # hpc.submit's: its log lies in the run
        return RunPaths(Path(out.group(1)).parent)
    text = Path(out.group(1)).read_text(errors="replace") if Path(out.group(1)).is_file() else ""
    found = re.findall(r"; run dir (\S+)$", text, flags=re.M)
    if not found:
        raise UsageError(f"command line: job {where}: no run directory in its log {out.group(1)} (not started?)")
    return RunPaths(Path(found[-1]))


def latest_job(paths: RunPaths) -> str | None:
    """The run's latest Slurm job: its latest start's, else the newest job submitted into it (pending); None
    for a run that started here (hpc.submit --local: Ctrl-C in its terminal stops it)."""
    records = read_records(paths)
    if records and max(records, key=lambda r: r.started_ns or 0).launcher == LOCAL_LAUNCHER:
        return None
    starts = sorted((r.started_ns or 0, attempt_job(r.attempt)) for r in records)
    pickles = sorted(paths.root.glob("*_submitted.pkl"), key=lambda p: p.stat().st_mtime)
    newest = pickles[-1].name.removesuffix("_submitted.pkl") if pickles else None
    if newest is not None and JOB_ID.fullmatch(newest) and (not starts or newest not in [j for _, j in starts]):
        return newest  # submitted after its last start (a resume, waiting)
    return starts[-1][1] if starts else newest


def slurm_word(job: str | None) -> str:
    """The queue's state of a job, else how Slurm says it ended; '-' without either."""
    if job is None or not JOB_ID.fullmatch(job) or not shutil.which("squeue"):
        return "-"
    try:
        listed = queued([job.split("_")[0]]).get(job)
    except QueueError as e:
        return f"unknown ({e})"
    return listed or ended_as(job) or "no longer known to Slurm"


def held(word: str) -> bool:
    """Whether Slurm's word says the queue holds the job (pending, requeued, running, completing)."""
    return slurm_state(word.split(" ")[0]) in (PointState.PENDING, PointState.REQUEUED, Outcome.RUNNING)


def status_command(paths: RunPaths) -> int:
    job = latest_job(paths)
    summary = current_summary(paths)
    outcome = summary.outcome if summary is not None and summary.outcome is not None else None
    word = slurm_word(job)
    info = read_checkpoint_info(paths)
    print(f"run:     {paths.root}")
    print(f"job:     {job or '-'} (Slurm: {word})")
    print(
        f"outcome: {outcome or 'no rank started yet'}" + (f": {summary.failure}" if summary and summary.failure else "")
    )
    if summary is not None:
        steps = [r.steps for r in summary.ranks if r.steps is not None]
        print(f"ranks:   {summary.world_size}; steps {max(steps) if steps else '-'}")
    if info is not None:
        print(f"saved:   step {info.step} of {info.stop_at} ({paths.checkpoint})")
    print(f"logs:    {paths.rank_stream(0, 'out').parent} (python -m hpc.job log {paths.root} --follow)")
    if outcome in RESUMABLE and outcome != Outcome.RUNNING and not held(word):
        print(f"resume:  {resume_line(paths)}")
    return EXIT_OK


def cancel_command(paths: RunPaths) -> int:
    """scancel of the run's latest job, while the queue holds it: a person's stop, final."""
    job = latest_job(paths)
    if job is None or not JOB_ID.fullmatch(job):
        raise UsageError(f"command line: {paths.root}: no Slurm job of it: a local run stops with Ctrl-C where it runs")
    word = slurm_word(job)
    if not held(word):
        print(f"job {job}: not in the queue (Slurm: {word}): nothing to cancel")
        return EXIT_OK
    said = ask_slurm(["scancel", job])
    if said.returncode != 0:
        raise QueueError(f"scancel {job}: {' '.join((said.stdout + said.stderr).split()) or f'exit {said.returncode}'}")
    print(f"job {job}: cancelled (scancel): final, never requeued; resume later with: {resume_line(paths)}")
    return EXIT_OK


def log_command(paths: RunPaths, ask: JobAsk) -> int:
    """A rank's output (or the job's own log) as it is, and with --follow as it comes until the job left the queue."""
    job = latest_job(paths)
    path = batch_log(paths, job) if ask.batch else paths.rank_stream(ask.rank, "err" if ask.err else "out")
    offset = 0
    while True:
        offset = echo_from(path, offset)
        if not ask.follow or job is None or not JOB_ID.fullmatch(job) or not in_queue(job):
            echo_from(path, offset)  # the last lines, written as it ended
            return EXIT_OK
        time.sleep(FOLLOW_S)


def batch_log(paths: RunPaths, job: str | None) -> Path:
    """The job's own log (its batch shell's): hpc.submit's in the run, a hand-written script's where Slurm
    says (while it knows the job)."""
    if job is not None and (paths.root / f"{job}_0_log.out").exists():
        return paths.root / f"{job}_0_log.out"
    said = ask_slurm(["scontrol", "show", "job", "-o", job]) if job is not None else None
    found = re.search(r"(?:^|\s)StdOut=(\S+)", said.stdout) if said is not None and said.returncode == 0 else None
    if found is None:
        raise UsageError(
            f"command line: --batch: the log of job {job or '-'} is not known: look for it where sbatch -o put it"
        )
    return Path(found.group(1))


def in_queue(job: str) -> bool:
    try:
        return job in queued([job.split("_")[0]])
    except QueueError:
        return True  # the controller silent: the job may run on; keep following


def echo_from(path: Path, offset: int) -> int:
    """What `path` holds past `offset`, to stdout; the new offset."""
    if not path.is_file():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    sys.stdout.write(data.decode(errors="replace"))
    sys.stdout.flush()
    return offset + len(data)


def main(argv: list[str] | None = None) -> int:
    ask = parse(sys.argv[1:] if argv is None else list(argv))
    paths = find_run(ask.where)
    if ask.command == "log":
        return log_command(paths, ask)
    return status_command(paths) if ask.command == "status" else cancel_command(paths)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.job`): errors as one line, exit 2."""
    return run("hpc.job", main, argv)
