"""sbatch's options as Slurm users type them, on `hpc.submit` and `hpc.study run`: every option of
sbatch(1) either means what it means to sbatch or is refused in one line that names the way to say it.

Three kinds, in one table each (sbatch(1) of Slurm 22.05, this test cluster's; a newer option passes as
`--sbatch KEY[=VALUE]`):

- OWN: options the toolkit takes itself, with sbatch's meaning (`-N`, `-t`, `-A`, `-q`, `-p`, `-J`, `-C`,
  `-c`, `--gpus-per-node`, `-d`, `--mem`, `--exclusive`, `--export`, `-W`); their flags are declared on
  the parser by hpc/launch/submission/submit.py, and `--sbatch KEY=VALUE` of one of them maps onto its flag;
- PASSED: written to the job's script as given (`--mail-type END`, `--reservation R`, `-H`, ...);
- REFUSED: options whose work the toolkit does another way (`-o`, `--array`, `-n`, `--signal`, ...): one
  line naming that way.

Also sbatch's two grammars the toolkit reads: `--time`'s formats (`minutes_of`) and `--export`'s
(`parse_export`). Pure functions and data; no torch, no Slurm needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hpc.core.cli import BARE, shown
from hpc.core.errors import UsageError
from hpc.settings.cluster import SBATCH_KEY

# sbatch(1)'s options the toolkit takes with sbatch's meaning: long name -> (short, the flag's dest); their
# flags, types and help are OWN_FLAGS, below the value readers.
OWN: dict[str, tuple[str | None, str]] = {
    "nodes": ("N", "nodes"),
    "time": ("t", "time"),
    "account": ("A", "account"),
    "qos": ("q", "qos"),
    "partition": ("p", "partition"),
    "job-name": ("J", "name"),
    "constraint": ("C", "constraint"),
    "cpus-per-task": ("c", "cpus_per_task"),
    "gpus-per-node": (None, "gpus_per_node"),
    "dependency": ("d", "dependency"),
    "mem": (None, "mem"),
    "exclusive": (None, "exclusive"),
    "export": (None, "export"),
    "wait": ("W", "wait"),
}

VALUE, FLAG, OPTIONAL = "value", "flag", "optional"  # what follows an option: a value, nothing, an optional =value

# sbatch(1)'s options written to the job's script as given: long name -> (short, what follows it).
PASSED: dict[str, tuple[str | None, str]] = {
    "acctg-freq": (None, VALUE),
    "batch": (None, VALUE),
    "bb": (None, VALUE),
    "bbf": (None, VALUE),
    "begin": ("b", VALUE),
    "cluster-constraint": (None, VALUE),
    "clusters": ("M", VALUE),
    "comment": (None, VALUE),  # over the profile's cluster.comment
    "container": (None, VALUE),
    "contiguous": (None, FLAG),
    "core-spec": ("S", VALUE),
    "cores-per-socket": (None, VALUE),
    "cpu-freq": (None, VALUE),
    "deadline": (None, VALUE),
    "delay-boot": (None, VALUE),
    "distribution": ("m", VALUE),
    "exclude": ("x", VALUE),
    "extra-node-info": ("B", VALUE),
    "get-user-env": (None, OPTIONAL),
    "gid": (None, VALUE),
    "gpu-bind": (None, VALUE),
    "gpu-freq": (None, VALUE),
    "gpus-per-socket": (None, VALUE),
    "gres-flags": (None, VALUE),
    "hint": (None, VALUE),
    "hold": ("H", FLAG),
    "ignore-pbs": (None, FLAG),
    "input": ("i", VALUE),
    "kill-on-invalid-dep": (None, VALUE),
    "licenses": ("L", VALUE),
    "mail-type": (None, VALUE),
    "mail-user": (None, VALUE),
    "mcs-label": (None, VALUE),
    "mem-bind": (None, VALUE),
    "mem-per-cpu": (None, VALUE),  # instead of --mem (sbatch takes one of the three)
    "mem-per-gpu": (None, VALUE),
    "mincpus": (None, VALUE),
    "network": (None, VALUE),
    "nice": (None, OPTIONAL),
    "no-kill": ("k", OPTIONAL),
    "nodefile": ("F", VALUE),
    "nodelist": ("w", VALUE),
    "ntasks-per-core": (None, VALUE),
    "ntasks-per-socket": (None, VALUE),
    "overcommit": ("O", FLAG),
    "oversubscribe": ("s", FLAG),
    "power": (None, VALUE),
    "prefer": (None, VALUE),
    "priority": (None, VALUE),
    "propagate": (None, OPTIONAL),
    "reboot": (None, FLAG),
    "requeue": (None, FLAG),
    "reservation": (None, VALUE),
    "sockets-per-node": (None, VALUE),
    "spread-job": (None, FLAG),
    "switches": (None, VALUE),
    "thread-spec": (None, VALUE),
    "threads-per-core": (None, VALUE),
    "time-min": (None, VALUE),  # over the profile's cluster.time_min_min
    "tmp": (None, VALUE),
    "uid": (None, VALUE),
    "use-min-nodes": (None, FLAG),
    "wait-all-nodes": (None, VALUE),
    "wckey": (None, VALUE),
}
MEMORY_PER = ("mem-per-cpu", "mem-per-gpu")  # sbatch takes one of these or --mem

_TASKS = "one task per GPU: --gpus-per-node N (cluster.launcher torchrun or node: one task a node)"
# sbatch(1)'s options whose work the toolkit does another way: long name -> (short, what follows, the way).
REFUSED: dict[str, tuple[str | None, str, str]] = {
    "array": ("a", VALUE, "a sweep's points are one job array each shape: python -m hpc.study run SWEEP.yaml"),
    "chdir": ("D", VALUE, "your command runs from where you submit (command.cwd in a --config YAML)"),
    "output": ("o", VALUE, "each rank's output goes to RUN/logs/, the job's beside it in RUN/"),
    "error": ("e", VALUE, "each rank's output goes to RUN/logs/, the job's beside it in RUN/"),
    "open-mode": (None, VALUE, "a job's logs are appended across its requeues"),
    "signal": (
        None,
        VALUE,
        "the stop is SIGTERM, cluster.signal_delay_s before the limit (--set cluster.signal_delay_s=S)",
    ),
    "ntasks": ("n", VALUE, _TASKS),
    "ntasks-per-node": (None, VALUE, _TASKS),
    "ntasks-per-gpu": (None, VALUE, _TASKS),
    "gpus-per-task": (None, VALUE, "every task sees its node's GPUs and takes cuda:LOCAL_RANK; " + _TASKS),
    "cpus-per-gpu": (None, VALUE, "-c/--cpus-per-task N: each task (one a GPU) gets N CPUs"),
    "gres": (None, VALUE, "GPUs: --gpus-per-node N"),
    "wrap": (None, VALUE, "your command goes after --: python -m hpc.submit ... -- python train.py"),
    "test-only": (None, FLAG, "--dry-run prints the job's script and submits nothing"),
    "parsable": (None, FLAG, "each job's id and run directory are said when it is submitted"),
    "export-file": (None, VALUE, "--export NAME takes NAME's value from the environment you submit from"),
    "no-requeue": (None, FLAG, "the toolkit requeues a stopped run itself: --set cluster.max_requeues=0 for never"),
    "quiet": ("Q", FLAG, "--log-level warning"),
    "verbose": ("v", FLAG, "--log-level debug"),
    "usage": (None, FLAG, "--help"),
    "version": ("V", FLAG, "pip show hpc-resnet-study (and sbatch --version for Slurm's)"),
}
# sbatch(1)'s options whose names the toolkit's own flags carry: --gpus counts per node (the design's; a
# count only sbatch's per-job reading fits is refused naming --gpus-per-node), -G is refused the same way,
# and --profile names the cluster profile (a value only sbatch's acct_gather_profile takes is refused
# naming --sbatch profile=...); -h is help to both.
NAMESAKES = {"gpus": "G", "profile": None, "help": "h"}
ACCT_GATHER_PROFILE = re.compile(r"(all|none|energy|lustre|network|task)(,(energy|lustre|network|task))*")


# ---- sbatch's --time ----------------------------------------------------------------------------------

_TIME = re.compile(
    r"(?P<days>\d+)-(?P<dh>\d*)(?::(?P<dm>\d+))?(?::(?P<ds>\d+))?"  # D-H, D-H:M, D-H:M:S (and Slurm's D-)
    r"|(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?"  # M, M:S, H:M:S
)


def minutes_of(text: str) -> int:
    """sbatch's --time in whole minutes: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (a field may run past 59, and
    seconds round up to a minute, as Slurm does). ArgumentTypeError (argparse's) for anything else."""
    found = _TIME.fullmatch(text.strip())
    if found is None or text.strip() in ("0", ""):
        why = "no time limit" if text.strip().upper() in ("0", "INFINITE", "UNLIMITED") else "not a Slurm time"
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: {why}; give minutes or [D-]H:M:S (e.g. 90, 1:30:00, 1-00:00:00), within the profile's "
            "limit (the toolkit warns the run before it ends)"
        )
    g = {k: int(v) if v else 0 for k, v in found.groupdict().items()}
    if found.group("days") is not None:
        seconds = ((g["days"] * 24 + g["dh"]) * 60 + g["dm"]) * 60 + g["ds"]
    elif found.group("c") is not None:
        seconds = (g["a"] * 60 + g["b"]) * 60 + g["c"]
    else:
        seconds = g["a"] * 60 + g["b"]
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"{shown(text)}: no time limit; give a limit the profile allows")
    return math.ceil(seconds / 60)


