"""A job's Slurm side: what is asked for (`JobRequest`), the sbatch parameters a cluster profile makes
of it, and the sbatch script, as pure functions of those parameters (pinned by a golden file).

The script is the one submitit hands to sbatch: `sbatch_text` calls submitit's own script writer with
the same parameters and the same command line its SlurmExecutor would, but without making an
executor, which insists on finding `srun`: a dry run needs no scheduler. No torch import.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from hpc.core.cli import check_name, shown
from hpc.core.errors import UsageError
from hpc.core.faults import VARIABLE as FAULT_VARIABLE
from hpc.core.faults import parse_faults
from hpc.launch.requeue import KEEP_TEARDOWN, teardown_lines
from hpc.launch.submission.site import STOP_SIGNAL, check_sbatch_options, extra_sbatch, is_partial, job_env, srun_words
from hpc.settings.cluster import ONE_TASK_PER_NODE
from hpc.settings.schema import ClusterConfig


def _check_text(flag: str, value: str | None) -> None:
    """Names and paths reach #SBATCH lines and shell text: quoting handles the rest, not line breaks."""
    if value is None:
        return
    if value == "" or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise UsageError(
            f"command line: {flag} {shown(value)}: must be non-empty, without control characters or line breaks"
        )


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """One job shape as asked for on the command line (or by a sweep point), checked."""

    nodes: int
    gpus: int  # per node; one task per GPU
    time_min: int
    name: str
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    exports: dict[str, str] = dataclasses.field(default_factory=dict)
    sbatch: dict[str, str] = dataclasses.field(default_factory=dict)  # --sbatch KEY=VALUE: other options

    def __post_init__(self) -> None:
        check_name(self.name, "command line: --name")
        for flag, value in (("--account", self.account), ("--qos", self.qos), ("--partition", self.partition)):
            _check_text(flag, value)
        check_sbatch_options(self.sbatch, "command line: --sbatch")
        for key, value in self.exports.items():
            if not key.replace("_", "").isalnum() or key[0].isdigit():
                raise UsageError(f"command line: --export {shown(key)[1:-1]}=...: {shown(key)} is not a variable name")
            if "\n" in value or "\0" in value:
                raise UsageError(f"command line: --export {key}: value must be one line")
        if FAULT_VARIABLE in self.exports:  # a typo would switch every fault off, found only in the job's log
            parse_faults(self.exports[FAULT_VARIABLE], f"command line: --export {FAULT_VARIABLE}")


def parse_exports(items: list[str], flag: str = "--export") -> dict[str, str]:
    """--export (or --sbatch) KEY=VALUE flags as a mapping (checked by JobRequest)."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"command line: {flag} {shown(item)}: expected KEY=VALUE")
        out[key] = value
    return out


def setup_lines(cluster: ClusterConfig, req: JobRequest) -> list[str]:
    """The profile's setup lines, then its environment for this shape (hpc/launch/submission/site.py) and the user's
    --export values, quoted."""
    env = {**job_env(cluster, req.nodes, req.gpus), **req.exports}
    return list(cluster.setup) + [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def slurm_parameters(
    cluster: ClusterConfig,
    req: JobRequest,
    max_parallel: int | None = None,
    folder: Path | None = None,
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one job shape, whatever its task: the sbatch script is a
    function of these. A partial node goes to the profile's shared QOS. Every task sees every GPU of the
    job on its node (a rank takes `cuda:LOCAL_RANK`, torchrun's contract, which one visible GPU per task
    would break for a user's script). The warning before the time limit is SIGTERM, the signal of a
    preemption too, on which the training checkpoints and scripts save (USR2, submitit's default, ends a
    script that does not catch it). With the job's `folder`, the batch shell requeues a job whose ranks
    asked for it, once its step has ended, outliving a SIGTERM of its own to do so (hpc/launch/requeue.py)."""
    # one task per node: torchrun starts the per-GPU workers, or (node) one process uses every GPU
    torchrun = cluster.launcher in ONE_TASK_PER_NODE
    partial = is_partial(cluster, req.nodes, req.gpus)
    params = {
        "job_name": req.name,
        "nodes": req.nodes,
        "ntasks_per_node": 1 if torchrun else req.gpus,
        "gpus_per_node": req.gpus,
        "cpus_per_task": cluster.cpus_per_task * (req.gpus if torchrun else 1),
        "time": req.time_min,
        "constraint": cluster.constraint,
        "qos": req.qos or (cluster.shared_qos if partial else cluster.qos),
        "account": req.account or cluster.account,
        "partition": req.partition or (cluster.shared_partition if partial else None) or cluster.partition,
        "mem": f"{cluster.mem_gb}GB" if cluster.mem_gb else None,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": [*setup_lines(cluster, req), *([KEEP_TEARDOWN] if folder is not None else [])],
        # One dead rank ends the step at once instead of leaving the others in a collective; then the
        # CPU binding and the container the task runs in.
        "srun_args": ["--kill-on-bad-exit=1", *srun_words(cluster)],
        "array_parallelism": max_parallel,
        "additional_parameters": {
            "signal": f"{STOP_SIGNAL}@{cluster.signal_delay_s}",
            **extra_sbatch(cluster, req.sbatch),
        },
        "teardown": teardown_lines(folder) if folder is not None else None,
    }
    return {k: v for k, v in params.items() if v is not None}


def local_parameters(cluster: ClusterConfig, req: JobRequest) -> dict[str, Any]:
    """submitit LocalExecutor parameters: the same job on this machine (one node)."""
    return {
        "nodes": 1,
        "tasks_per_node": 1 if cluster.launcher in ONE_TASK_PER_NODE else req.gpus,
        "gpus_per_node": req.gpus,
        "timeout_min": req.time_min,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": setup_lines(cluster, req),
    }


def analysis_parameters(cluster: ClusterConfig, account: str | None, dependency: str, name: str) -> dict[str, Any]:
    """The sweep's analysis job: one CPU task, the profile's analysis_* keys, after `dependency`."""
    req = JobRequest(1, 1, cluster.analysis_time_min, f"{name}-analysis")
    params = {
        "job_name": req.name,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": cluster.analysis_cpus,
        "time": cluster.analysis_time_min,
        "qos": cluster.analysis_qos,
        "constraint": cluster.analysis_constraint,
        "partition": cluster.analysis_partition or cluster.partition,
        "account": account or cluster.account,
        "dependency": dependency,
        "setup": setup_lines(cluster, req),
    }
    return {k: v for k, v in params.items() if v is not None}


def submitit_command(folder: Path, python: str | None = None) -> str:
    """The command submitit runs in each task (SlurmExecutor._submitit_command_str)."""
    return " ".join([python or shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_text(params: dict[str, Any], folder: Path, python: str | None = None, map_count: int | None = None) -> str:
    """Exactly the script submitit would hand to sbatch for these parameters (a job array of
    `map_count` tasks when given); needs no Slurm on this machine."""
    from submitit.slurm.slurm import _make_sbatch_string

    extra: dict[str, Any] = {"map_count": map_count} if map_count is not None else {}
    return _make_sbatch_string(command=submitit_command(folder, python), folder=folder, **params, **extra)


def job_python(cluster: ClusterConfig) -> str | None:
    """The python each task runs: this one, or inside a container image the image's own `python`."""
    return "python" if cluster.image else None
