"""`python -m hpc.distenv` and `hpc-distenv`: `export KEY=VALUE` lines for a batch script (or JSON), a
hostlist expanded, or torchrun's arguments for a Slurm job; from hpc/placement/distenv.py's mapping. No
torch import: the command is instant."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex

from hpc.core.cli import Parser, run
from hpc.core.errors import EXIT_OK, DistEnvError, HostlistError, StoreError
from hpc.core.meet import free_port
from hpc.placement.distenv import export_lines, from_environ, slurm_torchrun_args
from hpc.placement.hostlist import expand_hostlist


def main(argv: list[str] | None = None) -> int:
    try:
        return distenv_command(argv)
    except StoreError as e:  # here a MASTER_ADDR or port the user gave: bad input (exit 2), not a run's failure
        raise DistEnvError(str(e)) from None


def distenv_command(argv: list[str] | None) -> int:
    parser = Parser(
        prog="python -m hpc.distenv",
        description="Print `export KEY=VALUE` lines (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...) "
        'derived from torchrun, srun or submitit variables. Use: eval "$(python -m hpc.distenv)".',
    )
    parser.add_argument("--json", action="store_true", help="print the DistEnv as JSON instead")
    parser.add_argument("--hostlist", metavar="EXPR", help="only expand a Slurm hostlist, one host per line")
    parser.add_argument(
        "--torchrun-args",
        type=int,
        metavar="NPROC_PER_NODE",
        help="print torchrun's arguments for this Slurm job (one agent per node), quoted",
    )
    parser.add_argument("--max-restarts", type=int, default=3, help="with --torchrun-args (default 3)")
    args = parser.parse_args(argv)
    if args.hostlist is not None:
        try:
            hosts = expand_hostlist(args.hostlist)
        except HostlistError as e:
            raise DistEnvError(f"--hostlist: {e}") from None
        for host in hosts:  # none, nothing printed (as scontrol show hostnames)
            print(host)
        return EXIT_OK
    if args.torchrun_args is not None:
        print(" ".join(shlex.quote(a) for a in slurm_torchrun_args(os.environ, args.torchrun_args, args.max_restarts)))
        return EXIT_OK
    dist = from_environ(os.environ)
    if dist.launcher == "slurm-batch" and dist.master_port is None and not args.json:  # for the job's srun steps
        dist = dataclasses.replace(dist, master_port=free_port(dist.master_addr))
    print(json.dumps(dataclasses.asdict(dist), sort_keys=True) if args.json else "\n".join(export_lines(dist)))
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.distenv`, or its console script): errors as one line, exit 2."""
    return run("hpc.distenv", main, argv)
