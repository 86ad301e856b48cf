"""The cluster profile's section: where jobs run, and how (`ClusterConfig`). Read from a profile YAML
(profiles/perlmutter.yaml, local.yaml) with `--set cluster.KEY=VALUE` on top (hpc/settings/config.py).
No torch; nothing of the project but core and the field checks."""

from __future__ import annotations

import dataclasses
import re

from hpc.settings.fields import check, non_negative, one_of, positive

SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]{0,40}")
# sbatch options the toolkit writes itself, from its own flags and keys: not to be given twice. Each with
# the profile key (or what) that sets it instead.
MANAGED_SBATCH: dict[str, str] = {
    "nodes": "the command line's -N",
    "ntasks-per-node": "gpus_per_node and launcher (one task a GPU, or a node)",
    "ntasks": "gpus_per_node and launcher (one task a GPU, or a node)",
    "gpus-per-node": "gpus_per_node",
    "gpus-per-task": "gpus_per_node (every task sees its node's GPUs)",
    "cpus-per-task": "cpus_per_task",
    "time": "time_limit_min",
    "qos": "qos (shared_qos for a part of a node)",
    "account": "account",
    "partition": "partition",
    "constraint": "constraint",
    "job-name": "the command line's -J",
    "output": "the run directory (RUN/logs/)",
    "error": "the run directory (RUN/logs/)",
    "signal": "signal_delay_s",
    "array": "the sweep (hpc.study run)",
    "dependency": "the command line's -d",
    "open-mode": "the toolkit (logs appended across requeues)",
    "comment": "comment",
    "time-min": "time_min_min",
    "image": "image",
    "mem": "mem_gb",
}


LAUNCHERS = ("srun", "torchrun", "node")
ONE_TASK_PER_NODE = ("torchrun", "node")  # the launchers whose Slurm task is a whole node


