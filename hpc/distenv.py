"""Map a launcher's environment (torchrun, srun, submitit, nothing) to torch.distributed's.

Pure functions over environment mappings; no torch import, so the CLI is instant and the logic
is testable anywhere:

    >>> from_environ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", ...}).rank

`python -m hpc.distenv` prints `export KEY=VALUE` lines for sbatch scripts.

Why not submitit's helpers: `submitit.helpers.TorchDistributedEnvironment` reads `os.environ` from
inside `JobEnvironment`, works only inside a submitit job, takes MASTER_ADDR from the *job* node list
rather than the step's, assumes the same number of tasks on every node
(`local_world_size = ntasks // nnodes`, wrong for `SLURM_TASKS_PER_NODE=2(x3),1`), and its node-list
parser expands several bracket groups as a plain cartesian product, which disagrees with Slurm for three
or more groups and for mixed zero padding. The hostlist code below follows Slurm's own
`src/common/hostlist.c` and is tested against `scontrol show hostnames`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import sys
from typing import Mapping

__all__ = [
    "DistEnv",
    "DistEnvError",
    "HostlistError",
    "expand_hostlist",
    "expand_tasks_per_node",
    "from_environ",
    "master_port_for_job",
]

_SEPARATORS = "\t, "
_ULONG_MAX = 2**64 - 1
_MAX_COUNT = 1 << 20  # ranks, nodes, tasks: more than any machine has; a larger value is garbage
# Slurm's limits (hostlist.c: MAX_RANGE, MAX_PREFIX_CNT): a guard against "n[0-999999999]".
_MAX_RANGE = 64 * 1024  # scontrol: a[0-65535] expands, a[0-65536] is refused
_MAX_PREFIX_CNT = 64 * 1024


class HostlistError(ValueError):
    """A hostlist expression Slurm would reject."""


class DistEnvError(ValueError):
    """Launcher variables that contradict each other or are incomplete."""


# ----------------------------------------------------------------------------------------------
# Hostlists
# ----------------------------------------------------------------------------------------------


def _strtoul(text: str) -> tuple[int | None, str]:
    """C's strtoul(text, &end, 10): (value or None when no digits, unparsed rest).

    Slurm parses range bounds with strtoul, so " 1" and "+1" are accepted and the *width* still
    counts the blank or sign ("a[ 1-2]" expands to a01 a02, as scontrol does).
    """
    i, n = 0, len(text)
    while i < n and text[i] in " \t\n\v\f\r":
        i += 1
    negative = False
    if i < n and text[i] in "+-":
        negative = text[i] == "-"
        i += 1
    j = i
    while j < n and text[j].isdigit() and text[j].isascii():
        j += 1
    if j == i:
        return None, text
    value = min(int(text[i:j]), _ULONG_MAX)
    if negative:
        value = (-value) % (_ULONG_MAX + 1)
    return value, text[j:]


def _parse_single_range(text: str, expr: str) -> tuple[int, int, int]:
    """'lo-hi' or 'n' inside brackets -> (lo, hi, width). Mirrors hostlist.c:_parse_single_range."""
    bad = HostlistError(f"invalid range {text!r} in hostlist {expr!r}")
    if "x" in text:  # Slurm reserves 'x' for multi-dimensional boxes
        raise bad
    lo_text, dash, hi_text = text.partition("-")
    if dash and hi_text.startswith("-"):
        raise bad
    width = len(lo_text)
    lo, lo_rest = _strtoul(lo_text)
    if lo is None:
        raise bad
    if dash and hi_text:  # like Slurm, text after the low bound goes unchecked only here
        hi, rest = _strtoul(hi_text)
        if hi is None or rest:
            raise bad
    else:
        if lo_rest:
            raise bad
        hi = lo
    if lo > hi:
        raise bad
    if hi - lo + 1 > _MAX_RANGE:
        raise HostlistError(f"too many hosts in range {text!r} of hostlist {expr!r}")
    return lo, hi, width


def _parse_range_list(text: str, expr: str) -> list[tuple[int, int, int]]:
    return [_parse_single_range(part, expr) for part in text.split(",")]


def _push_ranges(out: list[str], prefix: str, ranges: list[tuple[int, int, int]], expr: str,
                 top: bool = True) -> None:
    """Expand `prefix` (which may hold earlier bracket groups) against the last group's ranges.

    Slurm expands the *rightmost* bracket of the prefix in the outer loop and recurses leftwards, so
    a[1-2]b[3-4]c[5-6] gives a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ..., not a lexicographic product.
    A bad group met inside that recursion drops the name silently (hostlist.c keeps MAX(rc, rc1) over
    the recursive calls); only the top-level groups make the whole list invalid. scontrol agrees.
    """
    open_at = prefix.rfind("[")
    close_at = prefix.rfind("]", open_at + 1) if open_at >= 0 else -1
    if open_at < 0 or close_at < 0:
        for lo, hi, width in ranges:
            out.extend(f"{prefix}{v:0{width}d}" for v in range(lo, hi + 1))
        return
    head, inner, tail = prefix[:open_at], prefix[open_at + 1 : close_at], prefix[close_at + 1 :]
    try:
        prefix_ranges = _parse_range_list(inner, expr)
    except HostlistError:
        if top:
            raise
        return
    count = 0
    for lo, hi, width in prefix_ranges:
        count += hi - lo + 1
        if count > _MAX_PREFIX_CNT:
            if top:
                raise HostlistError(f"too many hosts in hostlist {expr!r}")
            return
        for value in range(lo, hi + 1):
            new_prefix = f"{head}{value:0{width}d}{tail}"
            if "[" in head:
                _push_ranges(out, new_prefix, ranges, expr, top=False)
            else:
                for rlo, rhi, rwidth in ranges:
                    out.extend(f"{new_prefix}{v:0{rwidth}d}" for v in range(rlo, rhi + 1))


def _tokens(expr: str):
    """Split on tabs, commas and blanks, except inside brackets (hostlist.c:_next_tok)."""
    i, n = 0, len(expr)
    while True:
        while i < n and expr[i] in _SEPARATORS:
            i += 1
        if i >= n:
            return
        start = parse = i
        while True:
            while i < n and expr[i] not in _SEPARATORS:
                i += 1
            jumped = False
            while True:
                open_at = expr.find("[", parse)
                if open_at < 0 or open_at > i:
                    break
                close_at = expr.find("]", parse)
                if close_at < 0 or close_at < open_at:
                    break
                if close_at < i:
                    parse = close_at + 1
                    continue
                i = close_at
                jumped = True
                break
            if not jumped:
                break
        yield expr[start:i]


def _single_host(token: str) -> str:
    # A plain name round-trips, except that Slurm clamps an over-long numeric suffix to ULONG_MAX.
    j = len(token)
    while j > 0 and token[j - 1].isdigit() and token[j - 1].isascii():
        j -= 1
    if j == len(token):
        return token
    suffix = token[j:]
    return f"{token[:j]}{min(int(suffix), _ULONG_MAX):0{len(suffix)}d}"


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist exactly as `scontrol show hostnames` does.

    Order and duplicates are kept. Supports zero padding (width of the low bound), comma lists
    inside and outside brackets, several bracket groups per name (`gpu-a[1-2]b[01-02]`) and
    Slurm's separators (comma, blank, tab). Raises HostlistError where Slurm says "Invalid hostlist".
    """
    hosts: list[str] = []
    for token in _tokens(expr):
        open_at = token.rfind("[")
        if open_at < 0:
            hosts.append(_single_host(token))
            continue
        prefix, rest = token[:open_at], token[open_at + 1 :]
        close_at = rest.find("]")
        if close_at < 0:
            # No closing bracket: Slurm keeps the text, closing it if there was a prefix.
            hosts.append(_single_host(prefix + "]") if prefix else _single_host(rest))
            continue
        if close_at + 1 < len(rest) and rest[close_at + 1] != ",":
            raise HostlistError(f"invalid hostlist {expr!r}: text after ']' in {token!r}")
        _push_ranges(hosts, prefix, _parse_range_list(rest[:close_at], expr), expr)
    return hosts


