"""`after_import(name, then)`: run `then(module)` once the module `name` has been executed, wherever it is
imported from (now, when it already is). The start-up hook (hpc/training/hook/scripthooks.py) uses it to
reach torch's public hooks in a user's script without importing torch itself: most Python processes of
a command (DataLoader workers, helper scripts) never import it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        # Out of the meta path only once the module runs: a probe first (importlib.util.find_spec, as
        # transformers' is_accelerate_available() makes one) gets a spec that is never executed.
        def exec_then(module: ModuleType) -> None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            exec_module(module)
            then(module)

        loader.exec_module = exec_then  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
