"""What every rank of a job runs, as data: a `RankCommand` (task.json's one layout, hpc/core/ending.py). The toolkit's
own training is one task (`training_command`: `python -m hpc.train` on the run directory, requeued on exit
3 and 5), a user's command another (`user_command`: its words verbatim, requeued on exit 3). The plan,
the sbatch text, the per-rank runner (hpc/launch/rank/runner.py), the outcome and the printer are the same
for both. Pure functions of plain values; no torch import.

- `RankCommand`'s words are templates: {run_dir} and {python}, the rank's run directory and interpreter, are
  filled when the rank starts (`words_for`, `env_for`); {{ and }} are braces. `read_task`: task.json, or
  one line naming where it came from.
- `check_command`: a command that cannot start is refused before anything is submitted: a program not
  on PATH, a path that is no executable file, `python SCRIPT` whose script is not there.
- `fill`: a sweep point's values in a template word (`--batch-size={batch}`), or one line naming the
  field that has none.
"""

from __future__ import annotations

import os
import re
import shutil
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from hpc.core.cli import shown
from hpc.core.ending import RankCommand, decode_task
from hpc.core.errors import EXIT_PEER_LOST, EXIT_PREEMPTED, SchemaError, UsageError
from hpc.core.files import JsonObject
from hpc.core.rundir import SUBMITTED, AxisValue, SweepPoint

RUN_DIR_VARIABLE = "HPC_RUN_DIR"  # the run directory, for the command's own outputs
# off | warn | stop: what a multi-node run does when NCCL would use sockets (cluster.nccl_fabric)
NCCL_FABRIC_VARIABLE = "HPC_NCCL_FABRIC"
PROFILER_VARIABLE = "HPC_PROFILER"  # the profiler section as JSON: the start-up hook acts on it
# hpc.submit --local's own process (hpc/core/proc.py identity): a local run ends with it, however it dies
SUBMITTER_VARIABLE = "HPC_SUBMITTER"
BATCH_VARIABLE = "HPC_POINT_BATCH"  # a sweep point's batch size per GPU: the start-up hook's OOM record
POINT_FIELDS = ("batch", "fraction", "gpus", "nodes", "ranks")
RUN_FIELDS = ("run_dir", "python")  # known when the rank starts, not when the job is planned
TRAINING_MODULE = "hpc.train"
# The toolkit's training: 3 after a stop signal and a checkpoint, 5 after a lost peer (hpc/core/errors.py).
TRAINING_REQUEUE_CODES = (EXIT_PREEMPTED, EXIT_PEER_LOST)
COMMAND_REQUEUE_CODES = (EXIT_PREEMPTED,)
_PYTHON = re.compile(r"python[0-9.]*")


def read_task(path: Path, source: str) -> RankCommand | None:
    """task.json at `path`, None where there is none to read (OSError); one that is not a task is a
    UsageError naming `source` (where the run directory came from)."""
    try:
        return decode_task(path.read_bytes())
    except OSError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError, SchemaError) as e:
        raise UsageError(f"{source}: {path.name} is not a task ({e})") from None


def words_for(task: RankCommand, run_dir: Path, python: str) -> list[str]:
    """What the rank runs: the task's words with the run directory and the interpreter filled in."""
    values = {"run_dir": str(run_dir), "python": python}
    return [fill(word, values, "task") for word in task.words]


def env_for(task: RankCommand, run_dir: Path) -> dict[str, str]:
    return {k: fill(v, {"run_dir": str(run_dir)}, f"command.env.{k}") for k, v in task.env.items()}


def verbatim(words: Sequence[str]) -> list[str]:
    """Words given as they are (a user's command), as templates: their braces kept as braces."""
    return [w.replace("{", "{{").replace("}", "}}") for w in words]


def training_command(
    config: Mapping[str, object],
    cwd: str,
    name: str,
    stop_grace_s: int,
    point: SweepPoint | None = None,
    hang_timeout_s: int | None = None,
) -> RankCommand:
    """The toolkit's training as a task: `python -m hpc.train` on the run directory and its config, watched
    as a command is (command.hang_timeout_s: the one bound of the runner's watch, unset by default)."""
    words = ("{python}", "-m", TRAINING_MODULE, "--config", "{run_dir}/" + SUBMITTED, "--run-dir", "{run_dir}")
    return RankCommand(
        words,
        cwd,
        name,
        requeue_codes=TRAINING_REQUEUE_CODES,
        stop_grace_s=stop_grace_s,
        hang_timeout_s=hang_timeout_s,
        point=point,
        config=dict(config),
    )


