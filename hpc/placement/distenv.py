"""Map a launcher's environment (torchrun, srun, submitit, nothing) to torch.distributed's.

Pure functions over environment mappings; no torch import, so the CLI is instant and the logic
is testable anywhere:

    >>> from_environ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", ...}).rank

`python -m hpc.distenv` (hpc/placement/distenvcli.py) prints `export KEY=VALUE` lines for sbatch scripts.

Why not submitit's helpers: `submitit.helpers.TorchDistributedEnvironment` reads `os.environ` from
inside `JobEnvironment`, works only inside a submitit job, takes MASTER_ADDR from the *job* node list
rather than the step's, assumes the same number of tasks on every node
(`local_world_size = ntasks // nnodes`, wrong for `SLURM_TASKS_PER_NODE=2(x3),1`), and its node-list
parser disagrees with Slurm's (hpc/placement/hostlist.py follows Slurm's own and is tested against
`scontrol show hostnames`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping

from hpc.core.errors import DistEnvError, HostlistError
from hpc.core.meet import free_port
from hpc.placement.hostlist import MAX_COUNT, expand_hostlist, expand_tasks_per_node
from hpc.placement.torchrun import torchrun_args, torchrun_forwards_signals

# ----------------------------------------------------------------------------------------------
# Distributed environment
# ----------------------------------------------------------------------------------------------

LAUNCHER_VARIABLE = "HPC_RANK_LAUNCHER"  # what placed a rank that sees torchrun's variables (the runner sets it)
# No port is computed from the job id any more: it is in `squeue` and every rank's argv, so another user
# of the node could take that port first or host a store there. The ranks' store's port is rank 0's
# runner's pick (hpc/core/meet.py); a batch shell picks one for what it exports and for torchrun's agents.


@dataclasses.dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int | None  # None: not decided here (rank 0's runner picks it: hpc/core/meet.py)
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
            (self.master_port is None or 0 < self.master_port < 65536, f"master port {self.master_port} out of range"),
        ]
        for ok, message in checks:
            if not ok:
                raise DistEnvError(f"{self.launcher}: {message}")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads (plus torchrun's extras); MASTER_PORT
        where it is decided."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            **({"MASTER_PORT": str(self.master_port)} if self.master_port is not None else {}),
        }


def env_int(env: Mapping[str, str], key: str, source: str, minimum: int = 0) -> int:
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
    if not minimum <= number <= MAX_COUNT:
        raise DistEnvError(f"{source}: {key}={number}: must be in {minimum}..{MAX_COUNT}")
    return number


def _require(env: Mapping[str, str], keys: list[str], source: str, because: str) -> None:
    missing = [k for k in keys if not env.get(k)]
    if missing:
        raise DistEnvError(f"{source}: {because} but {', '.join(missing)} not set")


def _master_port(env: Mapping[str, str], source: str) -> int | None:
    """An explicit port (MASTER_PORT exported by a batch shell, HPC_MASTER_PORT); None: rank 0's pick."""
    for key in ("MASTER_PORT", "HPC_MASTER_PORT"):
        if env.get(key):
            return env_int(env, key, source, minimum=1)
    return None


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    src = "torchrun/env"
    _require(env, ["WORLD_SIZE"], src, "RANK is set")
    world_size = env_int(env, "WORLD_SIZE", src, minimum=1)
    local_rank = env_int(env, "LOCAL_RANK", src) if env.get("LOCAL_RANK") else 0
    local_world_size = (
        env_int(env, "LOCAL_WORLD_SIZE", src, minimum=1)
        if env.get("LOCAL_WORLD_SIZE")
        else (world_size if not env.get("LOCAL_RANK") else max(local_rank + 1, 1))
    )
    if world_size > 1:
        _require(env, ["MASTER_ADDR", "MASTER_PORT"], src, f"WORLD_SIZE={world_size}")
    num_nodes = max(1, world_size // local_world_size) if world_size % local_world_size == 0 else 1
    node_rank = (
        env_int(env, "GROUP_RANK", src) if env.get("GROUP_RANK") else env_int(env, "RANK", src) // local_world_size
    )
    return DistEnv(
        rank=env_int(env, "RANK", src),
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=max(num_nodes, node_rank + 1),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=env_int(env, "MASTER_PORT", src) if env.get("MASTER_PORT") else 29500,
        # a rank started by the toolkit's runner keeps the launcher that placed the runner (hpc/launch/rank/runner.py)
        launcher=env.get(LAUNCHER_VARIABLE) or "torchrun",
        elastic_attempt=(
            env_int(env, "TORCHELASTIC_RESTART_COUNT", src) if env.get("TORCHELASTIC_RESTART_COUNT") else 0
        )
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        else None,
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
    if not hosts or not all(hosts):  # Slurm expands "[" to one empty name
        raise DistEnvError(f"{src}: {nodelist_key}={env[nodelist_key]!r} names no host")
    tasks_per_node = expand_tasks_per_node(env[tasks_key])
    ntasks_key = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    world_size = env_int(env, ntasks_key, src, minimum=1)
    num_nodes = len(hosts)
    nnodes_key = "SLURM_STEP_NUM_NODES" if env.get("SLURM_STEP_NUM_NODES") else "SLURM_NNODES"
    if env.get(nnodes_key) and env_int(env, nnodes_key, src) != num_nodes:
        raise DistEnvError(
            f"{src}: {nnodes_key}={env[nnodes_key]} but {nodelist_key}={env[nodelist_key]!r} has {num_nodes} hosts"
        )
    if len(tasks_per_node) != num_nodes:
        raise DistEnvError(
            f"{src}: {tasks_key}={env[tasks_key]!r} lists {len(tasks_per_node)} nodes, {nodelist_key} has {num_nodes}"
        )
    if sum(tasks_per_node) != world_size:
        raise DistEnvError(
            f"{src}: {tasks_key}={env[tasks_key]!r} sums to {sum(tasks_per_node)}, not {world_size} tasks"
        )
    node_rank = env_int(env, "SLURM_NODEID", src)
    rank = env_int(env, "SLURM_PROCID", src)
    if not 0 <= node_rank < num_nodes:
        raise DistEnvError(f"{src}: SLURM_NODEID={node_rank} but the step has {num_nodes} nodes")
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{src}: SLURM_PROCID={rank} but {ntasks_key}={world_size}")
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=env_int(env, "SLURM_LOCALID", src),
        local_world_size=tasks_per_node[node_rank],
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=env.get("MASTER_ADDR") or hosts[0],
        master_port=_master_port(env, src),
        launcher="slurm",
    )


def _from_submitit_local(env: Mapping[str, str]) -> DistEnv:
    src = "submitit local"
    # what made this submitit's local executor: say that, not what was not set
    seen = "SUBMITIT_EXECUTOR=local" if env.get("SUBMITIT_EXECUTOR") == "local" else "SUBMITIT_LOCAL_NTASKS is set"
    _require(env, ["SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID"], src, seen)
    world_size = env_int(env, "SUBMITIT_LOCAL_NTASKS", src, minimum=1)
    rank = env_int(env, "SUBMITIT_LOCAL_GLOBALID", src)
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{src}: SUBMITIT_LOCAL_GLOBALID={rank} but SUBMITIT_LOCAL_NTASKS={world_size}")
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=env_int(env, "SUBMITIT_LOCAL_LOCALID", src),
        local_world_size=world_size,
        node_rank=0,
        num_nodes=1,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_master_port(env, src),
        launcher="submitit-local",
    )


