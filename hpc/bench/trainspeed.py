"""Per-GPU training speed, the seed scripts' way against the toolkit's, in one process on one device:
`python -m hpc.bench [--arch resnet152] [--stem torchvision|cifar] [--batch 128,512] [--steps N] [--out FILE]`.

Configurations, run one after the other on the same device, warm-up steps excluded, GPU time taken
with CUDA events after a synchronize:
- baseline: as shared/seeds/000 and 002 train: fp32, torchvision transforms in a DataLoader with 2
  workers, DDP over one process, `loss.item()` every step;
- toolkit: the training path's defaults: the uint8 set on the device with augmentation there, bf16
  autocast, channels_last, fused SGD, no per-step host sync;
- baseline plus each of those switched on alone; the toolkit without DDP (the bare model: what DDP
  costs at world size 1); the toolkit with the trainer's graphed step (DDP built on the capture's side
  stream, its warm-up, the capture and the graph check; world size 1, CUDA only); and with
  torch.compile (--compile).
Per configuration: images/s, step time (median, p90), the data's share of the step, peak memory,
achieved TFLOP/s (model FLOPs counted from its conv and linear layers: forward x 3 for forward +
backward) and the share of the device's dense peak. Then the profiler's cost with the default
schedule: per step, and over the whole run (trace export included). `--memory-grid` measures the peak
memory of training steps per batch size instead. On a CPU the same command runs (use a tiny arch);
its numbers are not GPU numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from hpc.bench.speedvariants import (
    MEMORY_VARIANTS,
    PROFILED,
    REPEAT,
    TOOLKIT,
    Variant,
    guarded,
    run_variant,
    variants_for,
)
from hpc.core.cli import Parser, check_output_file, run
from hpc.core.errors import EXIT_OK, UsageError
from hpc.core.files import write_atomic
from hpc.placement.scaling import PERLMUTTER_BUSBW_GBS, scaling_prediction
from hpc.settings.schema import ARCHS, ModelConfig, TrainConfig
from hpc.training.data import Split

Keep = Callable[[dict[str, Any]], None]  # receives each result as it comes
CIFAR100_TRAIN_IMAGES = 50_000  # one epoch of the study's full data fraction, for the whole-run figure


def profiler_overhead(plain: dict, profiled: dict) -> dict:
    """The profiler's cost with its default schedule, from a warm plain run and a profiled one.

    Per step: the median step against the plain run's. Whole run: the profiled run's extra wall time
    (recording, key_averages and trace export included) as a share of one epoch of the full
    CIFAR-100 at this batch size on one GPU, the shortest run the study makes.
    """
    extra_s = profiled["wall_time_s"] - plain["wall_time_s"]
    epoch_s = math.ceil(CIFAR100_TRAIN_IMAGES / plain["batch"]) * plain["step_time_median_s"]
    return {
        "profiler_overhead_pct": 100 * (profiled["step_time_median_s"] / plain["step_time_median_s"] - 1),
        "profiler_extra_s": extra_s,
        "profiler_overhead_epoch_pct": 100 * extra_s / epoch_s,
    }


def time_batch(
    batch: int,
    variants: list[Variant],
    args: argparse.Namespace,
    split: Split,
    device: torch.device,
    trace_root: Path,
    keep: Keep,
) -> None:
    """Every configuration at one batch size, then the toolkit again plain and profiled; keep(result)
    receives each result as it comes (the caller saves them, so a run cut short keeps what it did)."""
    results = []
    for v in variants:
        timed = functools.partial(run_variant, v, args.arch, args.stem, batch, args.steps, args.warmup, split, device)
        r = guarded(v.name, batch, timed)
        results.append(r)
        print_result(r)
        keep(r)
    if not any(r["config"] == TOOLKIT.name and "error" not in r for r in results):
        return
    again = guarded(
        REPEAT, batch, lambda: run_variant(TOOLKIT, args.arch, args.stem, batch, args.steps, args.warmup, split, device)
    )
    again["config"] = REPEAT
    prof = guarded(
        PROFILED,
        batch,
        lambda: run_variant(
            TOOLKIT,
            args.arch,
            args.stem,
            batch,
            args.steps,
            args.warmup,
            split,
            device,
            profile=True,
            trace_dir=trace_root / str(batch),
        ),
    )
    prof["config"] = PROFILED
    for r in (again, prof):
        print_result(r)
    if "error" not in again and "error" not in prof:
        prof.update(profiler_overhead(again, prof))
        print_overhead(prof, batch)
    keep(again)
    keep(prof)


def memory_grid(batches: list[int], args: argparse.Namespace, split: Split, device: torch.device, keep: Keep) -> None:
    """Peak allocated memory of training steps per batch size: first step (with cuDNN's autotuning
    workspaces) and steady state, for the toolkit (bf16) and the same path in fp32."""
    for batch in batches:
        for v in MEMORY_VARIANTS:
            r = guarded(
                v.name, batch, functools.partial(run_variant, v, args.arch, args.stem, batch, 2, 1, split, device)
            )
            keep({k: r.get(k) for k in ("config", "batch", "error", "peak_memory_bytes", "steady_peak_memory_bytes")})
            if "error" not in r and r["peak_memory_bytes"] is not None:
                print_memory(v.name, batch, r)


def print_overhead(prof: dict[str, Any], batch: int) -> None:
    print(
        f"{'profiler overhead':28} batch {batch:5}: {prof['profiler_overhead_pct']:+.1f}% median step, "
        f"+{prof['profiler_extra_s']:.2f} s whole run = {prof['profiler_overhead_epoch_pct']:.2f}% of an epoch",
        flush=True,
    )


def print_memory(name: str, batch: int, r: dict[str, Any]) -> None:
    print(
        f"memory {name:20} batch {batch:5}: peak {r['peak_memory_bytes'] / 2**30:6.2f} GiB, "
        f"steady {r['steady_peak_memory_bytes'] / 2**30:6.2f} GiB",
        flush=True,
    )


def print_result(r: dict) -> None:
    if "error" in r:
        return
    frac = f" ({100 * r['fraction_of_peak']:.1f}% of peak)" if r["fraction_of_peak"] else ""
    print(
        f"{r['config']:28} batch {r['batch']:5}: {r['images_per_s']:10.1f} img/s  median "
        f"{r['step_time_median_s'] * 1e3:8.2f} ms  data {r['data_share_pct']:4.1f}%  "
        f"{r['achieved_tflops']:7.2f} TFLOP/s{frac}",
        flush=True,
    )


def environment(device: torch.device) -> dict[str, Any]:

    cuda = device.type == "cuda"
    env = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": None,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if cuda:
        with contextlib.suppress(Exception):
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        props = torch.cuda.get_device_properties(device)
        env.update(device_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count)
    return env


def parse_batches(text: str, flag: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers") from None
    if any(b < 1 for b in batches):
        raise UsageError(f"{flag} {text!r}: batch sizes must be positive")
    return batches


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="python -m hpc.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="resnet152", choices=ARCHS, help="the model (default resnet152)")
    parser.add_argument(
        "--stem", default="torchvision", choices=("torchvision", "cifar"), help="its stem (default torchvision)"
    )
    parser.add_argument("--batch", default="128,512,1024,2048", help="comma-separated per-GPU batch sizes")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--compile", action="store_true", help="also time the toolkit with torch.compile")
    parser.add_argument("--only", help="comma-separated configuration names to run (default: all)")
    parser.add_argument(
        "--memory-grid",
        metavar="BATCHES",
        help="instead: peak memory of training steps at these comma-separated batch sizes",
    )
    parser.add_argument("--out", help="JSON results file")
    parser.add_argument(
        "--scaling-step-ms",
        type=float,
        metavar="MS",
        help="only print the scaling model's predictions for this measured 1-GPU step time",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise UsageError(f"--steps {args.steps} --warmup {args.warmup}: steps must be >= 1, warm-up >= 0")
    check_output_file(args.out, "--out")  # fail now, not after the benchmark
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scaling_step_ms is not None:
        return print_scaling(args.arch, args.stem, args.scaling_step_ms / 1000)
    batches = parse_batches(args.memory_grid or args.batch, "--memory-grid" if args.memory_grid else "--batch")

    from hpc.placement.distenv import from_environ
    from hpc.training import data as data_mod
    from hpc.training.build import before_process_group, setup_device
    from hpc.training.distributed.rendezvous import join
    from hpc.training.graph.graphmode import capture_in_use

    cuda = torch.cuda.is_available()
    variants = variants_for(cuda or not capture_in_use(os.environ).needs_cuda, args.compile, args.only)
    # The training's own set-up: the same backend flags (cuDNN autotuning, TF32) and process group,
    # made as a graphed run makes it when a configuration captures DDP.
    single = from_environ({})
    device, cuda = setup_device(TrainConfig(), single)
    before_process_group(cuda and any(v.cuda_graph for v in variants), single, Path(tempfile.gettempdir()))
    join(single, cuda, TrainConfig().collective_timeout_s)
    report = {
        **environment(device),
        "command": " ".join(["python -m hpc.bench", *(argv if argv is not None else sys.argv[1:])]),
        "time": dt.datetime.now().isoformat(timespec="seconds"),
        "arch": args.arch,
        "stem": args.stem,
    }
    rows = report.setdefault("memory" if args.memory_grid else "results", [])

    def keep(row: dict) -> None:
        rows.append(row)
        if args.out:
            write_atomic(args.out, json.dumps(report, indent=2))

    try:
        with tempfile.TemporaryDirectory() as tmp:
            data_mod.synthesize(tmp, n_train=max(100, max(batches) * 2), n_test=10)
            split, _, _ = data_mod.load_cifar100(tmp)
            if args.memory_grid:
                memory_grid(batches, args, split, device, keep)
            else:
                for b in batches:
                    time_batch(b, variants, args, split, device, Path(tmp), keep)
    finally:
        tdist.destroy_process_group()
    print("\n" + markdown(report))
    if args.out:
        print(f"wrote {args.out}")
    return EXIT_OK


def print_scaling(arch: str, stem: str, step_time_s: float) -> int:
    if step_time_s <= 0:
        raise UsageError(f"--scaling-step-ms {step_time_s * 1000:g}: must be > 0")
    from hpc.training.model import build_model

    params = sum(p.numel() for p in build_model(ModelConfig(arch=arch, stem=stem)).parameters())
    grad_bytes = 4.0 * params  # fp32 gradients, as DDP all-reduces them
    print(
        f"{arch} ({stem} stem): {params / 1e6:.1f} M parameters, {grad_bytes / 1e6:.0f} MB of fp32 gradients "
        f"per step; 1-GPU step {step_time_s * 1e3:.2f} ms; busbw {PERLMUTTER_BUSBW_GBS} GB/s"
    )
    print("| GPUs | nodes | all-reduce (ms) | exposed (ms) | step (ms) | efficiency |\n|---|---|---|---|---|---|")
    for gpus, nodes in ((1, 1), (2, 1), (4, 1), (4, 2), (4, 4), (4, 16)):
        p = scaling_prediction(step_time_s, grad_bytes, gpus, nodes)
        print(
            f"| {p['gpus']} | {nodes} | {p['allreduce_s'] * 1e3:.2f} | {p['exposed_s'] * 1e3:.2f} | "
            f"{p['step_s'] * 1e3:.2f} | {p['efficiency']:.3f} |"
        )
    return EXIT_OK


def _gib(value: float | None) -> str:
    return f"{value / 2**30:.2f}" if value else "-"


def markdown(report: dict) -> str:
    head = f"{report['arch']} ({report['stem']} stem) on {report['device']}, torch {report['torch']}"
    if "memory" in report:
        lines = [
            head,
            "",
            "| configuration | batch | peak, first step (GiB) | peak, steady (GiB) |",
            "|---|---|---|---|",
        ]
        for r in report["memory"]:
            if r.get("error"):
                lines.append(f"| {r['config']} | {r['batch']} | {r['error'][:80]} | |")
            else:
                lines.append(
                    f"| {r['config']} | {r['batch']} | {_gib(r['peak_memory_bytes'])} | "
                    f"{_gib(r['steady_peak_memory_bytes'])} |"
                )
        return "\n".join(lines)
    lines = [
        head,
        "",
        "| configuration | batch | images/s | step median (ms) | step p90 (ms) | data (%) | peak mem (GiB) "
        "| TFLOP/s | % of peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['batch']} | failed: {r['error'][:80]} | | | | | | |")
            continue
        frac = f"{100 * r['fraction_of_peak']:.1f}" if r["fraction_of_peak"] else "-"
        lines.append(
            f"| {r['config']} | {r['batch']} | {r['images_per_s']:.1f} | {r['step_time_median_s'] * 1e3:.2f} | "
            f"{r['step_time_p90_s'] * 1e3:.2f} | {r['data_share_pct']:.1f} | {_gib(r['peak_memory_bytes'])} | "
            f"{r['achieved_tflops']:.3f} | {frac} |"
        )
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.bench`, or its console script): errors as one line, exit 2."""
    return run("hpc.bench", main, argv)
