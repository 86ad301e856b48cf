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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc.core.cli import check_name, shown
from hpc.core.errors import UsageError
from hpc.core.faults import VARIABLE as FAULT_VARIABLE
from hpc.core.faults import parse_faults
from hpc.launch.submission.sbatchflags import MEMORY_PER, JobOptions
from hpc.launch.submission.site import extra_sbatch, is_partial, job_env
from hpc.placement.affinity import THREADS, threads_per_rank
from hpc.settings.cluster import ONE_TASK_PER_NODE
from hpc.settings.schema import ClusterConfig

# submitit's executor parameters: its keyword arguments, which its own typed functions check when given
Parameters = dict[str, Any]


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
    """One job shape as asked for on the command line (or by a sweep point), checked, with the command
    line's other Slurm options (hpc/launch/submission/sbatchflags.py)."""

    nodes: int
    gpus: int  # per node; one task per GPU
    time_min: int
    name: str
    options: JobOptions = dataclasses.field(default_factory=JobOptions)

    def __post_init__(self) -> None:
        check_name(self.name, "command line: --name")
        for flag, value in (
            ("--account", self.options.account),
            ("--qos", self.options.qos),
            ("--partition", self.options.partition),
        ):
            _check_text(flag, value)
        exports = self.options.exports.values
        if FAULT_VARIABLE in exports:  # a typo would switch every fault off, found only in the job's log
            parse_faults(exports[FAULT_VARIABLE], f"command line: --export {FAULT_VARIABLE}")


def setup_lines(cluster: ClusterConfig, req: JobRequest) -> list[str]:
    """The profile's setup lines, then its environment for this shape (hpc/launch/submission/site.py) and the user's
    --export values, quoted."""
    env = {**job_env(cluster, req.nodes, req.gpus), **req.options.exports.values}
    return list(cluster.setup) + [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def slurm_parameters(cluster: ClusterConfig, req: JobRequest, max_parallel: int | None = None) -> Parameters:
    """submitit SlurmExecutor parameters for one job shape, whatever its task: the sbatch script is a
    function of these. A partial node goes to the profile's shared QOS. Every task sees every GPU of the
    job on its node (a rank takes `cuda:LOCAL_RANK`, torchrun's contract, which one visible GPU per task
    would break for a user's script). submitit's job runs in the batch shell itself (`use_srun` off; its
    script execs python: `batch_python`), where it runs the job's one srun step (hpc/launch/batch.py
    `BatchJob`, the road of a hand-written script too). The warning before the time limit is the job's own
    signal to that shell alone (WARNING: B:USR2), passed on to the tasks as the SIGTERM scripts save on; a
    bare SIGTERM is then Slurm ending the job (a person's scancel): never requeued."""
    # one task per node: torchrun starts the per-GPU workers, or (node) one process uses every GPU
    torchrun = cluster.launcher in ONE_TASK_PER_NODE
    partial = is_partial(cluster, req.nodes, req.gpus)
    ask = req.options
    export = ask.exports.sbatch_value()
    params = {
        "job_name": req.name,
        "nodes": req.nodes,
        "ntasks_per_node": 1 if torchrun else req.gpus,
        "gpus_per_node": req.gpus,
        "cpus_per_task": ask.cpus_per_task or cluster.cpus_per_task * (req.gpus if torchrun else 1),
        "time": req.time_min,
        "constraint": ask.constraint or cluster.constraint,
        "qos": ask.qos or (cluster.shared_qos if partial else cluster.qos),
        "account": ask.account or cluster.account,
        "partition": ask.partition or (cluster.shared_partition if partial else None) or cluster.partition,
        "mem": ask.mem or (f"{cluster.mem_gb}GB" if cluster.mem_gb and not set(MEMORY_PER) & set(ask.extra) else None),
        "dependency": ask.dependency,
        "exclusive": ask.exclusive,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": [*setup_lines(cluster, req), BATCH_SHELL_LINE],
        "use_srun": False,
        "array_parallelism": max_parallel,
        "additional_parameters": {
            "signal": f"{WARNING}@{cluster.signal_delay_s}",
            **({"export": export} if export else {}),
            **extra_sbatch(cluster, ask.extra),
        },
    }
    return {k: v for k, v in params.items() if v is not None}


def local_parameters(cluster: ClusterConfig, req: JobRequest, env: Mapping[str, str], cpus: int) -> Parameters:
    """submitit LocalExecutor parameters: the same job on this machine (one node), whose `cpus` CPUs its ranks
    share; `env` is the submitter's, which the job inherits."""
    return {
        "nodes": 1,
        "tasks_per_node": 1 if cluster.launcher in ONE_TASK_PER_NODE else req.gpus,
        "gpus_per_node": req.gpus,
        "timeout_min": req.time_min,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": [*setup_lines(cluster, req), *local_threads(cluster, req, env, cpus)],
    }


def local_threads(cluster: ClusterConfig, req: JobRequest, env: Mapping[str, str], cpus: int) -> list[str]:
    """Each rank's share of this machine's CPUs as its threads (hpc/placement/affinity.py), unless the
    profile, --export or the submitter's environment sets OMP_NUM_THREADS: one rank trains as fast as
    `python -m hpc.train` alone, several never oversubscribe the machine."""
    if THREADS in {**job_env(cluster, req.nodes, req.gpus), **req.options.exports.values, **env}:
        return []
    return [f"export {THREADS}={threads_per_rank(cpus, req.gpus)}"]


def analysis_parameters(cluster: ClusterConfig, account: str | None, dependency: str, name: str) -> Parameters:
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


# The job's warning before its time limit: SIGUSR2 to its batch shell alone (hpc/launch/requeue.py JobSignals)
WARNING = "B:USR2"
# The setup's last line, a comment in the script: why submitit's command below is exec'd
BATCH_SHELL_LINE = "# the job's python becomes its batch shell (exec): the warning (B:USR2) reaches it"


def batch_python(python: str | None = None) -> str:
    """What submitit's script runs its job with: this python (the submitter's, outside any container),
    exec'd, so that the job's own signal to its batch shell reaches it."""
    return f"exec {python or shlex.quote(sys.executable)}"


def submitit_command(folder: Path, python: str | None = None) -> str:
    """The command submitit runs in the batch shell (SlurmExecutor._submitit_command_str)."""
    return " ".join([batch_python(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_text(params: Parameters, folder: Path, python: str | None = None, map_count: int | None = None) -> str:
    """Exactly the script submitit would hand to sbatch for these parameters (a job array of
    `map_count` tasks when given); needs no Slurm on this machine."""
    from submitit.slurm.slurm import _make_sbatch_string

    extra: Parameters = {"map_count": map_count} if map_count is not None else {}
    return _make_sbatch_string(command=submitit_command(folder, python), folder=folder, **params, **extra)


def rank_python(cluster: ClusterConfig) -> str:
    """The python each rank's runner runs: this one, or inside a container image the image's own `python`."""
    return "python" if cluster.image else sys.executable