def from_environ(env: Mapping[str, str]) -> DistEnv:
    """Work out this process's place in the job from its environment.

    Order: torchrun-style variables already set (RANK, ...) pass through; submitit's local executor
    (whatever Slurm variables an outer job left); an srun task (Slurm sets SLURM_STEP_ID only inside a
    step); a Slurm batch-script shell
    (SLURM_JOB_ID but no step: SLURM_PROCID=0 is set there too, yet it is *not* rank 0 of the job's
    tasks, so it is treated as one standalone process); otherwise a single process.
    """
    if env.get("RANK") not in (None, ""):
        return _from_torchrun(env)
    if env.get("WORLD_SIZE") or env.get("LOCAL_RANK"):
        raise DistEnvError("torchrun/env: WORLD_SIZE or LOCAL_RANK is set but RANK is not")
    if env.get("SUBMITIT_EXECUTOR") == "local" or env.get("SUBMITIT_LOCAL_NTASKS"):
        return _from_submitit_local(env)  # first: `--local` inside an salloc or srun shell is still local
    if env.get("SLURM_STEP_ID") not in (None, "") or env.get("SLURM_STEPID") not in (None, ""):
        return _from_srun(env)
    if env.get("SLURM_JOB_ID"):
        # Batch shell: rendezvous values for the job's later `srun` steps, but a world of one here.
        hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or ["127.0.0.1"]
        return DistEnv(
            0,
            1,
            0,
            1,
            0,
            1,
            env.get("MASTER_ADDR") or hosts[0],
            _master_port(env, "slurm batch"),
            "slurm-batch",
        )
    return DistEnv(0, 1, 0, 1, 0, 1, env.get("MASTER_ADDR") or "127.0.0.1", _master_port(env, "single"), "single")


def export_lines(dist: DistEnv) -> list[str]:
    """Shell lines for `eval "$(python -m hpc.distenv)"`.

    In a batch-script shell only MASTER_ADDR/MASTER_PORT are exported: exporting RANK=0 there would
    be inherited by every task of a later `srun` and make them all claim rank 0. A task's lines need its
    MASTER_PORT (the batch shell's export): DistEnvError where it has none.
    """
    if dist.master_port is None:
        raise DistEnvError(
            f"{dist.launcher}: MASTER_PORT is not set: export it from the batch script first "
            '(eval "$(python -m hpc.distenv)" there picks a free port of the first node)'
        )
    items = dist.torch_env()
    if dist.launcher == "slurm-batch":
        items = {k: items[k] for k in ("MASTER_ADDR", "MASTER_PORT")}
    return [f"export {k}={shlex.quote(v)}" for k, v in items.items()]


def slurm_torchrun_args(
    env: Mapping[str, str], nproc_per_node: int, max_restarts: int, port: int | None = None
) -> list[str]:
    """torchrun_args for the Slurm job `env` describes: its node count, first node and job id; the agents'
    rendezvous on `port`, else a free port of this node (the batch shell's, the job's first node)."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise DistEnvError("--torchrun-args: SLURM_JOB_ID is not set (run it inside a Slurm job)")
    if nproc_per_node < 1 or max_restarts < 0:
        raise DistEnvError(f"--torchrun-args {nproc_per_node} --max-restarts {max_restarts}: must be >= 1 and >= 0")
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or ["127.0.0.1"]
    nnodes = env_int(env, "SLURM_NNODES", "slurm") if env.get("SLURM_NNODES") else len(hosts)
    endpoint = f"{hosts[0]}:{port if port is not None else free_port(hosts[0])}"
    return torchrun_args(nnodes, nproc_per_node, endpoint, job_id, max_restarts, torchrun_forwards_signals())
