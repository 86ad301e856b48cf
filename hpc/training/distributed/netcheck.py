"""Which network NCCL chose for a run that spans nodes, and what the run does when it is TCP sockets.

Across Slingshot nodes NCCL needs the libfabric plugin (aws-ofi-nccl); without it NCCL falls back to
TCP sockets over the same NICs, about 3x slower for DDP's all-reduce, and says so only in an INFO
line. Where the cluster profile says the fabric is there (`nccl_fabric: warn | stop`, exported to
multi-node jobs as HPC_NCCL_FABRIC: hpc/launch/submission/site.py), each rank has NCCL write its INIT/NET lines to
the run's logs/ (unless the user set NCCL_DEBUG), reads the `Using network ...` line once its first
communicator is up, records the network in summary.json, and stops at start-up in one line (or warns)
when it is `Socket`. Perlmutter's profile also sets NCCL_NET="AWS Libfabric", with which NCCL itself
fails rather than fall back. Pure functions over the environment and NCCL's text; no torch import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpc.settings.rankcommand import NCCL_FABRIC_VARIABLE

SOCKETS = "Socket"
_USING = re.compile(r"NCCL INFO Using network (.+?)\s*$")


def wants_check(env: Mapping[str, str], nodes: int) -> bool:
    return nodes > 1 and env.get(NCCL_FABRIC_VARIABLE, "off") in ("warn", "stop")


def debug_env(env: Mapping[str, str], log_dir: Path, rank: int) -> dict[str, str]:
    """What to set before NCCL starts so that its choice lands in a file of ours; nothing where the user
    set NCCL_DEBUG (their lines go where they asked, and the network stays unrecorded)."""
    if "NCCL_DEBUG" in env:
        return {}
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(log_dir / f"nccl.rank{rank}.%h.%p.log"),
    }


def network_of(lines: Iterable[str]) -> str | None:
    """The network NCCL said it uses (`... NCCL INFO Using network AWS Libfabric`), the last one said."""
    found = None
    for line in lines:
        m = _USING.search(line)
        if m:
            found = m.group(1)
    return found


def read_network(log_dir: Path, rank: int) -> str | None:
    """This rank's network from NCCL's file; None when NCCL has not said."""
    paths = sorted(log_dir.glob(f"nccl.rank{rank}.*.log"))
    lines: list[str] = []
    for path in paths:
        try:
            lines += path.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return network_of(lines)


def verdict(network: str | None, policy: str, nodes: int) -> tuple[str, str] | None:
    """(stop | warn, the line) when a multi-node run's NCCL uses TCP sockets where the fabric is there;
    None when it does not, or nothing can be said."""
    if network != SOCKETS or policy not in ("warn", "stop") or nodes < 2:
        return None
    return policy, (
        f"NCCL uses TCP sockets between the {nodes} nodes, not the fabric (its libfabric plugin did not load): "
        "DDP's all-reduce runs about 3x slower; on Perlmutter load it (module load nccl-plugin, or the "
        "container's --module=gpu,nccl-plugin) or run with cluster.nccl_fabric=warn to go on anyway"
    )
