"""Each optimizer step's first gradient, timed, for the start-up hook in a user's script
(hpc/training/hook/autoprofile.py): a rank's own work a step is the time from its last optimizer step to its
first gradient, the part of the step no other rank can hold up (under DDP every rank's whole step ends
at the common all-reduce, so only that part tells a slow rank from those that wait for it).

torch's post-accumulate-grad hook (public, torch >= 2.1) goes on every parameter the optimizer steps;
after the first whole step only the KEEP parameters whose gradients came first keep it (a Python call
per parameter per step costs about 3 us on a CPU: 1.4 ms a step for ResNet152's 470 parameters, where
four cost 12 us). A script's own communication hook is left as it is. Torch-free here: torch calls it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from hpc.core.proc import queued_s

KEEP = 4


class FirstGrad:
    def __init__(self) -> None:
        self.handles: dict[int, Any] = {}  # id(parameter) -> torch's RemovableHandle
        self.at: float | None = None  # perf_counter of this step's first gradient
        self.queued_at: float | None = None  # the main thread's wait for a core so far, then (queued_s)
        self.fired: list[int] = []  # the first parameters to fire, in the step that chooses them
        self.pruned = False

    def watch(self, params: Iterable[Any]) -> bool:  # torch.nn.Parameter; False: this torch has no such hook
        params = [p for p in params if p.requires_grad]
        if not all(hasattr(p, "register_post_accumulate_grad_hook") for p in params):
            return False
        self.handles = {id(p): p.register_post_accumulate_grad_hook(self) for p in params}
        return bool(self.handles)

    def __call__(self, param: Any) -> None:  # torch.Tensor, from autograd
        if self.at is None:
            self.at = time.perf_counter()
            self.queued_at = queued_s()
        if not self.pruned and len(self.fired) < KEEP:
            self.fired.append(id(param))

    def take(self) -> float | None:
        """This step's first gradient's time (None: none came), at the step's end; the first step that
        had gradients chooses the parameters that keep the hook."""
        at = self.at
        self.at = None
        if not self.pruned and self.fired:
            keep = set(self.fired)
            for key in [k for k in self.handles if k not in keep]:
                self.handles.pop(key).remove()
            self.pruned = True
        return at

    def remove(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        self.handles = {}
