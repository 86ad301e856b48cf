"""Per-GPU training speed, the seed scripts' way against the toolkit's, in one process on one device:
`python -m hpc.bench [--arch resnet152] [--stem torchvision|cifar] [--batch 128,512] [--steps N] [--out FILE]`.

Configurations, run one after the other on the same device, warm-up steps excluded, GPU time taken
with CUDA events after a synchronize:
- baseline: as shared/seeds/000 and 002 train: fp32, torchvision transforms in a DataLoader with 2
  workers, DDP over one process, `loss.item()` every step;
- toolkit: the training path's defaults: the uint8 set on the device with augmentation there, bf16
  autocast, channels_last, fused SGD, no per-step host sync;
- baseline plus each of those switched on alone, and the toolkit plus torch.compile (--compile).
Per configuration: images/s, step time (median, p90), peak memory, achieved TFLOP/s (model FLOPs
counted from its conv and linear layers: forward x 3 for forward + backward) and the share of the
device's dense peak; then the profiler's overhead (the toolkit with the default schedule profiling
against without). On a CPU the same command runs (use a tiny arch); its numbers are not GPU numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hpc.cli import UsageError
from hpc.config import ARCHS, ModelConfig, ProfilerConfig, write_atomic

# Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets, by device-name substring.
DEVICE_PEAKS = {
    "H200": {"bf16": 989.0, "tf32": 494.0},
    "H100": {"bf16": 989.0, "tf32": 494.0},  # SXM; PCIe parts are lower
    "A100": {"bf16": 312.0, "tf32": 156.0},
}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    device_data: bool = False
    bf16: bool = False
    channels_last: bool = False
    fused_sgd: bool = False
    host_sync_every_step: bool = True
    compile: bool = False


BASELINE = Variant("baseline")
TOOLKIT = Variant("toolkit", device_data=True, bf16=True, channels_last=True, fused_sgd=True, host_sync_every_step=False)
SINGLE_CHANGES = [
    dataclasses.replace(BASELINE, name="baseline + device data", device_data=True),
    dataclasses.replace(BASELINE, name="baseline + bf16", bf16=True),
    dataclasses.replace(BASELINE, name="baseline + channels_last", channels_last=True),
    dataclasses.replace(BASELINE, name="baseline + fused SGD", fused_sgd=True),
    dataclasses.replace(BASELINE, name="baseline + no host sync", host_sync_every_step=False),
]


def device_peak_tflops(device_name: str, bf16: bool) -> float | None:
    for key, peaks in DEVICE_PEAKS.items():
        if key in device_name:
            return peaks["bf16" if bf16 else "tf32"]
    return None


def run_variant(variant: Variant, arch: str, stem: str, batch: int, steps: int, warmup: int, split, device,
                profile: bool = False, trace_dir: Path | None = None) -> dict:
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc import data as data_mod
    from hpc.model import build_model, count_flops_per_image
    from hpc.profiling import maybe_profile

    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, stem=stem)).to(device)
    flops_per_image = count_flops_per_image(model) * 3  # forward + backward (~2x forward)
    if variant.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    forward = torch.compile(ddp) if variant.compile else ddp
    kwargs = {"fused": True} if (variant.fused_sgd and cuda) else ({"foreach": True} if variant.fused_sgd else {})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kwargs)
    n = len(split.labels)
    if variant.device_data:
        batches = data_mod.DeviceBatches(split, device, channels_last=variant.channels_last)

        def next_batch(i):
            idx = [(i * batch + k) % n for k in range(batch)]
            return batches.batch(idx, augment=True, seed=i)
    else:
        order = [(k % n) for k in range((warmup + steps + 2) * batch)]
        loader = data_mod.loader_batches(split, order, batch, True, num_workers=2, pin_memory=True, device=device)

        def next_batch(i):
            x, y = next(loader)
            return (x.contiguous(memory_format=torch.channels_last) if variant.channels_last else x), y

    autocast = (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)) if variant.bf16 \
        else contextlib.nullcontext
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    prof_cfg = ProfilerConfig(enabled=profile)
    with maybe_profile(prof_cfg, trace_dir or Path(tempfile.mkdtemp()), 0, cuda) as profiling:
        for i in range(warmup + steps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            x, y = next_batch(i)
            with autocast():
                loss = F.cross_entropy(forward(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if variant.host_sync_every_step:
                loss.item()  # what `running_loss += loss.item()` costs in the seed scripts
            if profiling is not None:
                profiling.step()
            if cuda:
                end.record()
                times.append((start, end))
            else:
                times.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) / 1000 for a, b in times]
    timed = times[warmup:]
    median = statistics.median(timed)
    p90 = sorted(timed)[min(len(timed) - 1, int(0.9 * len(timed)))]
    mean = sum(timed) / len(timed)
    tflops = flops_per_image * batch / mean / 1e12
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    peak = device_peak_tflops(device_name, variant.bf16) if cuda else None
    del forward, ddp, model, optimizer
    return {
        "config": variant.name, **dataclasses.asdict(variant), "batch": batch, "steps": len(timed),
        "images_per_s": batch / mean, "step_time_median_s": median, "step_time_p90_s": p90,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "model_flops_per_image": flops_per_image, "achieved_tflops": tflops,
        "device_peak_tflops": peak, "fraction_of_peak": tflops / peak if peak else None,
        "profiled": profile,
    }


# Scaling model (docs: README "Multi-GPU scaling, on paper"). Bus bandwidths are assumptions to be
# replaced by nccl-tests' all_reduce_perf on the machine: NVLink3 between Perlmutter's 4 A100s
# (4 links of 25 GB/s per pair), and one 25 GB/s Slingshot-11 NIC per GPU between nodes.
PERLMUTTER_BUSBW_GBS = {"intra_node": 200.0, "inter_node": 20.0}


def scaling_prediction(step_time_s: float, grad_bytes: float, gpus_per_node: int, nodes: int,
                       busbw_gbs: dict = PERLMUTTER_BUSBW_GBS, backward_share: float = 2 / 3,
                       bucket_bytes: float = 25e6) -> dict:
    """Predicted weak-scaling efficiency (per-GPU batch fixed) of DDP from a measured 1-GPU step time.

    All-reduce time = bytes x 2(n-1)/n / bus bandwidth (NCCL's ring; busbw as nccl-tests reports it),
    with the slowest link setting the pace (the NIC once there are several nodes). DDP all-reduces
    gradient buckets while backward runs: the exposed part is what does not fit under the backward
    pass (backward_share of the step), plus the last bucket, which can only start when backward ends.
    """
    n = gpus_per_node * nodes
    if n == 1:
        return {"gpus": 1, "allreduce_s": 0.0, "exposed_s": 0.0, "step_s": step_time_s, "efficiency": 1.0}
    busbw = busbw_gbs["inter_node" if nodes > 1 else "intra_node"] * 1e9
    allreduce = grad_bytes * 2 * (n - 1) / n / busbw
    last_bucket = min(bucket_bytes, grad_bytes) * 2 * (n - 1) / n / busbw
    exposed = max(0.0, allreduce - backward_share * step_time_s) + last_bucket
    step = step_time_s + exposed
    return {"gpus": n, "allreduce_s": allreduce, "exposed_s": exposed, "step_s": step, "efficiency": step_time_s / step}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="resnet152", choices=ARCHS)
    parser.add_argument("--stem", default="torchvision", choices=("torchvision", "cifar"))
    parser.add_argument("--batch", default="128,512,1024,2048", help="comma-separated per-GPU batch sizes")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--compile", action="store_true", help="also time the toolkit with torch.compile")
    parser.add_argument("--only", help="comma-separated configuration names to run (default: all)")
    parser.add_argument("--out", help="JSON results file")
    parser.add_argument("--scaling-step-ms", type=float, metavar="MS",
                        help="only print the scaling model's predictions for this measured 1-GPU step time")
    args = parser.parse_args(argv)
    if args.scaling_step_ms is not None:
        return print_scaling(args.arch, args.stem, args.scaling_step_ms / 1000)
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        raise UsageError(f"--batch {args.batch!r}: expected comma-separated integers") from None
    if any(b < 1 for b in batches) or args.steps < 1 or args.warmup < 0:
        raise UsageError(f"--batch {args.batch!r} --steps {args.steps} --warmup {args.warmup}: must be positive")

    import torch
    import torch.distributed as tdist

    from hpc import data as data_mod

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    tdist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=tdist.HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        data_mod.synthesize(tmp, n_train=max(batches) * 2 if max(batches) * 2 >= 100 else 100, n_test=10)
        split, _, _ = data_mod.load_cifar100(tmp)
        variants = [BASELINE, TOOLKIT] + SINGLE_CHANGES
        if args.compile:
            variants.append(dataclasses.replace(TOOLKIT, name="toolkit + compile", compile=True))
        if args.only:
            wanted = set(args.only.split(","))
            variants = [v for v in variants if v.name in wanted]
        results = []
        for batch in batches:
            for v in variants:
                r = run_variant(v, args.arch, args.stem, batch, args.steps, args.warmup, split, device)
                results.append(r)
                print(f"{v.name:28} batch {batch:5}: {r['images_per_s']:10.1f} img/s  median {r['step_time_median_s'] * 1e3:8.2f} ms"
                      f"  {r['achieved_tflops']:7.2f} TFLOP/s" + (f" ({100 * r['fraction_of_peak']:.1f}% of peak)"
                                                                if r["fraction_of_peak"] else ""), flush=True)
            # Profiler overhead: the toolkit path with the default schedule, profiled vs not.
            plain = next(r for r in results if r["config"] == "toolkit" and r["batch"] == batch and not r["profiled"]) \
                if any(r["config"] == "toolkit" and r["batch"] == batch for r in results) else None
            if plain is not None:
                prof = run_variant(TOOLKIT, args.arch, args.stem, batch, args.steps, args.warmup, split, device,
                                   profile=True, trace_dir=Path(tmp) / "traces")
                prof["config"] = "toolkit, profiled"
                prof["profiler_overhead_pct"] = 100 * (prof["step_time_median_s"] / plain["step_time_median_s"] - 1)
                results.append(prof)
                print(f"{'profiler overhead':28} batch {batch:5}: {prof['profiler_overhead_pct']:+.1f}% median step time")
    tdist.destroy_process_group()
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "command": " ".join([sys.executable, "-m", "hpc.bench", *(argv or sys.argv[1:])]),
        "time": dt.datetime.now().isoformat(timespec="seconds"), "arch": args.arch, "stem": args.stem,
        "results": results,
    }
    print("\n" + markdown(report))
    if args.out:
        write_atomic(args.out, json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


def print_scaling(arch: str, stem: str, step_time_s: float) -> int:
    if step_time_s <= 0:
        raise UsageError(f"--scaling-step-ms {step_time_s * 1000:g}: must be > 0")
    from hpc.model import build_model

    params = sum(p.numel() for p in build_model(ModelConfig(arch=arch, stem=stem)).parameters())
    grad_bytes = 4.0 * params  # fp32 gradients, as DDP all-reduces them
    print(f"{arch} ({stem} stem): {params / 1e6:.1f} M parameters, {grad_bytes / 1e6:.0f} MB of fp32 gradients "
          f"per step; 1-GPU step {step_time_s * 1e3:.2f} ms; busbw {PERLMUTTER_BUSBW_GBS} GB/s")
    print("| GPUs | nodes | all-reduce (ms) | exposed (ms) | step (ms) | efficiency |\n|---|---|---|---|---|---|")
    for gpus, nodes in ((1, 1), (2, 1), (4, 1), (4, 2), (4, 4), (4, 16)):
        p = scaling_prediction(step_time_s, grad_bytes, gpus, nodes)
        print(f"| {p['gpus']} | {nodes} | {p['allreduce_s'] * 1e3:.2f} | {p['exposed_s'] * 1e3:.2f} | "
              f"{p['step_s'] * 1e3:.2f} | {p['efficiency']:.3f} |")
    return 0


def markdown(report: dict) -> str:
    lines = [f"{report['arch']} ({report['stem']} stem) on {report['device']}, torch {report['torch']}", "",
             "| configuration | batch | images/s | step median (ms) | step p90 (ms) | peak mem (GiB) | TFLOP/s | % of peak |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        mem = f"{r['peak_memory_bytes'] / 2**30:.2f}" if r["peak_memory_bytes"] else "-"
        frac = f"{100 * r['fraction_of_peak']:.1f}" if r["fraction_of_peak"] else "-"
        lines.append(f"| {r['config']} | {r['batch']} | {r['images_per_s']:.1f} | {r['step_time_median_s'] * 1e3:.2f} | "
                     f"{r['step_time_p90_s'] * 1e3:.2f} | {mem} | {r['achieved_tflops']:.3f} | {frac} |")
    return "\n".join(lines)


if __name__ == "__main__":
    from hpc import bench
    from hpc.cli import run

    sys.exit(run("hpc.bench", bench.main))