def expand_tasks_per_node(expr: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in expr.split(","):
        part = part.strip()
        value, has_reps, reps = part.partition("(x")
        try:
            if has_reps and not reps.endswith(")"):
                raise ValueError
            count, repeat = int(value), int(reps[:-1]) if has_reps else 1
        except ValueError:
            raise DistEnvError(f"SLURM_TASKS_PER_NODE={expr[:80]!r}: cannot parse {part[:40]!r}") from None
        if not 0 < repeat <= _MAX_COUNT - len(counts):  # checked before the list is made
            raise DistEnvError(f"SLURM_TASKS_PER_NODE={expr[:80]!r}: repeat count {repeat} makes more than "
                               f"{_MAX_COUNT} nodes" if repeat > 0 else f"SLURM_TASKS_PER_NODE={expr[:80]!r}: "
                               f"repeat count {repeat} must be >= 1")
        counts.extend([count] * repeat)
    if not counts or any(c < 0 for c in counts):
        raise DistEnvError(f"SLURM_TASKS_PER_NODE={expr[:80]!r}: expected counts like '2(x3),1'")
    return counts


# ----------------------------------------------------------------------------------------------
# Distributed environment
# ----------------------------------------------------------------------------------------------

# Below Linux's default ephemeral range (32768-60999), so no outgoing connection on the node can
# already hold the port; wide enough that two jobs sharing a node rarely collide.
_PORT_BASE, _PORT_SPAN = 20000, 12000


def master_port_for_job(job_id: str) -> int:
    """A port every task of the job computes alike (the job id is all they share before rendezvous)."""
    digest = hashlib.sha256(str(job_id).encode()).digest()
    return _PORT_BASE + int.from_bytes(digest[:4], "big") % _PORT_SPAN


def torchrun_args(nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str, max_restarts: int,
                  forward_signals: bool) -> list[str]:
    """torchrun's arguments for one agent per node: c10d rendezvous at `endpoint` (host:port, the
    job's first node), worker-group restarts. With forward_signals, SIGUSR2 (Slurm's warning before
    the time limit, or preemption) is passed on to the workers, which checkpoint and stop."""
    args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", f"--max-restarts={max_restarts}"]
    if forward_signals:
        args.append("--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2")
    return args


def torchrun_forwards_signals() -> bool:
    """Whether this torch's torchrun has --signals-to-handle (newer releases), read from its source
    rather than imported: no torch import here."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    try:
        return "--signals-to-handle" in (Path(spec.origin).parent / "distributed" / "run.py").read_text()
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "slurm" | "submitit-local" | "slurm-batch" | "single"
    # Under torchrun with its agent's store (TORCHELASTIC_USE_AGENT_STORE): which start of the worker
    # group this is (TORCHELASTIC_RESTART_COUNT). The process group keys its rendezvous by it.
    elastic_attempt: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.world_size >= 1, f"world size {self.world_size} < 1"),
            (0 <= self.rank < self.world_size, f"rank {self.rank} not in [0, world size {self.world_size})"),
            (self.local_world_size >= 1, f"local world size {self.local_world_size} < 1"),
            (
                0 <= self.local_rank < self.local_world_size,
                f"local rank {self.local_rank} not in [0, local world size {self.local_world_size})",
            ),
            (self.num_nodes >= 1, f"number of nodes {self.num_nodes} < 1"),
            (0 <= self.node_rank < self.num_nodes, f"node rank {self.node_rank} not in [0, {self.num_nodes})"),
            (0 < self.master_port < 65536, f"master port {self.master_port} out of range"),
        ]
        for ok, message in checks:
            if not ok:
                raise DistEnvError(f"{self.launcher}: {message}")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads (plus torchrun's extras)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _int(env: Mapping[str, str], key: str, source: str, minimum: int = 0) -> int:
    """env[key] as an integer in [minimum, 2**20] (ranks, sizes, ports all fit), or DistEnvError naming it."""
    value = env.get(key)
    if value is None or value == "":
        raise DistEnvError(f"{source}: {key} is not set")
    try:
        number = int(value.strip()) if len(value) < 32 else None
    except ValueError:
        number = None
    if number is None:
        raise DistEnvError(f"{source}: {key}={value[:40]!r} is not an integer")
    if not minimum <= number <= _MAX_COUNT:
        raise DistEnvError(f"{source}: {key}={number}: must be in {minimum}..{_MAX_COUNT}")
    return number


def _require(env: Mapping[str, str], keys: list[str], source: str, because: str) -> None:
    missing = [k for k in keys if not env.get(k)]
    if missing:
        raise DistEnvError(f"{source}: {because} but {', '.join(missing)} not set")


def _master_port(env: Mapping[str, str], job_id: str | None, source: str) -> int:
    for key in ("MASTER_PORT", "HPC_MASTER_PORT"):  # explicit overrides win
        if env.get(key):
            return _int(env, key, source)
    return master_port_for_job(job_id) if job_id else 29500


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    src = "torchrun/env"
    _require(env, ["WORLD_SIZE"], src, "RANK is set")
    world_size = _int(env, "WORLD_SIZE", src, minimum=1)
    local_rank = _int(env, "LOCAL_RANK", src) if env.get("LOCAL_RANK") else 0
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", src, minimum=1) if env.get("LOCAL_WORLD_SIZE") else (
        world_size if not env.get("LOCAL_RANK") else max(local_rank + 1, 1)
    )
    if world_size > 1:
        _require(env, ["MASTER_ADDR", "MASTER_PORT"], src, f"WORLD_SIZE={world_size}")
    num_nodes = max(1, world_size // local_world_size) if world_size % local_world_size == 0 else 1
    node_rank = _int(env, "GROUP_RANK", src) if env.get("GROUP_RANK") else _int(env, "RANK", src) // local_world_size
    return DistEnv(
        rank=_int(env, "RANK", src),
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=max(num_nodes, node_rank + 1),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", src) if env.get("MASTER_PORT") else 29500,
        launcher="torchrun",
        elastic_attempt=(_int(env, "TORCHELASTIC_RESTART_COUNT", src) if env.get("TORCHELASTIC_RESTART_COUNT") else 0)
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else None,
    )


def _from_srun(env: Mapping[str, str]) -> DistEnv:
    src = "slurm step"
    _require(
        env,
        ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_JOB_ID"],
        src,
        f"SLURM_STEP_ID={env.get('SLURM_STEP_ID')} marks an srun task",
    )
    nodelist_key = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    tasks_key = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    _require(env, [nodelist_key, tasks_key], src, "an srun task")
    try:
        hosts = expand_hostlist(env[nodelist_key])
    except HostlistError as e:
        raise DistEnvError(f"{src}: {nodelist_key}: {e}") from None
    if not hosts:
        raise DistEnvError(f"{src}: {nodelist_key}={env[nodelist_key]!r} names no host")
    tasks_per_node = expand_tasks_per_node(env[tasks_key])
    ntasks_key = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    world_size = _int(env, ntasks_key, src, minimum=1)
    num_nodes = len(hosts)
    nnodes_key = "SLURM_STEP_NUM_NODES" if env.get("SLURM_STEP_NUM_NODES") else "SLURM_NNODES"
    if env.get(nnodes_key) and _int(env, nnodes_key, src) != num_nodes:
        raise DistEnvError(
            f"{src}: {nnodes_key}={env[nnodes_key]} but {nodelist_key}={env[nodelist_key]!r} has {num_nodes} hosts"
        )
    if len(tasks_per_node) != num_nodes:
        raise DistEnvError(
            f"{src}: {tasks_key}={env[tasks_key]!r} lists {len(tasks_per_node)} nodes, "
            f"{nodelist_key} has {num_nodes}"
        )
    if sum(tasks_per_node) != world_size:
        raise DistEnvError(f"{src}: {tasks_key}={env[tasks_key]!r} sums to {sum(tasks_per_node)}, not {world_size} tasks")
    node_rank = _int(env, "SLURM_NODEID", src)
    rank = _int(env, "SLURM_PROCID", src)
    if not 0 <= node_rank < num_nodes:
        raise DistEnvError(f"{src}: SLURM_NODEID={node_rank} but the step has {num_nodes} nodes")
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{src}: SLURM_PROCID={rank} but {ntasks_key}={world_size}")
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=_int(env, "SLURM_LOCALID", src),
        local_world_size=tasks_per_node[node_rank],
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=env.get("MASTER_ADDR") or hosts[0],
        master_port=_master_port(env, env["SLURM_JOB_ID"], src),
        launcher="slurm",
    )


def _from_submitit_local(env: Mapping[str, str]) -> DistEnv:
    src = "submitit local"
    _require(env, ["SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID"], src,
             "SUBMITIT_EXECUTOR=local")
    world_size = _int(env, "SUBMITIT_LOCAL_NTASKS", src, minimum=1)
    rank = _int(env, "SUBMITIT_LOCAL_GLOBALID", src)
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{src}: SUBMITIT_LOCAL_GLOBALID={rank} but SUBMITIT_LOCAL_NTASKS={world_size}")
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=_int(env, "SUBMITIT_LOCAL_LOCALID", src),
        local_world_size=world_size,
        node_rank=0,
        num_nodes=1,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_master_port(env, env.get("SUBMITIT_LOCAL_JOB_ID"), src),
        launcher="submitit-local",
    )


def from_environ(env: Mapping[str, str]) -> DistEnv:
    """Work out this process's place in the job from its environment.

    Order: torchrun-style variables already set (RANK, ...) pass through; an srun task (Slurm sets
    SLURM_STEP_ID only inside a step); submitit's local executor; a Slurm batch-script shell
    (SLURM_JOB_ID but no step: SLURM_PROCID=0 is set there too, yet it is *not* rank 0 of the job's
    tasks, so it is treated as one standalone process); otherwise a single process.
    """
    if env.get("RANK") not in (None, ""):
        return _from_torchrun(env)
    if env.get("WORLD_SIZE") or env.get("LOCAL_RANK"):
        raise DistEnvError("torchrun/env: WORLD_SIZE or LOCAL_RANK is set but RANK is not")
    if env.get("SLURM_STEP_ID") not in (None, "") or env.get("SLURM_STEPID") not in (None, ""):
        return _from_srun(env)
    if env.get("SUBMITIT_EXECUTOR") == "local" or env.get("SUBMITIT_LOCAL_NTASKS"):
        return _from_submitit_local(env)
    if env.get("SLURM_JOB_ID"):
        # Batch shell: rendezvous values for the job's later `srun` steps, but a world of one here.
        hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or ["127.0.0.1"]
        return DistEnv(0, 1, 0, 1, 0, 1, env.get("MASTER_ADDR") or hosts[0],
                       _master_port(env, env["SLURM_JOB_ID"], "slurm batch"), "slurm-batch")
    return DistEnv(0, 1, 0, 1, 0, 1, env.get("MASTER_ADDR") or "127.0.0.1",
                   _master_port(env, None, "single"), "single")


def export_lines(dist: DistEnv) -> list[str]:
    """Shell lines for `eval "$(python -m hpc.distenv)"`.

    In a batch-script shell only MASTER_ADDR/MASTER_PORT are exported: exporting RANK=0 there would
    be inherited by every task of a later `srun` and make them all claim rank 0.
    """
    items = dist.torch_env()
    if dist.launcher == "slurm-batch":
        items = {k: items[k] for k in ("MASTER_ADDR", "MASTER_PORT")}
    return [f"export {k}={shlex.quote(v)}" for k, v in items.items()]


def slurm_torchrun_args(env: Mapping[str, str], nproc_per_node: int, max_restarts: int) -> list[str]:
    """torchrun_args for the Slurm job `env` describes: its node count, first node and job id."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise DistEnvError("--torchrun-args: SLURM_JOB_ID is not set (run it inside a Slurm job)")
    if nproc_per_node < 1 or max_restarts < 0:
        raise DistEnvError(f"--torchrun-args {nproc_per_node} --max-restarts {max_restarts}: must be >= 1 and >= 0")
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or ["127.0.0.1"]
    nnodes = _int(env, "SLURM_NNODES", "slurm") if env.get("SLURM_NNODES") else len(hosts)
    endpoint = f"{hosts[0]}:{master_port_for_job(job_id)}"
    return torchrun_args(nnodes, nproc_per_node, endpoint, job_id, max_restarts, torchrun_forwards_signals())


def main(argv: list[str] | None = None) -> int:
    import os

    from hpc.cli import Parser

    parser = Parser(
        prog="python -m hpc.distenv",
        description="Print `export KEY=VALUE` lines (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...) "
        "derived from torchrun, srun or submitit variables. Use: eval \"$(python -m hpc.distenv)\".",
    )
    parser.add_argument("--json", action="store_true", help="print the DistEnv as JSON instead")
    parser.add_argument("--hostlist", metavar="EXPR", help="only expand a Slurm hostlist, one host per line")
    parser.add_argument("--torchrun-args", type=int, metavar="NPROC_PER_NODE",
                        help="print torchrun's arguments for this Slurm job (one agent per node), quoted")
    parser.add_argument("--max-restarts", type=int, default=3, help="with --torchrun-args (default 3)")
    args = parser.parse_args(argv)
    if args.hostlist is not None:
        print("\n".join(expand_hostlist(args.hostlist)))
        return 0
    if args.torchrun_args is not None:
        print(" ".join(shlex.quote(a) for a in slurm_torchrun_args(os.environ, args.torchrun_args, args.max_restarts)))
        return 0
    dist = from_environ(os.environ)
    if args.json:
        import json

        print(json.dumps(dataclasses.asdict(dist), sort_keys=True))
    else:
        print("\n".join(export_lines(dist)))
    return 0


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.distenv`, or its console script): errors as one line, exit 2."""
    from hpc.cli import run

    return run("hpc.distenv", main, argv)


if __name__ == "__main__":
    from hpc import distenv  # the imported module, so its error classes are the ones hpc.cli catches

    sys.exit(distenv.cli())