def user_command(
    argv: Sequence[str],
    cwd: str,
    profiler: JsonObject | None,
    stop_grace_s: int,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    point: SweepPoint | None = None,
    hang_timeout_s: int | None = None,
    metrics: str | None = None,
) -> RankCommand:
    """A user's command as a task: `argv` verbatim, then `args` (templates). The toolkit's training given
    as a command (`python -m hpc.train ...`, as jobs/resnet152.sbatch runs it) keeps its requeue codes and
    profiles itself (its config's profiler section): no start-up hook; the runner watches it as any task."""
    training = runs_training(argv)
    codes = TRAINING_REQUEUE_CODES if training else COMMAND_REQUEUE_CODES
    words = (*verbatim(argv), *args)
    hook = None if training else profiler
    return RankCommand(
        words,
        cwd,
        job_name(argv),
        dict(env or {}),
        codes,
        hook,
        stop_grace_s,
        hang_timeout_s,
        point,
        metrics=metrics,
    )


def runs_training(argv: Sequence[str]) -> bool:
    """Whether the words run the toolkit's training (`python -m hpc.train ...`, `hpc-train ...`)."""
    if argv and Path(argv[0]).name == "hpc-train":
        return True
    return python_module(argv) == TRAINING_MODULE


def python_module(argv: Sequence[str]) -> str | None:
    """The module `python [options] -m MODULE ...` runs, or None."""
    if not argv or not _PYTHON.fullmatch(Path(argv[0]).name):
        return None
    words = list(argv[1:])
    for i, word in enumerate(words):
        if word == "-m":
            return words[i + 1] if i + 1 < len(words) else None
        if word.startswith("-m"):
            return word[2:]
        if not word.startswith("-"):
            return None
    return None


def job_name(argv: Sequence[str]) -> str:
    """A job name from a command: the script of `python train.py`, the module of `python -m pkg.mod`,
    else the program."""
    script = python_script(argv)
    module = python_module(argv)
    if module:
        return module.rsplit(".", 1)[-1] or "command"
    return Path(script or (argv[0] if argv else "command")).stem or "command"


def python_script(argv: Sequence[str]) -> str | None:
    """The script `python [options] SCRIPT ...` runs, or None (`-m`, `-c`, another program)."""
    if not argv or not _PYTHON.fullmatch(Path(argv[0]).name):
        return None
    words = iter(argv[1:])
    for word in words:
        if word.startswith(("-m", "-c")):
            return None
        if word in ("-W", "-X", "--check-hash-based-pycs"):  # an option that takes the next word
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


# A launcher inside the command would start one per rank, each its own world (seen: two worlds of two
# training the same thing apart): refused, naming what to write instead.
INSTEAD = {
    "torchrun": "every rank already gets torchrun's variables; for torchrun's agent and its restarts, "
    "set cluster.launcher: torchrun in the profile",
    "accelerate launch": "every rank gets the variables Accelerator() reads; accelerate's settings go in "
    "command.env as its ACCELERATE_* variables",
    "deepspeed": "every rank gets the variables deepspeed.init_distributed() reads",
    "mpirun": "the toolkit starts one process per GPU itself",
}


def launcher_in(argv: Sequence[str]) -> str | None:
    """The launcher a command starts with (torchrun, python -m torch.distributed.run or .launch,
    accelerate launch, deepspeed, mpirun, mpiexec, srun), as INSTEAD names it; None for anything else."""
    program, module = Path(argv[0]).name if argv else "", python_module(argv)
    if program == "torchrun" or module in ("torch.distributed.run", "torch.distributed.launch"):
        return "torchrun"
    if (program == "accelerate" and argv[1:2] == ["launch"]) or module == "accelerate.commands.launch":
        return "accelerate launch"
    if program in ("deepspeed", "mpirun", "mpiexec", "srun"):
        return program if program == "deepspeed" else "mpirun"
    return None


