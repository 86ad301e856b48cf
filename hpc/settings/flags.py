"""The training flags, declared once: `hpc.train` takes them, and `hpc.submit` and `hpc.study run`
forward them to every job. `overrides_from_args` turns them back into config keys, each with the flag
it came from, so an error names the flag. No torch import.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from hpc.settings.config import parse_override, set_source


def graph_setting(text: str) -> bool | str:
    """--cuda-graph's value: true and false as booleans, anything else as given (the schema checks it)."""
    return {"true": True, "false": False}.get(text.lower(), text)


FLAGS: dict[str, tuple[str, Callable[[str], Any], str]] = {  # flag -> (config key, type, help)
    "data_root": (
        "data.root",
        str,
        "data root holding cifar-100-python/ (default: $HPC_DATA, $SCRATCH/cifar100, ./data)",
    ),
    "data_fraction": ("data.fraction", str, "fraction of the training set, e.g. 1, 0.5, 1/10"),
    "loader": ("data.loader", str, "device (whole set on the device) or dataloader (workers)"),
    "arch": ("model.arch", str, "resnet18|resnet34|resnet50|resnet101|resnet152|tiny"),
    "stem": ("model.stem", str, "torchvision (the study's) or cifar (3x3 stem, ~16x FLOPs)"),
    "batch_size": ("train.batch_size", int, "images per optimizer step, per GPU or global (--batch-scope)"),
    "batch_scope": ("train.batch_scope", str, "per_gpu (the study's) or global"),
    "epochs": ("train.epochs", int, "epochs"),
    "max_steps": ("train.max_steps", int, "stop after N optimizer steps in total (checkpoint written)"),
    "lr": ("train.lr", float, "learning rate (default: lr_per_256 x global batch / 256)"),
    "grad_accum_steps": ("train.grad_accum_steps", int, "micro-batches per optimizer step"),
    "device": ("train.device", str, "auto|cpu|cuda"),
    "seed": ("train.seed", int, "seed for init, data order and augmentation"),
    "cuda_graph": (
        "train.cuda_graph",
        graph_setting,
        "auto|true|false: the whole step as one replayed CUDA graph (auto: where it can run)",
    ),
}
SWITCHES = {  # flag -> (config key, value, help)
    "no_profile": ("profiler.enabled", False, "switch torch.profiler off"),
    "compile": ("model.compile", True, "torch.compile the model"),
    "deterministic": (
        "train.deterministic",
        True,
        "deterministic cuDNN/cuBLAS algorithms, for bit-identical GPU resumes",
    ),
}


# The flags of the toolkit's own training: a user's command takes its own arguments instead (--no-profile
# is the profiler's, which a command takes too).
TRAINING_FLAGS = (*FLAGS, *(name for name in SWITCHES if name != "no_profile"))


def add_training_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The run-config flags, on `parser` (hpc.train's, or a group of hpc.submit's)."""
    parser.add_argument("--config", help="run config YAML (e.g. profiles/smoke.yaml)")
    for name, (key, typ, text) in FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=f"{text} [{key}]")
    for name, (key, _, text) in SWITCHES.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, action="store_true", help=f"{text} [{key}]")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override any config value (repeatable)"
    )


def overrides_from_args(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    """(dotted key, value, source flag) for every --set and every training flag given."""
    out = [(*parse_override(s), set_source(s)) for s in args.set]
    for name, (key, _, _) in FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            out.append((key, value, f"--{name.replace('_', '-')}"))
    for name, (key, value, _) in SWITCHES.items():
        if getattr(args, name):
            out.append((key, value, f"--{name.replace('_', '-')}"))
    return out
