"""The one reference for every config key and every environment variable, for `python -m hpc.config
--explain` and `--variables` and docs/reference.md:

- `key_docs`: each key of the schema, its type and default from the dataclass field, and its meaning
  from the comment the field carries in the source (the lines just above it and the one at its end), so
  that the reference cannot drift from the code (a test holds that every key has one). Written by hand:
  no library reads a dataclass field's comment; `tokenize` finds them.
- `VARIABLES`: every HPC_* variable the toolkit reads, who sets it, what it means, its default (a test
  holds that every HPC_* name in hpc/, analysis/ and jobs/ is here, and nothing else is).

No torch.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import types
import typing
from typing import Any

from hpc.settings.flags import FLAGS, SWITCHES
from hpc.settings.schema import SECTIONS

_FIELD = re.compile(r"\s+(\w+)\s*:")  # a field's line in a class body: `    name: type = default`


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One config key: `section.name`, its type and default in words, what it means, the flags that set it."""

    key: str
    type: str
    default: str
    meaning: str
    flags: tuple[str, ...]


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in `cls`'s source: the comment lines just above it and the one at its end."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number (1-based) -> its comment's text
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, str] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for number, line in enumerate(lines, 1):
        match = _FIELD.match(line)
        if match is None or match.group(1) not in names or line.lstrip().startswith("#"):
            continue
        above: list[str] = []
        up = number - 1
        while up >= 1 and lines[up - 1].lstrip().startswith("#"):
            above.insert(0, comments.get(up, ""))
            up -= 1
        found[match.group(1)] = " ".join(part for part in [*above, comments.get(number, "")] if part)
    return found


def type_words(hint: Any) -> str:
    """A field's type as a reader says it: int, float or none, one of a list..."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "none"
    if origin in (tuple, list):
        return f"list of {type_words(typing.get_args(hint)[0])}"
    if origin is dict:
        return f"mapping of text to {type_words(typing.get_args(hint)[1])}"
    return {str: "text", bool: "true or false", int: "int", float: "float", Any: "value"}.get(hint, str(hint))


def default_words(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(default_words(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}" if value else "{}"
    return str(value)


def setting_flags() -> dict[str, tuple[str, ...]]:
    """The training flags that set a key (hpc.train's, forwarded by hpc.submit and hpc.study run)."""
    flags: dict[str, list[str]] = {}
    for name, (key, _, _) in FLAGS.items():
        flags.setdefault(key, []).append("--" + name.replace("_", "-"))
    for name, (key, _, _) in SWITCHES.items():
        flags.setdefault(key, []).append("--" + name.replace("_", "-"))
    return {key: tuple(names) for key, names in flags.items()}


def key_docs(other_flags: dict[str, tuple[str, ...]] | None = None) -> list[KeyDoc]:
    """Every key of every section, in the schema's order; `other_flags`: flags of commands above this floor
    (hpc.submit's sbatch options that stand in for a profile key)."""
    flags = {**setting_flags(), **(other_flags or {})}
    docs = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        meanings = field_comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            key = f"{section}.{f.name}"
            docs.append(
                KeyDoc(
                    key, type_words(hints[f.name]), default_words(default), meanings.get(f.name, ""), flags.get(key, ())
                )
            )
    return docs


# ---- the environment ----------------------------------------------------------------------------------

YOU, TOOLKIT = (
    "you",
    "the toolkit",
)  # who sets it: a user (in the shell, an sbatch script), or the toolkit for its own processes


@dataclasses.dataclass(frozen=True)
class Variable:
    set_by: str
    meaning: str
    default: str = "-"


VARIABLES: dict[str, Variable] = {
    # Set by you
    "HPC_PROFILE": Variable(
        YOU, "the cluster profile of jobs/*.sbatch and `hpc.batch` (a name or a YAML)", "perlmutter"
    ),
    "HPC_CONFIG": Variable(YOU, "jobs/run.sbatch: a config YAML whose profiler section applies to your command"),
    "HPC_NO_PROFILE": Variable(YOU, "jobs/run.sbatch: any value runs your command without torch.profiler"),
    "HPC_LAUNCHER": Variable(
        YOU, "jobs/*.sbatch: srun (one task a GPU), torchrun (one a node, torchrun's restarts) or node", "srun"
    ),
    "HPC_MAX_REQUEUES": Variable(YOU, "jobs/*.sbatch: requeues of a stopped job", "the profile's max_requeues"),
    "HPC_MAX_RESTARTS": Variable(
        YOU, "jobs/*.sbatch with HPC_LAUNCHER=torchrun: torchrun's worker-group restarts", "the profile's max_restarts"
    ),
    "HPC_DATA": Variable(
        YOU, "the data root when neither --data-root nor data.root says one", "$SCRATCH/cifar100, ./data"
    ),
    "HPC_LOG_LEVEL": Variable(YOU, "debug, info, warning or error for every command and a job's ranks", "info"),
    "HPC_GROUP": Variable(
        YOU, "a project group that may read your runs (files 0640, folders 0750 of that group: docs/security.md)"
    ),
    "HPC_GPU_SAMPLE_S": Variable(YOU, "seconds between NVML's samples of each node's GPUs", "0.25"),
    "HPC_MASTER_PORT": Variable(YOU, "the port rank 0's store listens on (else one it picks, free)"),
    "HPC_FAULT_INJECT": Variable(
        YOU, "faults injected on purpose, for tests and drills (grammar: hpc/core/faults.py), e.g. fail-at-step:3"
    ),
    "HPC_GRAPH_CAPTURE": Variable(
        YOU,
        "graph mode's capture on a machine without CUDA: module:name of a graphmode.Capture (the tests' CPU "
        "stand-in); unset: CUDA's own",
    ),
    # Set by the toolkit for its own processes (a job's ranks, their tasks)
    "HPC_RUN_DIR": Variable(TOOLKIT, "the run directory, in every rank's environment (a script may write there)"),
    "HPC_PROFILER": Variable(TOOLKIT, "the profiler section, as JSON, for the start-up hook in your command"),
    "HPC_POINT_BATCH": Variable(TOOLKIT, "a sweep point's batch size per GPU, for the OOM record of your command"),
    "HPC_ATTEMPT": Variable(TOOLKIT, "the runner's attempt (a requeue's or torchrun's restart), for its task"),
    "HPC_BEAT": Variable(TOOLKIT, "the pipe (FD:INODE) a task's step beats go to its runner through"),
    "HPC_STORE_FD": Variable(TOOLKIT, "rank 0's task: the listening socket its store serves on"),
    "HPC_STORE_SECRET": Variable(TOOLKIT, "the run's secret (hex) that seals its store, in each rank's environment"),
    "HPC_SUBMITTER": Variable(TOOLKIT, "`hpc.submit --local`'s pid and start time: its ranks stop when it is gone"),
    "HPC_RANK_LAUNCHER": Variable(TOOLKIT, "what placed a rank that sees torchrun's variables"),
    "HPC_GPU_ORDER": Variable(TOOLKIT, "the GPU each local rank takes on a whole node (the profile's gpu_order)"),
    "HPC_NCCL_FABRIC": Variable(
        TOOLKIT, "a multi-node job: what a run does when NCCL would use TCP sockets (the profile's nccl_fabric)"
    ),
}