def check_command(argv: Sequence[str], cwd: Path, in_image: bool = False) -> None:
    """UsageError (one line) for a command that cannot start: nothing after `--`, a launcher inside it
    (INSTEAD), a program not on PATH, a path that is not an executable file, a python script that is not
    there. A command inside a container image (`in_image`) is found there, not here: only its script is
    looked for."""
    if not argv:
        raise UsageError("command line: --: no command after it (e.g. -- python train.py)")
    launcher = launcher_in(argv)
    if launcher is not None:
        raise UsageError(
            f"command line: -- {shown(argv[0])}: a launcher inside the command would start one on every rank, "
            f"each its own world; give the script itself (-- python train.py ...): {INSTEAD[launcher]}"
        )
    program = argv[0]
    if not in_image:
        if "/" in program:
            path = cwd / program
            if not path.is_file() or not os.access(path, os.X_OK):
                raise UsageError(f"command line: -- {shown(program)}: not an executable file (in {cwd})")
        elif shutil.which(program) is None:
            raise UsageError(
                f"command line: -- {shown(program)}: not found on PATH; give its path, or load what provides it"
            )
    script = python_script(argv)
    if script is not None and not (cwd / script).is_file():
        raise UsageError(f"command line: -- {Path(program).name} {shown(script)}: no such script in {cwd}")


def fill(word: str, values: Mapping[str, object], source: str, final: bool = True) -> str:
    """`word` with each {field} replaced by its value ({{ and }} are braces); a field with no value is a
    UsageError naming it and `source`. Not `final` (a sweep's plan), a field of RUN_FIELDS stays a field
    and the result is still a template, filled again when the rank starts."""
    try:
        parts = list(string.Formatter().parse(word))
    except ValueError as e:
        raise UsageError(f"{source}: {shown(word)}: {e} (write {{{{ and }}}} for braces)") from None
    later = set() if final else {field for _, field, _, _ in parts if field in RUN_FIELDS and field not in values}

    def kept(text: str) -> str:  # a word that stays a template keeps its braces escaped
        return text if final else text.replace("{", "{{").replace("}", "}}")

    out = []
    for literal, field, spec, conversion in parts:
        out.append(kept(literal))
        if field is None:
            continue
        if conversion or (field not in values and field not in later):
            known = ", ".join("{" + f + "}" for f in (*POINT_FIELDS, *RUN_FIELDS))
            raise UsageError(f"{source}: {shown(word)}: no value for {{{field}}} (known: {known})")
        filled = formatted(values[field], spec, word, source) if field in values else None
        out.append(kept(filled) if filled is not None else "{" + field + (f":{spec}" if spec else "") + "}")
    return "".join(out)


class Fraction(float):
    """A data fraction as a placeholder fills it: `{fraction}` as its shortest form (0.5, 1), and a format
    spec as a float's (`{fraction:.2f}`: 0.50)."""

    def __format__(self, spec: str) -> str:
        return format(float(self), spec or "g")

    def __str__(self) -> str:
        return format(float(self), "g")


def point_values(point: SweepPoint) -> dict[str, AxisValue]:
    """A sweep point's fields under the names a command template uses, its placeholder axes' ({lr}) too."""
    return {
        "batch": point.batch_size,
        "fraction": Fraction(point.data_fraction),
        "gpus": point.gpus,
        "nodes": point.nodes,
        "ranks": point.gpus * point.nodes,
        **{name: value for name, value in (point.values or {}).items() if "." not in name},
    }


def metrics_template(template: str | None, values: Mapping[str, object], source: str) -> str | None:
    """command.metrics with a point's values filled, still a template for {run_dir} (hpc/core/summary.py
    metrics_place fills it when the run's metrics are read); {python} names no place: refused in one line."""
    if template is None:
        return None
    place = fill(template, values, source, final=False)
    if "python" in {field for _, field, _, _ in string.Formatter().parse(place)}:
        raise UsageError(f"{source}: {shown(template)}: {{python}} is no place (use {{run_dir}} or a point's field)")
    return place


def formatted(value: object, spec: str | None, word: str, source: str) -> str:
    """`value` as `{field:spec}` formats it, as str.format would; a spec its type refuses is one line."""
    try:
        return format(value, spec or "")
    except (ValueError, TypeError) as e:
        raise UsageError(f"{source}: {shown(word)}: {e}") from None


def fill_named(word: str, values: Mapping[str, object], source: str) -> str:
    """A word of the command as the user gave it, each {name} or {name:spec} of `values` filled and every
    other brace left as written (a command's own code: `python -c "d = {}"` is no template)."""
    if not values:
        return word
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")(?::([^{}]*))?\}")
    return pattern.sub(lambda m: formatted(values[m.group(1)], m.group(2), word, source), word)
