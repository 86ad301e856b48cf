"""`python -m hpc.rank`: one rank of a job's task (the toolkit's training or your own command), for the
batch scripts' srun (hpc/launch/batch.py) and torchrun's workers; what every task of `hpc.submit` runs,
as a command of its own.

    srun python -m hpc.rank --run-dir RUN -- python train.py --epochs 3   # each task: one rank
    python -m hpc.rank --run-dir RUN                                      # the task in RUN/task.json again
    python -m hpc.rank --run-dir RUN --outcome                            # how the run ended, one line

The rank's environment, logs, stops and exit record: hpc/launch/rank/runner.py. Exits as the task did (3 when
it asked to be requeued, which the batch script does); 1 when a stop killed it. Under Slurm a rank that stopped
to be requeued exits 0 (its code is in its exit record, where the batch shell reads it, as a submitit task
returns one): srun's --kill-on-bad-exit, there for a failing rank, would kill a peer still saving because
this one stopped first. A lost peer's 5 stays: that step must end. In a local run's task (`hpc.submit --local`:
its process became this one) a task's 144 exits 1: submitit's local controller would start the tasks again on
it. No torch import.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from hpc.core.cli import Parser, check_run_dir, run
from hpc.core.ending import RankCommand, RankEnd
from hpc.core.errors import EXIT_FAILED, EXIT_OK, EXIT_PEER_LOST, UsageError
from hpc.core.rundir import RunPaths
from hpc.core.summary import CodeFor, current_summary, exit_code_of, read_records, run_exit_code, write_run_summary
from hpc.launch.rank.rankenv import on_slurm
from hpc.launch.rank.runner import run_rank, write_task
from hpc.settings.config import Layers, load_cluster, parse_override, require_section, set_source
from hpc.settings.rankcommand import check_command, metrics_template, read_task, user_command
from hpc.settings.schema import RUN_SECTIONS, ClusterConfig, CommandConfig

SUBMITIT_LOCAL_REQUEUE = 144  # submitit.local.local.LOCAL_REQUEUE_RETURN_CODE (a test holds it to submitit's)


def command_task(words: list[str], config: str | None, no_profile: bool, sets: list[str], grace: int) -> RankCommand:
    """A command's task where it starts (inside an allocation, or a batch script's srun): its words, and what
    it runs under: the profiler section (--config's, then --set profiler.KEY=VALUE; enabled false with
    --no-profile: the start-up hook still counts, watches and records an OOM), command.hang_timeout_s and
    command.metrics. Only those apply to a command: any other section set is an error naming it."""
    overrides = [(*parse_override(s), set_source(s)) for s in sets]
    for dotted, _, source in overrides:
        require_section(dotted, ("profiler", "command"), source)
    layers = Layers()
    if config:
        layers.add_file(config, only=(*RUN_SECTIONS, "command"), flag="--config")
    for dotted, value, source in overrides:
        layers.set(dotted, value, source)
    if no_profile:
        layers.set("profiler.enabled", False, "--no-profile")
    command: CommandConfig = layers.build("command")
    profiler = dataclasses.asdict(layers.build("profiler"))
    metrics = metrics_template(command.metrics, {}, f"{layers.said_by('command.metrics', config)}: command.metrics")
    return user_command(words, os.getcwd(), profiler, grace, hang_timeout_s=command.hang_timeout_s, metrics=metrics)


def task_for(args: Any, words: list[str], paths: RunPaths) -> RankCommand:
    """The task to run: the words after --, or the run directory's task.json (`paths`: --run-dir's)."""
    if words:
        check_command(words, Path.cwd(), in_image=False)
        grace = args.stop_grace_s
        if grace is None:
            grace = load_cluster(args.profile).stop_grace_s if args.profile else ClusterConfig.stop_grace_s
        if grace < 0:
            raise UsageError(f"command line: --stop-grace-s {grace}: must be >= 0")
        return command_task(words, args.config, args.no_profile, args.set, grace)
    saved = read_task(paths.task, f"--run-dir {args.run_dir}")
    if saved is None:
        raise UsageError(f"--run-dir {args.run_dir}: no task.json; give a command after --")
    if not saved.words:
        raise UsageError(f"--run-dir {args.run_dir}: {paths.task.name} has no command in it; give one after --")
    return saved


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    words = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = Parser(prog="python -m hpc.rank", description=__doc__.split("\n\n")[0], needs_args=True)
    parser.add_argument("--run-dir", required=True, help="the run directory (each rank writes its files there)")
    parser.add_argument("--config", help="a config YAML whose profiler and command sections apply (defaults else)")
    parser.add_argument("--no-profile", action="store_true", help="do not profile the command")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a profiler key, or command.hang_timeout_s",
    )
    parser.add_argument("--profile", help="cluster profile whose stop_grace_s applies (default: 60 s)")
    parser.add_argument("--stop-grace-s", type=int, help="seconds from a stop to a kill (default: the profile's)")
    parser.add_argument("--outcome", action="store_true", help="print how the run ended, in one line, and exit")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    paths = RunPaths(Path(args.run_dir))
    if args.outcome:
        return print_outcome(paths)
    check_run_dir(args.run_dir)
    task = task_for(args, words, paths)
    if words:
        write_task(paths, task)
    record = run_rank(task, paths.root)
    if record.rank == 0 and not on_slurm(os.environ):  # by hand: the task's output is in its logs
        summary = current_summary(paths)
        print(
            f"hpc.rank: {paths.root}: {summary and summary.outcome}; the task's output: "
            f"{paths.rank_stream(0, 'out').parent}"
        )
    code = exit_code_of(record)
    if record.kind == RankEnd.STOPPED and code != EXIT_PEER_LOST and on_slurm(os.environ):
        return EXIT_OK  # the first rank to stop is no bad exit to srun (see the module doc)
    if code == SUBMITIT_LOCAL_REQUEUE and os.environ.get("SUBMITIT_EXECUTOR") == "local":
        return EXIT_FAILED  # not "start the tasks again" to submitit's local controller (see the module doc)
    return code


def print_outcome(paths: RunPaths) -> int:
    """`--outcome`: the run's outcome, and the failing rank when one failed; the exit code hpc.submit gives
    it (hpc/core/summary.py run_exit_code: 0 done or oom, 3 stopped, preempted or cancelled, 1 else)
    (2: no command ran there)."""
    summary = write_run_summary(paths) if read_records(paths) else None
    if summary is None:
        raise UsageError(f"--run-dir {paths.root}: no rank of a task has started there (no {paths.ranks})")
    print(f"hpc.rank: {paths.root}: {summary.outcome}" + (f": {summary.failure}" if summary.failure else ""))
    return run_exit_code(summary.outcome, CodeFor.COMMAND)


def cli(argv: list[str] | None = None) -> int:
    return run("hpc.rank", main, argv)
