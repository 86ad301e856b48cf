"""HPC_FAULT_INJECT, the test hook that makes a run fail on purpose on a machine without a GPU: its one
grammar, parsed here and nowhere else.

    HPC_FAULT_INJECT=<entry>[,<entry>...]
    entry: oom-at-step:N[@batch=B][@world=W]    CUDA out of memory before optimizer step N (from 1)
           fail-at-step:N[@batch=B][@world=W]   a plain error there instead (a crashed point)
           kill-during-checkpoint               SIGKILL half-way through writing a checkpoint

`@batch` and `@world` limit an entry to runs of that per-GPU batch and world size: one point of a
sweep. An entry not in this grammar is an error naming it (a typo must not switch every fault off).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hpc.core.errors import UsageError

VARIABLE = "HPC_FAULT_INJECT"
_AT_STEP = re.compile(r"(oom|fail)-at-step:(\d{1,9})((?:@(?:batch|world)=\d{1,9})*)")
_FILTER = re.compile(r"@(batch|world)=(\d+)")
KILL_DURING_CHECKPOINT = "kill-during-checkpoint"


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # oom | fail | kill-during-checkpoint
    step: int | None = None  # before this optimizer step (counted from 1)
    batch: int | None = None  # only runs of this per-GPU batch
    world: int | None = None  # only runs of this many ranks

    def hits(self, next_step: int, batch_per_gpu: int, world: int) -> bool:
        return self.step == next_step and self.batch in (None, batch_per_gpu) and self.world in (None, world)


def parse_faults(text: str, source: str = VARIABLE) -> tuple[Fault, ...]:
    """The entries of a HPC_FAULT_INJECT value; UsageError naming the first entry not in the grammar."""
    faults = []
    for entry in text.split(",") if text else ():
        if entry == KILL_DURING_CHECKPOINT:
            faults.append(Fault(entry))
            continue
        m = _AT_STEP.fullmatch(entry)
        if not m:
            raise UsageError(
                f"{source}={text[:200]!r}: entry {entry[:80]!r} is not oom-at-step:N, fail-at-step:N "
                f"(each with optional @batch=B@world=W) or {KILL_DURING_CHECKPOINT}"
            )
        filters = {k: int(v) for k, v in _FILTER.findall(m.group(3))}
        faults.append(Fault(m.group(1), int(m.group(2)), filters.get("batch"), filters.get("world")))
    return tuple(faults)


def faults_from_env(env: Mapping[str, str]) -> tuple[Fault, ...]:
    return parse_faults(env.get(VARIABLE, ""))