# ---- sbatch's --export ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Exports:
    """What `--export` asks for, in sbatch's grammar: the submitting environment whole (ALL, the default)
    or not (NONE, or a list without ALL: the job starts in a fresh login environment, as sbatch's does),
    variables with a value, and bare names whose values come from the submitting environment."""

    inherit: bool = True
    values: Mapping[str, str] = dataclasses.field(default_factory=dict)
    names: tuple[str, ...] = ()

    def sbatch_value(self) -> str | None:
        """The script's `--export=` (None: sbatch's default, ALL); the values are set by the script itself."""
        if self.inherit:
            return None
        return ",".join(self.names) if self.names else "NONE"


def is_name(word: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word))


def parse_export(items: Sequence[str], environ: Mapping[str, str], flag: str = "--export") -> Exports:
    """`--export` values (repeatable; each a comma list as sbatch reads it) as one Exports: ALL, NONE,
    NAME=value, and a bare NAME taken from `environ`, the environment submitting the job."""
    inherit: bool | None = None
    values: dict[str, str] = {}
    names: list[str] = []
    for item in items:
        for word in item.split(","):
            name, eq, value = word.partition("=")
            if not eq and word.upper() in ("ALL", "NONE"):  # as Slurm reads them, in any case
                if inherit is not None and inherit != (word.upper() == "ALL"):
                    raise UsageError(f"command line: {flag} {shown(item)}: ALL and NONE together; say one")
                inherit = word.upper() == "ALL"
                continue
            if not is_name(name):
                raise UsageError(
                    f"command line: {flag} {shown(item)}: {shown(name)} is not a variable name (sbatch splits "
                    f"{flag} at commas; a value with a comma: set it here and give its bare name, {flag} NAME)"
                )
            if value[:1] in ('"', "'"):  # quoted to keep a comma: sbatch keeps the quotes too
                raise UsageError(
                    f"command line: {flag} {shown(item)}: sbatch keeps quotes in the value; set it here and give "
                    f"its bare name ({flag} {name})"
                )
            if "\n" in value or "\0" in value:
                raise UsageError(f"command line: {flag} {name}: the value must be one line")
            if eq:
                values[name] = value
            elif name in environ:
                names.append(name)
            else:
                raise UsageError(
                    f"command line: {flag} {name}: {name} is not set here, so the job would not get it "
                    f"(a bare name takes its value from the environment you submit from; or {name}=VALUE)"
                )
    return Exports(inherit is not False and (inherit is True or not (values or names)), values, tuple(names))


