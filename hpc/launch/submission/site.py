"""A cluster profile's site practices, as a job's settings: which QOS a partial node goes to and what
it is charged, which account pays, where each rank sits, the container it runs in, and the fabric's
settings for jobs that span nodes. Pure functions of the profile and the job's shape (the sbatch text
is made of them: hpc/launch/submission/slurm.py; jobs/resnet152.sbatch asks `python -m hpc.config` for the same).
Each practice, with its public source, is in the README's Perlmutter table. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

from hpc.core.cli import shown
from hpc.core.errors import UsageError
from hpc.placement.affinity import GPU_ORDER
from hpc.settings.cluster import ClusterConfig
from hpc.settings.rankcommand import NCCL_FABRIC_VARIABLE

# The job's stop signal, before the time limit and at a preemption: the training checkpoints on it and
# scripts save on it (a script that does not catch USR2 is ended by it).
STOP_SIGNAL = "TERM"


def is_partial(cluster: ClusterConfig, nodes: int, gpus: int) -> bool:
    """A job of fewer GPUs than one node, which the profile sends to its shared QOS."""
    return bool(cluster.shared_qos) and nodes == 1 and gpus < cluster.gpus_per_node


class Charge(msgspec.Struct, frozen=True, kw_only=True):
    """What a job's points are charged: the QOS it asks for and the share of a node (node_share), recorded
    beside each point in index.json for the report's node-hours."""

    qos: str | None
    node_share: float


def node_share(cluster: ClusterConfig, nodes: int, gpus: int) -> float:
    """The nodes a job is charged for: whole nodes, or a partial node's share of its GPUs."""
    return gpus / cluster.gpus_per_node if is_partial(cluster, nodes, gpus) else float(nodes)


def job_env(cluster: ClusterConfig, nodes: int, gpus: int) -> dict[str, str]:
    """The profile's environment for this shape: the fabric's settings and NCCL's check only when the
    job spans nodes (inside a node NCCL uses NVLink and the plugin only slows start-up), the GPU order
    only on a whole node (a partial one sees just its own GPUs)."""
    env = dict(cluster.env)
    if nodes > 1:
        env.update(cluster.multinode_env)
        if cluster.nccl_fabric != "off":
            env[NCCL_FABRIC_VARIABLE] = cluster.nccl_fabric
    if cluster.gpu_order and gpus == cluster.gpus_per_node:
        env[GPU_ORDER] = ",".join(str(g) for g in cluster.gpu_order)
    return env


def container_prefix(cluster: ClusterConfig) -> list[str]:
    """The words each task's command runs under: shifter (its image and modules) or podman-hpc; none."""
    if not cluster.image:
        return []
    if cluster.container == "podman-hpc":  # NERSC's podman-hpc: GPUs and the job's environment inside
        return ["podman-hpc", "run", "--rm", "--gpu", "--mpi", "--env-host", cluster.image]
    modules = [f"--module={','.join(cluster.container_modules)}"] if cluster.container_modules else []
    return ["shifter", f"--image={cluster.image}", *modules]


def srun_words(cluster: ClusterConfig) -> list[str]:
    """srun's own options (CPU binding), then the container prefix; the command follows them."""
    bind = [f"--cpu-bind={cluster.cpu_bind}"] if cluster.cpu_bind else []
    return [*bind, *container_prefix(cluster)]


def extra_sbatch(cluster: ClusterConfig, options: Mapping[str, str | bool]) -> dict[str, str | bool]:
    """The #SBATCH lines beyond the job's shape: variable time, a comment, the image (shifter reads it at
    submission), the profile's other options and the command line's, which win (True: a flag)."""
    extra: dict[str, object] = {"time-min": cluster.time_min_min, "comment": cluster.comment}
    if cluster.image and cluster.container == "shifter":
        extra["image"] = cluster.image
    merged = {**extra, **cluster.sbatch_options, **options}
    return {k: v if v is True else str(v) for k, v in merged.items() if v is not None}


def accounts(cluster: ClusterConfig, account: str | None, analysis: str | None) -> tuple[str | None, str | None]:
    """(GPU jobs' account, the analysis job's), checked against the profile's rule. The analysis job is a
    CPU job: its account defaults to the GPU account without the GPU suffix (the CPU allocation)."""
    account = account or cluster.account
    suffix = cluster.account_suffix
    if account and suffix and not account.endswith(suffix):
        raise UsageError(
            f"--account {shown(account)}: profile {cluster.name!r} charges GPU jobs to a GPU allocation, whose "
            f"account ends with {suffix!r} (cluster.account_suffix); did you mean {account}{suffix}?"
        )
    analysis = analysis or cluster.analysis_account
    if analysis is None and account and suffix:
        analysis = account[: -len(suffix)]
    if analysis and suffix and analysis.endswith(suffix) and cluster.analysis_constraint == "cpu":
        raise UsageError(
            f"--analysis-account {shown(analysis)}: the analysis job runs on a CPU node (cluster.analysis_constraint"
            f" cpu), charged to a CPU allocation: its account does not end with {suffix!r}"
        )
    return account, analysis or account


def charge_lines(cluster: ClusterConfig, jobs: Iterable[tuple[str, int, int, int, int]]) -> list[str]:
    """What a dry run says it can cost, per QOS: (qos, points, nodes, GPUs per node, time limit in
    minutes) per job shape -> how many points, and the most node-hours they can be charged (every point
    running to its time limit; a partial node charged by its share)."""
    per_qos: dict[str, list[float]] = {}
    for qos, points, nodes, gpus, time_min in jobs:
        share = node_share(cluster, nodes, gpus)
        hours = points * share * time_min / 60 * cluster.charge_factor
        totals = per_qos.setdefault(qos, [0, 0.0])
        totals[0] += points
        totals[1] += hours
    return [
        f"# qos {qos}: {int(n)} point(s), at most {math.ceil(h * 10) / 10:g} node-hours at the time limit"
        for qos, (n, h) in per_qos.items()
    ]


def shell_words(words: list[str]) -> str:
    """One word per line (jobs/resnet152.sbatch reads them with mapfile: no word splitting surprises)."""
    return "".join(f"{w}\n" for w in words) if words else ""
