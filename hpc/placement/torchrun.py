"""torchrun as the launcher: one agent per node with c10d rendezvous at the job's first node, a worker
per GPU, the worker group restarted (from the last checkpoint) when one dies. No torch import: the
arguments are built here (for a Slurm job's environment: hpc.placement.distenv.slurm_torchrun_args), and
whether this torch's torchrun can forward signals is read from its source.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

# Slurm's warning before the time limit or a preemption (USR2) among them: the workers checkpoint and stop.
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"

# The agent's environment. By default torchrun's agents hand their workers the rendezvous' own store,
# without a prefix for the restart: a restarted group's process group then reads the dead group's keys
# (gloo connected to a dead worker's address and failed, and the next restart hung in its set-up, seen
# here with torch 2.14, plain torchrun too when a worker starts late). Not shared, each start of the
# group gets a store of its own (on a free port, hosted by its rank 0).
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_args(
    nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str, max_restarts: int, forward_signals: bool
) -> list[str]:
    """torchrun's arguments for one agent per node: c10d rendezvous at `endpoint` (host:port, the
    job's first node), worker-group restarts. With forward_signals, SIGUSR2 (Slurm's warning before
    the time limit, or preemption) is passed on to the workers, which checkpoint and stop."""
    args = [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--max-restarts={max_restarts}",
    ]
    if forward_signals:
        args.append(f"--signals-to-handle={FORWARDED_SIGNALS}")
    return args


def torch_source(relative: str) -> str | None:
    """The text of one of this torch's own files (`distributed/run.py`), read rather than imported (no
    torch import here); None without torch or the file."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        return (Path(spec.origin).parent / relative).read_text()
    except OSError:
        return None


def torchrun_forwards_signals() -> bool:
    """Whether this torch's torchrun has --signals-to-handle (newer releases)."""
    return "--signals-to-handle" in (torch_source("distributed/run.py") or "")


def torch_version() -> tuple[int, int] | None:
    """This torch's major and minor version, from its version.py; None when it cannot be read."""
    found = re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", torch_source("version.py") or "")
    return (int(found.group(1)), int(found.group(2))) if found else None
