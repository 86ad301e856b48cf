"""The start-up hook's instruments in a user's script, armed with no change to it: `arm()`, called by
hpc/training/hook/startup/sitecustomize.py in every Python process of a command the per-rank runner starts
(HPC_RUN_DIR set, the hook's folder first on PYTHONPATH).

- the step hook (hpc/training/hook/autoprofile.py): torch's global optimizer step hook counts the steps of
  the first optimizer, times them and runs the toolkit's profiler (HPC_PROFILER: its section as JSON;
  enabled false, --no-profile: counted, not profiled); `guard` makes ours stand down before any
  profiler the script starts;
- the beat (hpc/training/hook/scriptwatch.py): a byte a step to the runner, a stack dump on its request;
- the out-of-memory record (hpc/training/hook/scriptoom.py);
- the user's accelerate config, as `accelerate launch` passes it (hpc/training/hook/scriptaccelerate.py);
- the run's store (hpc/training/distributed/runstore.py): the script's `init_process_group` hosts it on the socket
  its runner holds and seals it with the run's secret, as the toolkit's training does.

Each is armed once torch's module for it is imported, never by importing torch here. Each catches its
own errors: one line, and it turns itself off; the script goes on.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

from hpc.settings.fields import Invalid
from hpc.settings.rankcommand import BATCH_VARIABLE, PROFILER_VARIABLE, RUN_DIR_VARIABLE
from hpc.settings.schema import ProfilerConfig
from hpc.training.hook.afterimport import after_import
from hpc.training.hook.autoprofile import PROFILER_MODULE, STEP_HOOK_MODULE, StepHook, guard, register
from hpc.training.hook.scriptaccelerate import ACCELERATE_MODULE, apply
from hpc.training.hook.scriptoom import OomCatcher, record_history
from hpc.training.hook.scriptwatch import watch

log = logging.getLogger(__name__)

RENDEZVOUS_MODULE = "torch.distributed.rendezvous"  # where torch makes an init_process_group's store


def profiler_settings(env: Mapping[str, str]) -> ProfilerConfig | None:
    """The profiler section from HPC_PROFILER, as its ProfilerConfig (keys it does not know ignored: a later
    toolkit's); None when it is not a JSON mapping or not a profiler section (said in one line)."""
    try:
        settings = json.loads(env.get(PROFILER_VARIABLE) or "null")
    except ValueError:
        settings = None
    if isinstance(settings, dict):
        known = {k: v for k, v in settings.items() if k in ProfilerConfig.__dataclass_fields__}
        try:
            return ProfilerConfig(**known)
        except Invalid as e:
            log.warning(f"hpc: {PROFILER_VARIABLE}: profiler.{e.key}: {e.reason}: not profiled")
        except (TypeError, ValueError) as e:  # a value of another type than its field's
            log.warning(f"hpc: {PROFILER_VARIABLE}: {e}: not profiled")
        return None
    if env.get(PROFILER_VARIABLE):
        log.warning(f"hpc: {PROFILER_VARIABLE} is not a JSON mapping: not profiled")
    return None


def _on_first_step(hook: StepHook) -> None:
    if hook.steps == 1:
        record_history(hook)


def arm(env: Mapping[str, str] | None = None) -> StepHook | None:
    """The instruments, each registered as soon as torch's module for it exists; None outside a run."""
    env = dict(os.environ) if env is None else env
    run_dir = env.get(RUN_DIR_VARIABLE)
    if not run_dir:
        return None
    hook = StepHook(profiler_settings(env), Path(run_dir))
    after_import(STEP_HOOK_MODULE, lambda module: _safely(register, module, hook))
    after_import(PROFILER_MODULE, lambda module: _safely(guard, module, hook))
    after_import(ACCELERATE_MODULE, lambda module: _safely(_accelerate, module, hook))
    after_import(RENDEZVOUS_MODULE, lambda module: _safely(_run_store, module, hook))
    hook.listeners.append(_on_first_step)
    watch(hook, env)
    batch = env.get(BATCH_VARIABLE, "")
    OomCatcher(hook, int(batch) if batch.isdigit() else None).install()
    return hook


def _run_store(module: ModuleType, hook: StepHook) -> None:
    from hpc.training.distributed.runstore import patch_rendezvous, unheld  # torch's: only once the script imported it

    try:
        patch_rendezvous(module)
    except Exception:
        unheld()  # torch's own store then: it binds the port itself, unsealed (the warning says the hook is off)
        raise


def _accelerate(module: ModuleType, hook: StepHook) -> None:
    hook.accelerate = apply(os.environ)


def _safely(then: Callable[[ModuleType, StepHook], None], module: ModuleType, hook: StepHook) -> None:
    try:
        then(module, hook)
    except Exception as e:  # inside torch's import: never the script's failure
        log.warning(f"hpc: {module.__name__}: the toolkit's hook not installed ({type(e).__name__}: {e})")