def ranks_per_node(launcher: str, gpus: int) -> int:
    """A node's ranks: one per GPU, but one process owning them all with the `node` launcher."""
    return 1 if launcher == "node" else gpus


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where jobs run. `scheduler: local` runs on this machine (submitit's local executor)."""

    name: str = "local"  # the profile's name, in runs' records
    scheduler: str = "local"  # slurm | local (this machine, submitit's local executor)
    gpus_per_node: int = 2  # a node's GPUs, one rank each (on a CPU-only machine: ranks per node)
    max_nodes: int = 1  # the most nodes a job may ask for
    cpus_per_task: int = 1  # CPU cores per GPU's task (-c; a task of a whole node takes this x its GPUs)
    mem_gb: int | None = None  # memory per node, GB (sbatch --mem); None: the site's default
    constraint: str | None = None  # Slurm -C: node features (Perlmutter: gpu)
    qos: str | None = None  # Slurm -q, for whole nodes
    account: str | None = None  # Slurm -A, when the command line gives none
    partition: str | None = None  # Slurm -p; None: the site's default
    time_limit_min: int = 30  # a job's time limit, minutes, when -t/--time gives none
    max_time_limit_min: int | None = None  # the longest -t/--time the profile takes (Perlmutter's regular: 48 h)
    setup: tuple[str, ...] = ()  # shell lines run before the job (module load ...)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # variables every job's ranks get
    signal_delay_s: int = 120  # the warning (--signal=B:USR2@...) this long before the time limit
    # Your own command (hpc.submit -- COMMAND): after the stop signal (TERM: Slurm's warning, a
    # preemption) it has this long to save and exit before it is killed and the job ends as preempted.
    stop_grace_s: int = 60
    max_requeues: int = 3  # requeues of a job that stopped with a checkpoint (HPC_MAX_REQUEUES in a sbatch script)
    # srun: one task per GPU. torchrun: one task per node running torchrun, which starts a worker per
    # GPU and restarts the worker group (from the last checkpoint) when one dies, max_restarts times.
    # node: one task per node owning every GPU of it, for a single-process script (nn.DataParallel).
    launcher: str = "srun"
    max_restarts: int = 3  # torchrun's restarts of a worker group (launcher: torchrun)
    # The sweep's analysis job (hpc.study): a small CPU job, never a GPU node.
    analysis_qos: str | None = None
    analysis_constraint: str | None = None  # the analysis job's node features (Perlmutter: cpu)
    analysis_partition: str | None = None  # its partition (None: the GPU jobs')
    analysis_cpus: int = 2  # its CPU cores
    analysis_time_min: int = 30  # its time limit, minutes
    # Accounts: GPU jobs' account must end with this (Perlmutter: _g, the GPU allocation); the analysis
    # job's account (a CPU job) is analysis_account, else --analysis-account, else the GPU account
    # without the suffix.
    account_suffix: str | None = None
    analysis_account: str | None = None  # the analysis job's account (see account_suffix)
    # A job of fewer GPUs than a node (one node) goes to this QOS (Perlmutter: shared) with a GPU and
    # cpus_per_task cores per task, charged by its share of the node; None: whole nodes.
    shared_qos: str | None = None
    shared_partition: str | None = None  # where the site (or a test cluster) puts such jobs
    charge_factor: float = 1.0  # allocation hours charged per node-hour (a share of a node: a share)
    # Affinity on a whole node: the GPU each local rank takes (Perlmutter: 3,2,1,0: rank 0's cores sit
    # next to GPU 3) and srun's CPU binding (Perlmutter: cores).
    gpu_order: tuple[int, ...] = ()
    cpu_bind: str | None = None  # srun's --cpu-bind for every task (Perlmutter: cores)
    # Preemptible and variable-time jobs: sbatch --time-min and --comment (qos: preempt goes in qos).
    time_min_min: int | None = None
    comment: str | None = None  # sbatch --comment, on every job
    # A container image the training runs in: shifter (with container_modules) or podman-hpc.
    image: str | None = None
    container: str = "shifter"  # shifter | podman-hpc: what runs the image
    container_modules: tuple[str, ...] = ()  # shifter's --module (Perlmutter: gpu, nccl-plugin)
    # Multi-node jobs only: the fabric's settings (HPE's libfabric/CXI ones on Slingshot) and what a
    # run does when NCCL would fall back to TCP sockets: off | warn | stop.
    multinode_env: dict[str, str] = dataclasses.field(default_factory=dict)
    nccl_fabric: str = "off"  # off | warn | stop: a multi-node run whose NCCL would use TCP sockets
    runs_dir: str | None = None  # where run directories go (Perlmutter: under $SCRATCH); --runs-dir wins
    sbatch_options: dict[str, str] = dataclasses.field(default_factory=dict)  # sbatch's other options

    def __post_init__(self) -> None:
        one_of(self, "scheduler", ("slurm", "local"))
        one_of(self, "launcher", LAUNCHERS)
        positive(
            self,
            "gpus_per_node",
            "max_nodes",
            "cpus_per_task",
            "mem_gb",
            "time_limit_min",
            "max_time_limit_min",
            "analysis_cpus",
            "analysis_time_min",
            "time_min_min",
        )
        non_negative(self, "signal_delay_s", "max_requeues", "max_restarts", "stop_grace_s")
        if self.max_time_limit_min is not None:
            check(
                self.time_limit_min <= self.max_time_limit_min,
                "time_limit_min",
                f"exceeds max_time_limit_min={self.max_time_limit_min}",
                other="max_time_limit_min",
            )
        check(
            self.signal_delay_s < self.time_limit_min * 60,
            "signal_delay_s",
            f"must be shorter than the time limit ({self.time_limit_min} min)",
            other="time_limit_min",
        )
        for name in ("env", "multinode_env"):
            for key in getattr(self, name):
                check(key.replace("_", "").isalnum() and not key[0].isdigit(), name, f"bad variable name {key!r}")
        one_of(self, "container", ("shifter", "podman-hpc"))
        one_of(self, "nccl_fabric", ("off", "warn", "stop"))
        check(self.charge_factor > 0, "charge_factor", "must be > 0")
        check(
            not self.gpu_order or sorted(self.gpu_order) == list(range(self.gpus_per_node)),
            "gpu_order",
            f"must order the node's GPUs 0..{self.gpus_per_node - 1}, each once",
            other="gpus_per_node",
        )
        for key in self.sbatch_options:
            check(SBATCH_KEY.fullmatch(key) is not None, "sbatch_options", f"{key!r} is not an sbatch option name")
            check(
                key not in MANAGED_SBATCH,
                "sbatch_options",
                f"--{key} is the toolkit's own: {MANAGED_SBATCH.get(key)} sets it",
            )