# ---- the options on a parser ----------------------------------------------------------------------------


def node_count(text: str) -> int:
    """-N/--nodes: one count (sbatch's min-max range is refused: a run's world size is fixed)."""
    if re.fullmatch(r"\d+-\d+", text.strip()):
        raise argparse.ArgumentTypeError(f"{shown(text)}: a range of node counts; give one (a run's ranks are fixed)")
    return _count(text)


def gpu_count(text: str) -> int:
    """--gpus-per-node: a count (sbatch's type:count is refused: the kind of GPU node is -C/--constraint's)."""
    if ":" in text:
        raise argparse.ArgumentTypeError(f"{shown(text)}: a GPU type; give the count, and the node's kind with -C")
    return _count(text)


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)}: not a whole number") from None


def memory(text: str) -> str:
    """--mem as sbatch reads it: a size with an optional unit (K, M, G, T, each with an optional B, any case:
    sbatch 22.05 takes 200GB and 200gb, refuses 200B and 200GiB); 0 is a whole node's."""
    if not re.fullmatch(r"\d+(?:[KMGT]B?)?", text.strip(), flags=re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"{shown(text)}: not a size (e.g. 0, 200G, 64000M)")
    return text.strip()


def one_line(text: str) -> str:
    """A value that reaches an #SBATCH line: one line, no blanks."""
    if not text or any(ord(c) <= 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(f"{shown(text)}: must be one word, without blanks or control characters")
    return text


class _Passed(argparse.Action):
    """An sbatch option written to the job's script as given: (name, value or True) appended to `dest`."""

    option = ""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        bare = values is None or values == [] or values == BARE
        if isinstance(values, str) and not bare:
            one_line_value(self.option, values)
        got = list(getattr(namespace, self.dest) or [])
        got.append((self.option, True if bare else values))
        setattr(namespace, self.dest, got)


class _Refused(argparse.Action):
    """An sbatch option whose work the toolkit does another way: one line naming it."""

    option = ""
    way = ""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        given = f"{option_string} {values}" if isinstance(values, str) else str(option_string)
        raise UsageError(f"command line: {given}: sbatch's --{self.option} is not taken here: {self.way}")


def one_line_value(option: str, value: str) -> None:
    if value == "" or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise UsageError(f"command line: --{option} {shown(value)}: the value must be one non-empty line")


def _flags(long: str, short: str | None) -> list[str]:
    return [f"--{long}", *([f"-{short}"] if short else [])]


NARGS: dict[str, Any] = {VALUE: None, FLAG: 0, OPTIONAL: "?"}


# The OWN options' flags: (flags, dest, how a value is read, metavar, help, the profile key it stands in for);
# --exclusive, --export and --sbatch are declared apart (an optional value; repeatable).
OWN_FLAGS: tuple[tuple[tuple[str, ...], str, Any, str | None, str, str | None], ...] = (
    (("-N", "--nodes"), "nodes", node_count, None, "nodes (default 1)", None),
    (("-t", "--time"), "time", minutes_of, "TIME", "time limit: minutes, H:M:S, D-H:M:S...", "cluster.time_limit_min"),
    (("-A", "--account"), "account", str, None, "account; Perlmutter's: a GPU allocation's, ..._g", "cluster.account"),
    (("-q", "--qos"), "qos", str, None, "QOS (a part of a node: the profile's shared QOS)", "cluster.qos"),
    (("-p", "--partition"), "partition", str, None, "partition", "cluster.partition"),
    (("-J", "--job-name", "--name"), "name", str, None, "job name; runs go to RUNS/<name>/<job id>/", None),
    (("-C", "--constraint"), "constraint", one_line, None, "node features (Perlmutter: gpu)", "cluster.constraint"),
    (("-c", "--cpus-per-task"), "cpus_per_task", _count, "N", "CPUs per task", "cluster.cpus_per_task"),
    (("--gpus-per-node",), "gpus_per_node", gpu_count, "N", "GPUs per node, one task each", "cluster.gpus_per_node"),
    (("-d", "--dependency"), "dependency", one_line, None, "start after other jobs, e.g. afterok:123", None),
    (("--mem",), "mem", memory, None, "memory per node, e.g. 200G; 0: all of it", "cluster.mem_gb"),
)
READERS: dict[str, Any] = {dest: read for _, dest, read, _, _, _ in OWN_FLAGS}  # --sbatch KEY=VALUE's too


def profile_flags() -> dict[str, tuple[str, ...]]:
    """The profile keys a submission flag stands in for (the reference's "set by")."""
    return {key: ("/".join(flags),) for flags, _, _, _, _, key in OWN_FLAGS if key}


def add_slurm_options(g: argparse._ArgumentGroup) -> None:
    """sbatch's options on a parser's group: OWN ones with their help, PASSED and REFUSED silently (the
    group's description, SLURM_GROUP, names them)."""
    for flags, dest, read, metavar, text, key in OWN_FLAGS:
        g.add_argument(*flags, dest=dest, type=read, metavar=metavar, help=f"{text} [{key}]" if key else text)
    g.add_argument(
        "--exclusive",
        nargs="?",
        const=True,
        type=optional_value,
        metavar="user|mcs",
        help="whole nodes, no other job on them",
    )
    g.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="[ALL,|NONE,]NAME[=VALUE],...",
        help="the job's environment as sbatch reads it: ALL (default: this one) or NONE, then variables; a bare "
        "NAME takes its value from here (repeatable)",
    )
    g.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="any other sbatch option, as --KEY[=VALUE] (repeatable; e.g. mail-type=END, exclusive)",
    )
    g.add_argument("-G", dest="job_gpus", type=_count, metavar="N", help=argparse.SUPPRESS)  # refused: merge_gpus
    for long, (short, kind) in PASSED.items():
        passed = type("Passed", (_Passed,), {"option": long})
        g.add_argument(
            *_flags(long, short),
            dest="sbatch_passed",
            action=passed,
            nargs=NARGS[kind],
            default=[],
            help=argparse.SUPPRESS,
        )
    for long, (short, kind, way) in REFUSED.items():
        refused = type("Refused", (_Refused,), {"option": long, "way": way})
        g.add_argument(
            *_flags(long, short), dest="sbatch_refused", action=refused, nargs=NARGS[kind], help=argparse.SUPPRESS
        )


