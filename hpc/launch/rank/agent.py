"""torchrun's agent as a job's step runs it on each node (hpc/launch/batch.py `step_words`): `python -m
hpc.launch.rank.agent TORCHRUN-ARGS`, then torchrun itself (`torch.distributed.run`) with those arguments,
in this process. SIGUSR1 and SIGQUIT are ignored from its start: Slurm sends them to every process of the
step (a Lightning job asks for SIGUSR1), and the agent would die of SIGUSR1, its workers left without it.
Its workers, the per-rank runners, take both back and pass them on to their command. torch is imported
only when torchrun runs.
"""

from __future__ import annotations

import runpy
import sys

from hpc.core.stop import ignore_passed


def main() -> None:
    ignore_passed()  # not the agent's: each worker gets its own
    sys.argv[0] = "torchrun"
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
