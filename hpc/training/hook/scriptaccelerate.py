"""HF Accelerate in a user's script, started by the toolkit as `accelerate launch` would start it: once the
script imports `accelerate` (hpc/training/hook/scripthooks.py arms this), the user's accelerate config - the
file `accelerate config` writes, where accelerate looks for it (`$HF_HOME/accelerate/default_config.yaml`),
or the one ACCELERATE_CONFIG_FILE names - becomes the ACCELERATE_* variables `accelerate launch` passes
its processes: mixed precision, CPU, dynamo (backend, mode, fullgraph, dynamic, regional compilation).
On a machine without a GPU, ranks of more than one are CPU ranks (ACCELERATE_USE_CPU), as
`accelerate launch --cpu` makes them: without it each rank trained alone.
The environment's own ACCELERATE_* settings win. Read with accelerate's own config loader; FSDP and
DeepSpeed settings are not passed on (said in one line when the config has them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

ACCELERATE_MODULE = "accelerate"
CONFIG_VARIABLE = "ACCELERATE_CONFIG_FILE"


def config_path(env: Mapping[str, str]) -> str | None:
    """The accelerate config to apply: ACCELERATE_CONFIG_FILE, else accelerate's default file if there is one."""
    from accelerate.commands.config.config_args import default_config_file

    named = env.get(CONFIG_VARIABLE)
    if named:
        return named
    return default_config_file if os.path.isfile(default_config_file) else None


def launch_env(config: Any, world_size: int, cuda: bool) -> dict[str, str]:  # Any: accelerate's config class
    """What `accelerate launch` would set from `config` (accelerate's loaded config, or None)."""
    out: dict[str, str] = {}
    if config is not None:
        if config.mixed_precision:
            out["ACCELERATE_MIXED_PRECISION"] = str(config.mixed_precision).lower()
        if config.use_cpu:
            out["ACCELERATE_USE_CPU"] = "true"
        dynamo = getattr(config, "dynamo_config", None) or {}
        backend = dynamo.get("dynamo_backend")
        if backend and str(backend).upper() != "NO":  # as accelerate's launcher words them (utils/launch.py)
            out["ACCELERATE_DYNAMO_BACKEND"] = str(backend).upper()
            out["ACCELERATE_DYNAMO_MODE"] = str(dynamo.get("dynamo_mode") or "default")
            for key in ("use_fullgraph", "use_regional_compilation"):
                out[f"ACCELERATE_DYNAMO_{key.upper()}"] = str(bool(dynamo.get(f"dynamo_{key}")))
            if dynamo.get("dynamo_use_dynamic") is not None:  # unset: torch decides (accelerate >= 1.16 leaves it out)
                out["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(bool(dynamo["dynamo_use_dynamic"]))
    if not cuda and world_size > 1:
        out.setdefault("ACCELERATE_USE_CPU", "true")
    return out


def apply(env: MutableMapping[str, str]) -> dict[str, str]:
    """The user's accelerate config into `env` (os.environ), under what is already set; what was set."""
    import torch
    from accelerate.commands.config.config_args import load_config_from_file

    path = config_path(env)
    config = load_config_from_file(path) if path else None
    kind = str(getattr(config, "distributed_type", "")).upper()
    if "FSDP" in kind or "DEEPSPEED" in kind:
        log.warning(f"hpc: {path}: its {kind.split('.')[-1]} settings are not applied (use accelerate launch)")
    wanted = launch_env(config, int(env.get("WORLD_SIZE") or 1), torch.cuda.is_available())
    added = {k: v for k, v in wanted.items() if k not in env}
    env.update(added)
    return added