# sbatch's options whose value comes only after `=` (--exclusive[=user], --nice[=N], -k, --get-user-env[=T]):
# bare, they take no next word (hpc/core/cli.py Parser.attached_only)
ATTACHED_ONLY = frozenset(
    ["--exclusive", *(f for long, (short, kind) in PASSED.items() if kind == OPTIONAL for f in _flags(long, short))]
)


def optional_value(text: str) -> str | bool:
    """An optional value as given after `=`; bare (BARE), the flag alone."""
    return True if text == BARE else text


SLURM_GROUP = (
    "Slurm: sbatch's options with sbatch's meaning. Every other option of sbatch(1) is written to the job's "
    "script as given (--mail-type END, --reservation R, -H, -w nid001, ...) or refused naming the way (-o, -n, "
    "--array, --signal, ...); a newer one goes as --sbatch KEY[=VALUE]."
)


# ---- from the parsed command line to what is asked of sbatch ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What a command line asks of Slurm beyond the job's shape and time, as sbatch reads it (None: the
    profile's, or sbatch's default)."""

    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    dependency: str | None = None
    exclusive: str | bool | None = None
    exports: Exports = dataclasses.field(default_factory=Exports)
    extra: Mapping[str, str | bool] = dataclasses.field(default_factory=dict)  # written as given

    def slurm_only(self) -> str | None:
        """The first option given that means something to Slurm alone (for --local's refusal), or None."""
        for flag, value in (
            ("--constraint", self.constraint),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
            ("--dependency", self.dependency),
            ("--exclusive", self.exclusive),
        ):
            if value is not None:
                return f"{flag} {value}" if value is not True else flag
        if self.extra:
            key, value = next(iter(self.extra.items()))
            return f"--{key}" + ("" if value is True else f" {value}")
        return None


def merge_sbatch_words(args: argparse.Namespace) -> None:
    """`--sbatch KEY[=VALUE]` of an OWN option onto its flag (the same value twice is fine, two are one line),
    the rest into `args.sbatch_passed`; then --gpus-per-node onto --gpus (the toolkit's, per node) and -G
    (sbatch's, per job) refused naming the per-node count."""
    for item in args.sbatch:
        key, eq, value = item.partition("=")
        key = key.removeprefix("--")
        where = f"command line: --sbatch {shown(item)}"
        if not SBATCH_KEY.fullmatch(key):
            raise UsageError(f"{where}: {shown(key)} is not an sbatch option name (e.g. mail-type=END)")
        if eq:
            one_line_value(key, value)
        if key in REFUSED:
            raise UsageError(f"{where}: sbatch's --{key} is not taken here: {REFUSED[key][2]}")
        if key == "image":
            raise UsageError(f"{where}: the container image is the profile's: --set cluster.image=IMAGE")
        if key == "gpus":  # sbatch's --gpus counts the whole job's, as -G: refused the same way
            try:
                count = _count(value) if eq else None
            except argparse.ArgumentTypeError as e:
                raise UsageError(f"{where}: {e}") from None
            if count is None:
                raise UsageError(f"{where}: --gpus takes a value (--gpus-per-node N: the GPUs of each node)")
            refuse_job_gpus(count, args.nodes, f"--sbatch {shown(item)}")
        if key not in OWN:
            args.sbatch_passed = [*args.sbatch_passed, (key, value if eq else True)]
            continue
        dest = OWN[key][1]
        if key == "export":
            args.export = [*args.export, value]
            continue
        if key in ("wait", "exclusive") and not eq:
            given: Any = True
        elif not eq:
            raise UsageError(f"{where}: --{key} takes a value (--sbatch {key}=VALUE, or --{key} VALUE)")
        else:
            try:
                given = READERS.get(dest, str)(value)
            except argparse.ArgumentTypeError as e:
                raise UsageError(f"{where}: {e}") from None
        before = getattr(args, dest)
        if before not in (None, False) and before != given:
            raise UsageError(f"{where} and {flag_of(key)} {before}: the same option twice; say it once")
        setattr(args, dest, given)
    merge_gpus(args)


def flag_of(key: str) -> str:
    short = OWN[key][0]
    return f"-{short}" if short else f"--{key}"


def merge_gpus(args: argparse.Namespace) -> None:
    """--gpus-per-node is the toolkit's --gpus (GPUs per node); sbatch's -G counts the whole job's."""
    if args.gpus_per_node is not None:
        if args.gpus is not None and args.gpus != args.gpus_per_node:
            raise UsageError(
                f"command line: --gpus {args.gpus} and --gpus-per-node {args.gpus_per_node}: both count GPUs per "
                "node; say one"
            )
        args.gpus = args.gpus_per_node
    if args.job_gpus is not None:
        refuse_job_gpus(args.job_gpus, args.nodes, f"-G {args.job_gpus}")


def refuse_job_gpus(count: int, nodes: int | None, given: str) -> None:
    """sbatch's -G/--gpus counts the whole job's GPUs: one line naming the per-node count it means."""
    nodes = nodes or 1
    way = (
        f"say --gpus-per-node {count // nodes}"
        if count % nodes == 0
        else f"{count} GPUs do not divide over {nodes} node(s)"
    )
    raise UsageError(
        f"command line: {given}: sbatch's -G/--gpus counts the GPUs of the whole job; the toolkit asks per node (one "
        f"task each): {way}"
    )


def job_options(args: argparse.Namespace, environ: Mapping[str, str]) -> JobOptions:
    """The parsed command line's Slurm options, checked, as one value."""
    extra = dict(args.sbatch_passed)
    if args.mem is not None and any(k in extra for k in MEMORY_PER):
        other = next(k for k in MEMORY_PER if k in extra)
        raise UsageError(f"command line: --mem {args.mem} and --{other}: sbatch takes one of them")
    return JobOptions(
        account=args.account,
        qos=args.qos,
        partition=args.partition,
        constraint=args.constraint,
        cpus_per_task=args.cpus_per_task,
        mem=args.mem,
        dependency=args.dependency,
        exclusive=args.exclusive,
        exports=parse_export(args.export, environ),
        extra=extra,
    )
