"""Your own command as a job runs it (`hpc.submit ... -- COMMAND [ARG ...]`): what each rank runs and
in which environment, as pure functions of plain values. No torch import.

- `CommandSpec`: the words (argv, given verbatim, never through a shell), the directory they start in,
  the words and environment a sweep point adds (`args`, `env`: filled from the point here, and with
  {run_dir} when the rank starts), and the profiler's section, or None when the run is not profiled.
- `check_command`: a command that cannot start is refused before anything is submitted: a program not
  on PATH, a path that is no executable file, `python SCRIPT` whose script is not there.
- `rank_env`: what a rank's process is given: torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), HPC_RUN_DIR, the GPUs in the profile's order,
  and, when profiled, the start-up hook that profiles it (hpc/training/startup/sitecustomize.py).
- `fill`: a sweep point's values in a template word (`--batch-size={batch}`), or one line naming the
  field that has none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc.core.cli import shown
from hpc.core.errors import UsageError
from hpc.spec.affinity import GPU_ORDER
from hpc.spec.distenv import DistEnv

RUN_DIR_VARIABLE = "HPC_RUN_DIR"  # the run directory, for the command's own outputs
PROFILER_VARIABLE = "HPC_PROFILER"  # the profiler section as JSON: the start-up hook acts on it
HOOK_DIR = Path(__file__).resolve().parent.parent / "training" / "startup"  # holds sitecustomize.py
POINT_FIELDS = ("batch", "fraction", "gpus", "nodes", "ranks")
RUN_FIELDS = ("run_dir",)  # known when the rank starts, not when the sweep is planned
_PYTHON = re.compile(r"python[0-9.]*")
# A job's own launcher variables are not the command's: it is no submitit job, whatever runs it.
_DROPPED_PREFIXES = ("SUBMITIT_",)


@dataclasses.dataclass(frozen=True)
class CommandSpec:
    argv: tuple[str, ...]
    cwd: str
    args: tuple[str, ...] = ()  # a sweep's words after argv, {run_dir} left for the rank to fill
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    profiler: dict[str, Any] | None = None  # ProfilerConfig's fields; None: not profiled
    stop_grace_s: int = 60
    point: dict[str, Any] | None = None  # the sweep point it runs, recorded in summary.json

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommandSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if k in ("argv", "args") else v for k, v in data.items() if k in fields}
        return cls(**values)

    def words(self, run_dir: Path) -> list[str]:
        """What the rank runs: argv as given, then the sweep's words with the run directory filled in."""
        return [*self.argv, *(fill(word, {"run_dir": str(run_dir)}, "command.args") for word in self.args)]

    @property
    def name(self) -> str:
        """A job name from the command: the script of `python train.py`, else the program."""
        script = python_script(self.argv)
        return Path(script or self.argv[0]).stem or "command"


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


def check_command(argv: Sequence[str], cwd: Path, in_image: bool = False) -> None:
    """UsageError (one line) for a command that cannot start: nothing after `--`, a program not on
    PATH, a path that is not an executable file, a python script that is not there. A command inside a
    container image (`in_image`) is found there, not here: only its script is looked for."""
    if not argv:
        raise UsageError("command line: --: no command after it (e.g. -- python train.py)")
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


def fill(word: str, values: Mapping[str, Any], source: str, final: bool = True) -> str:
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
        filled = format(values[field], spec or "") if field in values else None
        out.append(kept(filled) if filled is not None else "{" + field + (f":{spec}" if spec else "") + "}")
    return "".join(out)


def point_values(point: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep point's fields under the names a command template uses."""
    return {
        "batch": point["batch_size"],
        "fraction": f"{point['data_fraction']:g}",
        "gpus": point["gpus"],
        "nodes": point["nodes"],
        "ranks": point["gpus"] * point["nodes"],
    }


def ordered_gpus(env: Mapping[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES in the profile's GPU order (HPC_GPU_ORDER, set for whole nodes), so that a
    script's `cuda:LOCAL_RANK` is the GPU next to the rank's cores; None where nothing changes."""
    order, visible = env.get(GPU_ORDER, ""), env.get("CUDA_VISIBLE_DEVICES", "")
    if not order or not visible:
        return None
    devices, picks = visible.split(","), order.split(",")
    if not all(p.isdigit() for p in picks) or sorted(int(p) for p in picks) != list(range(len(devices))):
        return None  # fewer visible GPUs than a node (a shared job): nothing to order
    return ",".join(devices[int(p)] for p in picks)


def rank_env(
    dist: DistEnv, run_dir: Path, spec: CommandSpec, env: Mapping[str, str], hook_dir: Path = HOOK_DIR
) -> dict[str, str]:
    """The whole environment of one rank's process: this one's, less a launcher's own variables, plus
    the command's, torchrun's contract, HPC_RUN_DIR, the ordered GPUs, and the profiler's hook."""
    out = {k: v for k, v in env.items() if not k.startswith(_DROPPED_PREFIXES)}
    out.update({k: fill(v, {"run_dir": str(run_dir)}, f"command.env.{k}") for k, v in spec.env.items()})
    out.update(dist.torch_env())
    out[RUN_DIR_VARIABLE] = str(run_dir)
    gpus = ordered_gpus(env)
    if gpus is not None:
        out["CUDA_VISIBLE_DEVICES"] = gpus
    if spec.profiler is not None and spec.profiler.get("enabled", True):
        out[PROFILER_VARIABLE] = json.dumps(spec.profiler, sort_keys=True)
        out["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH", "")) if p)
    else:
        out.pop(PROFILER_VARIABLE, None)
    return out
