"""Requeueing a job that stopped with a checkpoint (Slurm's warning before the time limit, a preemption,
a lost peer), in one place, as TorchX's batch script does: once the job's step has ended, its batch shell
runs `requeue_after_step`, the one executor, which decides from the run's records (the rule `may_requeue`:
a requeue code in the run's end, `run_code`; not a person's stop; requeues left; then Slurm's own state,
`not_to_requeue`: a person's scancel, a requeue made since this start) and acts with `scontrol requeue`.
Outside the step, so no signal Slurm sends the step's processes can cut it, and outside any container.

Both kinds of job call it: a hand-written sbatch script's batch shell (`python -m hpc.batch`,
hpc/launch/batch.py) in-process, and submitit's batch script through its teardown lines
(`teardown_lines`: `python -m hpc.launch.requeue`, with the submitter's interpreter). submitit's own
requeue (`max_num_timeout`) is never used: the job it runs is not one of its Checkpointables. A requeue
that fails is one line in the job's log; the checkpoint stays, and resubmitting the point resumes it. A
stop a person asked for (Ctrl-C, a local SIGTERM, scancel) is not requeued. No torch import.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpc.core.cli import Parser, run
from hpc.core.ending import SLURM_CANCELLED, Outcome, RankEnd
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, QueueError
from hpc.core.rundir import RunPaths
from hpc.core.summary import Ended, RunRecord, exit_code_of, restarts_line, root_cause, write_run_summary
from hpc.launch.submission.queue import accounted, ask_slurm
from hpc.settings.rankcommand import RankCommand

log = logging.getLogger(__name__)


def stopped_by_user(signum: int | None, env: Mapping[str, str]) -> bool:
    """A stop a person asked for, not the scheduler: Ctrl-C (SIGINT) anywhere; SIGTERM on this machine
    (submitit's local controller forwards the user's; on Slurm SIGTERM is a preemption). Not requeued."""
    return signum == signal.SIGINT or (signum == signal.SIGTERM and env.get("SUBMITIT_EXECUTOR") == "local")


def may_requeue(
    code: int | None, requeue_codes: Iterable[int], signum: int | None, env: Mapping[str, str], max_requeues: int
) -> bool:
    """The requeue rule, the one place it is written (the job's own path, hpc/launch/submission/job.py, and the
    batch shell's, hpc/launch/batch.py): a task that exited with one of its requeue codes, not stopped by
    a person, with requeues left (Slurm's restart count below the profile's max_requeues)."""
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    return code in tuple(requeue_codes) and not stopped_by_user(signum, env) and restarts < max_requeues


def requeue_code(record: Ended) -> int | None:
    """The code the requeue rule reads for a rank's end, None where the rank's end is not one to resume: a
    stopped rank's own (its requeue code; 3 for exit 0 unfinished after a stop), and 3 for a rank killed
    after the grace time that followed a SIGTERM: a command that took the stop and did not end in time
    (Lightning's DDP ranks, deadlocked by the collective in its SIGTERM handler: docs/faults.md) resumes
    from what it last saved, as a task srun killed on its batch shell's SIGTERM does."""
    if record.kind == RankEnd.STOPPED:
        return exit_code_of(record)
    if record.kind == RankEnd.KILLED and record.stop == signal.SIGTERM.name:
        return EXIT_PREEMPTED
    return None


def restarts_in(scontrol_job: str) -> int | None:
    """Slurm's restart count of a job in `scontrol show job -o`'s line (Restarts=N), None without one."""
    found = re.search(r"(?:^|\s)Restarts=(\d+)(?:\s|$)", scontrol_job)
    return int(found.group(1)) if found else None


ALREADY = "was requeued already since this start (by its task: Lightning requeues its job on SIGUSR1): not again"
CANCELLED = "was cancelled (scancel): a person's stop is not requeued"


def not_to_requeue(job_id: str, env: Mapping[str, str]) -> str | None:
    """Why Slurm's own state forbids requeueing the job now, in words (None: nothing does): a person
    cancelled it (its tasks saw only a SIGTERM, as in a preemption, and a requeue would undo the cancel:
    while the job completes scontrol says COMPLETING, Slurm's accounting says CANCELLED), or it was
    requeued since this start by someone else (its task: Lightning requeues its own job on SIGUSR1; a
    person): Slurm's restart count above this start's. No answer says nothing: the requeue is tried (and
    Slurm refuses a second one of a job already pending)."""
    if accounted([job_id]).get(job_id) == SLURM_CANCELLED:
        return CANCELLED
    try:
        said = ask_slurm(["scontrol", "show", "job", "-o", job_id])
    except QueueError:
        return None
    return requeued_since(said.stdout, env)


def requeued_since(scontrol_job: str, env: Mapping[str, str]) -> str | None:
    """ALREADY where `scontrol show job -o`'s restart count is above this start's (SLURM_RESTART_COUNT, 0
    when unset); None where it is not, or says none."""
    now = restarts_in(scontrol_job)
    return ALREADY if now is not None and now > int(env.get("SLURM_RESTART_COUNT") or 0) else None


def run_code(summary: RunRecord, rc: int, terminated: bool) -> int:
    """The run's exit code, from its ranks' records: a stopped rank's (its requeue code), the first
    failing rank's (128 + N for a signal N), 3 when srun killed the tasks on the batch shell's own
    SIGTERM (they resume from what their task last saved), else srun's."""
    ranks = summary.ranks
    if terminated and rc > 128:
        log.info(f"srun ended the tasks on SIGTERM (exit {rc}): they resume from what their task last saved")
        return EXIT_PREEMPTED
    cause = root_cause(ranks)
    if cause is not None:
        return exit_code_of(cause)
    stopped = [code for code in map(requeue_code, ranks) if code is not None]
    return stopped[0] if stopped else (EXIT_OK if summary.outcome == Outcome.DONE else rc or EXIT_FAILED)


def person_stopped(summary: RunRecord) -> int | None:
    """The signal of a person's stop in the ranks' records (Ctrl-C: SIGINT), None without one."""
    said = {r.stop for r in summary.ranks}
    return signal.SIGINT if signal.SIGINT.name in said else None


def asked(summary: RunRecord, code: int) -> str:
    """Why the run is requeued, in words: a rank killed after the grace time that followed Slurm's SIGTERM
    (it took the stop and hung: Lightning's DDP ranks, docs/faults.md), else the task's own code."""
    for r in summary.ranks:
        if r.kind == RankEnd.KILLED and requeue_code(r) is not None:
            return (
                f"the task took Slurm's stop and did not end in time ({r.message}): it resumes from what it last saved"
            )
    return f"the task asked to be requeued (exit {code})"


def requeue_after_step(
    paths: RunPaths,
    requeue_codes: tuple[int, ...],
    step: tuple[str, int, bool],
    env: Mapping[str, str],
    max_requeues: int,
    door: str,
) -> int:
    """The one requeue executor, once the job's step has ended: the run's end in one line (summary.json
    written, every task having ended), then the rule, then `scontrol requeue`. `step`: the job (its array
    form where it is one), srun's exit code, and whether a SIGTERM reached the batch shell meanwhile.
    `door` begins each line (the command whose log it lands in). The run's exit code: 0 when requeued, or
    requeued already since this start."""
    job, rc, terminated = step
    summary = write_run_summary(paths, ended=True) or RunRecord()
    outcome = summary.outcome or "no rank started"
    log.info(f"{door}: {paths.root}: {outcome}" + (f": {summary.failure}" if summary.failure else ""))
    restarted = restarts_line(summary)
    if restarted:
        log.info(f"{door}: {restarted}")
    code = run_code(summary, rc, terminated)
    if code not in requeue_codes:
        return code
    signum = person_stopped(summary)
    if stopped_by_user(signum, env):
        log.info(f"{door}: job {job} was stopped by a person (Ctrl-C): not requeued; resubmit it to resume")
        return code
    if not may_requeue(code, requeue_codes, signum, env, max_requeues):
        restarts = env.get("SLURM_RESTART_COUNT") or 0
        log.warning(
            f"{door}: job {job} stopped after {restarts} requeues (max_requeues {max_requeues}); resume by resubmitting"
        )
        return code
    why_not = not_to_requeue(job, env)
    if why_not is not None:  # requeued by another already (its end is that start's), or cancelled
        log.info(f"{door}: job {job} {why_not}")
        return EXIT_OK if why_not == ALREADY else code
    log.info(f"{door}: {asked(summary, code)}: requeueing job {job}")
    said = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if said.returncode == 0:
        log.info(f"{door}: job {job} requeued from the batch shell")
        return EXIT_OK
    words = " ".join((said.stdout + said.stderr).split()) or "no message"
    log.warning(
        f"{door}: job {job} could not requeue itself (scontrol: {words}); its checkpoint stays in {paths.root}: "
        "resubmit the same command to resume it"
    )
    return code


# The batch shell's line before the step: a SIGTERM to it (a preemption signals the batch shell too) is noted
# and waits for the step to end, so that the teardown lines still run (bash runs a trapped signal's handler
# once its foreground command has ended; srun, exec'd, gets the default disposition back).
KEEP_TEARDOWN = "trap 'hpc_term=1; echo \"hpc.submit: the batch shell got SIGTERM: its step ends first\" >&2' TERM"


def teardown_lines(folder: Path, python: str, max_requeues: int) -> list[str]:
    """submitit's batch shell's lines after the step: `requeue_after_step` on the run directory (submitit's
    folder, every %j being this job's id, or its array job id and task, as submitit fills them), run by
    `python` (the submitter's interpreter: outside any container); then the step's own exit code, as
    submitit's script ends, so that Slurm records a job whose step failed as FAILED. A requeue command
    that could not run at all is one line."""
    run_dir = '"$hpc_jid"'.join(shlex.quote(part) if part else "" for part in str(folder).split("%j"))
    return [
        "hpc_rc=$?",
        "hpc_jid=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
        "hpc_jid=${hpc_jid:-$SLURM_JOB_ID}",
        f'{python} -m hpc.launch.requeue --job "$hpc_jid" --run-dir {run_dir} --step-exit "$hpc_rc" '
        f"--max-requeues {max_requeues} ${{hpc_term:+--terminated}} "
        '|| echo "hpc.submit: job $hpc_jid: its requeue command could not run (exit $?): not requeued; resubmit the '
        'point to resume it" >&2',
        'exit "$hpc_rc"',
    ]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="python -m hpc.launch.requeue",
        description="submitit's batch shell after its step (the teardown lines): the run's end said, and the job "
        "requeued when it stopped with a checkpoint. Not a command for people.",
    )
    parser.add_argument("--job", required=True, help="the job, in its array form where it is one")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--step-exit", required=True, type=int, help="srun's exit code")
    parser.add_argument("--max-requeues", required=True, type=int)
    parser.add_argument("--terminated", action="store_true", help="a SIGTERM reached the batch shell")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The teardown's door: 0 whatever the requeue became (each end is said in its line); 2 on bad input."""
    args = parse(sys.argv[1:] if argv is None else list(argv))
    paths = RunPaths(args.run_dir)
    task = RankCommand.read(paths.task, f"--run-dir {args.run_dir}")
    codes = task.requeue_codes if task is not None else ()  # none: no task started here, nothing to resume
    requeue_after_step(
        paths, codes, (args.job, args.step_exit, args.terminated), os.environ, args.max_requeues, "hpc.submit"
    )
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.launch.requeue`): errors as one line, exit 2."""
    return run("hpc.launch.requeue", main, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
