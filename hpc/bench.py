"""Per-GPU training speed, the seed scripts' way against the toolkit's, in one process on one device:
`python -m hpc.bench [--arch resnet152] [--stem torchvision|cifar] [--batch 128,512] [--steps N] [--out FILE]`.

Configurations, run one after the other on the same device, warm-up steps excluded, GPU time taken
with CUDA events after a synchronize:
- baseline: as shared/seeds/000 and 002 train: fp32, torchvision transforms in a DataLoader with 2
  workers, DDP over one process, `loss.item()` every step;
- toolkit: the training path's defaults: the uint8 set on the device with augmentation there, bf16
  autocast, channels_last, fused SGD, no per-step host sync;
- baseline plus each of those switched on alone; the toolkit without DDP (the bare model: what DDP
  costs at world size 1); the toolkit with its whole step captured in a CUDA graph (world size 1,
  CUDA only); and with torch.compile (--compile).
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
import copy
import dataclasses
import datetime as dt
import functools
import gc
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hpc.cli import Parser, UsageError, check_output_file
from hpc.config import ARCHS, ModelConfig, ProfilerConfig, TrainConfig, write_atomic
from hpc.scaling import PERLMUTTER_BUSBW_GBS, scaling_prediction
from hpc.trainer import percentile

# Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets, by device-name substring.
DEVICE_PEAKS = {
    "H200": {"bf16": 989.0, "tf32": 494.0},
    "H100": {"bf16": 989.0, "tf32": 494.0},  # SXM; PCIe parts are lower
    "A100": {"bf16": 312.0, "tf32": 156.0},
}
CIFAR100_TRAIN_IMAGES = 50_000  # one epoch of the study's full data fraction, for the whole-run figure


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    device_data: bool = False
    bf16: bool = False
    channels_last: bool = False
    fused_sgd: bool = False
    host_sync_every_step: bool = True
    compile: bool = False
    ddp: bool = True
    cuda_graph: bool = False  # capture forward + backward + optimizer step once, replay it (bare model)


BASELINE = Variant("baseline")
TOOLKIT = Variant("toolkit", device_data=True, bf16=True, channels_last=True, fused_sgd=True, host_sync_every_step=False)
SINGLE_CHANGES = [
    dataclasses.replace(BASELINE, name="baseline + device data", device_data=True),
    dataclasses.replace(BASELINE, name="baseline + bf16", bf16=True),
    dataclasses.replace(BASELINE, name="baseline + channels_last", channels_last=True),
    dataclasses.replace(BASELINE, name="baseline + fused SGD", fused_sgd=True),
    dataclasses.replace(BASELINE, name="baseline + no host sync", host_sync_every_step=False),
]
TOOLKIT_NO_DDP = dataclasses.replace(TOOLKIT, name="toolkit without DDP", ddp=False)
TOOLKIT_GRAPH = dataclasses.replace(TOOLKIT, name="toolkit + CUDA graph", ddp=False, cuda_graph=True)
TOOLKIT_COMPILE = dataclasses.replace(TOOLKIT, name="toolkit + compile", compile=True)
PROFILED = "toolkit, profiled"  # the toolkit again, under the profiler's default schedule
REPEAT = "toolkit, again"  # the toolkit again: the run-to-run noise every other difference sits in
MEMORY_VARIANTS = [TOOLKIT, dataclasses.replace(TOOLKIT, name="toolkit, fp32", bf16=False)]


def device_peak_tflops(device_name: str, bf16: bool) -> float | None:
    for key, peaks in DEVICE_PEAKS.items():
        if key in device_name:
            return peaks["bf16" if bf16 else "tf32"]
    return None


def variants_for(cuda: bool, with_compile: bool, only: str | None) -> list[Variant]:
    """The configurations to time, in order; --only picks some by name (unknown names are an error)."""
    known = [BASELINE, TOOLKIT, *SINGLE_CHANGES, TOOLKIT_NO_DDP, TOOLKIT_GRAPH, TOOLKIT_COMPILE]
    chosen = [v for v in known if (v is not TOOLKIT_COMPILE or with_compile) and (cuda or not v.cuda_graph)]
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {v.name for v in known}]
        if unknown or not names:
            raise UsageError(f"--only {only!r}: unknown configuration {(unknown or [''])[0]!r}; choose from "
                             + ", ".join(repr(v.name) for v in known))
        chosen = [v for v in known if v.name in names and (cuda or not v.cuda_graph)]
    return chosen


@functools.lru_cache(maxsize=2)
def initial_model(arch: str, stem: str):
    """(model on the CPU, forward FLOPs per image), built once: every configuration starts from a copy
    (building ResNet152 takes seconds of CPU time, more than timing it)."""
    import torch

    from hpc.model import build_model, count_flops_per_image

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, stem=stem))
    return model, count_flops_per_image(model)


def build_training(variant: Variant, arch: str, stem: str, device):
    """(model, the callable a step runs forward through, optimizer, forward FLOPs per image)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = device.type == "cuda"
    cpu_model, flops_per_image = initial_model(arch, stem)
    model = copy.deepcopy(cpu_model).to(device)
    if variant.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward = DDP(model, device_ids=[device.index] if cuda else None) if variant.ddp else model
    if variant.compile:
        forward = torch.compile(forward)
    kwargs = {"fused": True} if (variant.fused_sgd and cuda) else ({"foreach": True} if variant.fused_sgd else {})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kwargs)
    return model, forward, optimizer, flops_per_image


def batch_source(variant: Variant, split, batch: int, n_steps: int, device):
    """next_batch(i) -> (x, y) on the device: the device path, or the seed scripts' DataLoader."""
    import torch

    from hpc import data as data_mod

    n = len(split.labels)
    if variant.device_data:
        batches = data_mod.DeviceBatches(split, device, channels_last=variant.channels_last)
        return lambda i: batches.batch([(i * batch + k) % n for k in range(batch)], augment=True, seed=i)
    order = [k % n for k in range((n_steps + 2) * batch)]
    loader = data_mod.loader_batches(split, order, batch, True, num_workers=2, pin_memory=True, device=device)

    def next_batch(i):
        x, y = next(loader)
        return (x.contiguous(memory_format=torch.channels_last) if variant.channels_last else x), y

    return next_batch


def make_step(variant: Variant, model, forward, optimizer, device):
    """step(x, y) -> loss: forward, backward, optimizer step, gradients cleared."""
    import torch

    from hpc.cudagraph import GraphedStep, lr_on_device, whole_step

    # Autocast's weight cast cache must be off while a CUDA graph is captured.
    autocast = (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                       cache_enabled=not variant.cuda_graph)) if variant.bf16 else contextlib.nullcontext
    core = whole_step(forward, optimizer, autocast)
    if variant.cuda_graph:
        lr_on_device(optimizer, device)
        return GraphedStep(core, model, optimizer)

    def step(x, y):
        loss = core(x, y)
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def time_steps(step, next_batch, n_steps: int, warmup: int, device, host_sync: bool, profiling) -> dict:
    """Run n_steps; per timed step its length and the data's part, on the GPU's clock where there is one."""
    import torch

    cuda = device.type == "cuda"
    marks = []
    t_start = time.perf_counter()
    for i in range(n_steps):
        if i == warmup and cuda:  # peaks after warm-up: without cuDNN's autotuning workspaces
            torch.cuda.synchronize(device)
            first_peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        clock = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else [None] * 3
        stamp = (lambda k: clock[k].record()) if cuda else (lambda k: clock.__setitem__(k, time.perf_counter()))
        stamp(0)
        x, y = next_batch(i)
        stamp(1)
        loss = step(x, y)
        if host_sync:
            loss.item()  # what `running_loss += loss.item()` costs in the seed scripts
        if profiling is not None:
            profiling.step()
        stamp(2)
        marks.append(clock)
    if cuda:
        torch.cuda.synchronize(device)
    wall_s = time.perf_counter() - t_start
    span = (lambda a, b: a.elapsed_time(b) / 1000) if cuda else (lambda a, b: b - a)
    timed = marks[warmup:]
    out = {"step_s": [span(m[0], m[2]) for m in timed], "data_s": [span(m[0], m[1]) for m in timed],
           "wall_s": wall_s, "peak_bytes": None, "steady_peak_bytes": None}
    if cuda:
        steady = torch.cuda.max_memory_allocated(device)
        out.update(peak_bytes=max(first_peak if warmup else 0, steady), steady_peak_bytes=steady)
    return out


def run_variant(variant: Variant, arch: str, stem: str, batch: int, steps: int, warmup: int, split, device,
                profile: bool = False, trace_dir: Path | None = None) -> dict:
    import torch

    from hpc.profiling import maybe_profile

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model, forward, optimizer, flops_per_image = build_training(variant, arch, stem, device)
    flops_per_image *= 3  # forward + backward (~2x forward)
    next_batch = batch_source(variant, split, batch, warmup + steps, device)
    step = make_step(variant, model, forward, optimizer, device)
    # the trace directory is created only when profiling (mkdtemp here left an empty one per configuration)
    trace_dir = trace_dir or Path(tempfile.gettempdir()) / "hpc-bench-traces"
    with maybe_profile(ProfilerConfig(enabled=profile), trace_dir, 0, cuda) as profiling:
        timing = time_steps(step, next_batch, warmup + steps, warmup, device, variant.host_sync_every_step, profiling)
    del step, forward, model, optimizer, next_batch
    timed = timing["step_s"]
    mean = sum(timed) / len(timed)
    tflops = flops_per_image * batch / mean / 1e12
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    peak = device_peak_tflops(device_name, variant.bf16) if cuda else None
    return {
        "config": variant.name, **dataclasses.asdict(variant), "batch": batch, "steps": len(timed),
        "images_per_s": batch / mean, "step_time_mean_s": mean, "step_time_median_s": statistics.median(timed),
        "step_time_p90_s": percentile(timed, 0.9),
        "data_share_pct": 100 * sum(timing["data_s"]) / sum(timed),
        "wall_time_s": timing["wall_s"],
        "peak_memory_bytes": timing["peak_bytes"], "steady_peak_memory_bytes": timing["steady_peak_bytes"],
        "model_flops_per_image": flops_per_image, "achieved_tflops": tflops,
        "device_peak_tflops": peak, "fraction_of_peak": tflops / peak if peak else None,
        "profiled": profile,
    }


def guarded(label: str, batch: int, fn) -> dict:
    """One configuration's result, or its error (an OOM at batch 2048, a failed capture): the rest goes on."""
    try:
        return fn()
    except Exception as e:  # CUDA OOM, capture and compile errors all end one configuration only
        message = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        print(f"{label:28} batch {batch:5}: failed: {type(e).__name__}: {message[:300]}", flush=True)
        return {"config": label, "batch": batch, "error": f"{type(e).__name__}: {message[:300]}"}
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def profiler_overhead(plain: dict, profiled: dict) -> dict:
    """The profiler's cost with its default schedule, from a warm plain run and a profiled one.

    Per step: the median step against the plain run's. Whole run: the profiled run's extra wall time
    (recording, key_averages and trace export included) as a share of one epoch of the full
    CIFAR-100 at this batch size on one GPU, the shortest run the study makes.
    """
    extra_s = profiled["wall_time_s"] - plain["wall_time_s"]
    epoch_s = math.ceil(CIFAR100_TRAIN_IMAGES / plain["batch"]) * plain["step_time_median_s"]
    return {"profiler_overhead_pct": 100 * (profiled["step_time_median_s"] / plain["step_time_median_s"] - 1),
            "profiler_extra_s": extra_s, "profiler_overhead_epoch_pct": 100 * extra_s / epoch_s}


def time_batch(batch: int, variants: list[Variant], args, split, device, trace_root: Path, keep) -> None:
    """Every configuration at one batch size, then the toolkit again plain and profiled; keep(result)
    receives each result as it comes (the caller saves them, so a run cut short keeps what it did)."""
    results = []
    for v in variants:
        r = guarded(v.name, batch, lambda: run_variant(v, args.arch, args.stem, batch, args.steps, args.warmup, split, device))
        results.append(r)
        print_result(r)
        keep(r)
    if not any(r["config"] == TOOLKIT.name and "error" not in r for r in results):
        return
    again = guarded(REPEAT, batch, lambda: run_variant(TOOLKIT, args.arch, args.stem, batch, args.steps, args.warmup,
                                                       split, device))
    again["config"] = REPEAT
    prof = guarded(PROFILED, batch, lambda: run_variant(TOOLKIT, args.arch, args.stem, batch, args.steps, args.warmup,
                                                        split, device, profile=True, trace_dir=trace_root / str(batch)))
    prof["config"] = PROFILED
    for r in (again, prof):
        print_result(r)
    if "error" not in again and "error" not in prof:
        prof.update(profiler_overhead(again, prof))
        print(f"{'profiler overhead':28} batch {batch:5}: {prof['profiler_overhead_pct']:+.1f}% median step, "
              f"+{prof['profiler_extra_s']:.2f} s whole run = {prof['profiler_overhead_epoch_pct']:.2f}% of an epoch",
              flush=True)
    keep(again)
    keep(prof)


def memory_grid(batches: list[int], args, split, device, keep) -> None:
    """Peak allocated memory of training steps per batch size: first step (with cuDNN's autotuning
    workspaces) and steady state, for the toolkit (bf16) and the same path in fp32."""
    for batch in batches:
        for v in MEMORY_VARIANTS:
            r = guarded(v.name, batch, lambda: run_variant(v, args.arch, args.stem, batch, 2, 1, split, device))
            keep({k: r.get(k) for k in ("config", "batch", "error", "peak_memory_bytes", "steady_peak_memory_bytes")})
            if "error" not in r and r["peak_memory_bytes"] is not None:
                print(f"memory {v.name:20} batch {batch:5}: peak {r['peak_memory_bytes'] / 2**30:6.2f} GiB, "
                      f"steady {r['steady_peak_memory_bytes'] / 2**30:6.2f} GiB", flush=True)


def print_result(r: dict) -> None:
    if "error" in r:
        return
    frac = f" ({100 * r['fraction_of_peak']:.1f}% of peak)" if r["fraction_of_peak"] else ""
    print(f"{r['config']:28} batch {r['batch']:5}: {r['images_per_s']:10.1f} img/s  median "
          f"{r['step_time_median_s'] * 1e3:8.2f} ms  data {r['data_share_pct']:4.1f}%  "
          f"{r['achieved_tflops']:7.2f} TFLOP/s{frac}", flush=True)


def environment(device) -> dict:
    import torch

    cuda = device.type == "cuda"
    env = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
           "nccl": None, "python": platform.python_version(), "host": platform.node()}
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
    parser.add_argument("--arch", default="resnet152", choices=ARCHS)
    parser.add_argument("--stem", default="torchvision", choices=("torchvision", "cifar"))
    parser.add_argument("--batch", default="128,512,1024,2048", help="comma-separated per-GPU batch sizes")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--compile", action="store_true", help="also time the toolkit with torch.compile")
    parser.add_argument("--only", help="comma-separated configuration names to run (default: all)")
    parser.add_argument("--memory-grid", metavar="BATCHES",
                        help="instead: peak memory of training steps at these comma-separated batch sizes")
    parser.add_argument("--out", help="JSON results file")
    parser.add_argument("--scaling-step-ms", type=float, metavar="MS",
                        help="only print the scaling model's predictions for this measured 1-GPU step time")
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

    import torch
    import torch.distributed as tdist

    from hpc import data as data_mod

    from hpc.distenv import from_environ
    from hpc.trainer import init_process_group, setup_device

    variants = variants_for(torch.cuda.is_available(), args.compile, args.only)
    # The training's own set-up: the same backend flags (cuDNN autotuning, TF32) and process group.
    single = from_environ({})
    device, cuda = setup_device(TrainConfig(), single)
    init_process_group(single, cuda, TrainConfig().collective_timeout_s)
    report = {**environment(device), "command": " ".join(["python -m hpc.bench", *(argv if argv is not None else sys.argv[1:])]),
              "time": dt.datetime.now().isoformat(timespec="seconds"), "arch": args.arch, "stem": args.stem}
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


def _gib(value) -> str:
    return f"{value / 2**30:.2f}" if value else "-"


def markdown(report: dict) -> str:
    head = f"{report['arch']} ({report['stem']} stem) on {report['device']}, torch {report['torch']}"
    if "memory" in report:
        lines = [head, "", "| configuration | batch | peak, first step (GiB) | peak, steady (GiB) |", "|---|---|---|---|"]
        for r in report["memory"]:
            if r.get("error"):
                lines.append(f"| {r['config']} | {r['batch']} | {r['error'][:80]} | |")
            else:
                lines.append(f"| {r['config']} | {r['batch']} | {_gib(r['peak_memory_bytes'])} | "
                             f"{_gib(r['steady_peak_memory_bytes'])} |")
        return "\n".join(lines)
    lines = [head, "",
             "| configuration | batch | images/s | step median (ms) | step p90 (ms) | data (%) | peak mem (GiB) | TFLOP/s | % of peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['batch']} | failed: {r['error'][:80]} | | | | | | |")
            continue
        frac = f"{100 * r['fraction_of_peak']:.1f}" if r["fraction_of_peak"] else "-"
        lines.append(f"| {r['config']} | {r['batch']} | {r['images_per_s']:.1f} | {r['step_time_median_s'] * 1e3:.2f} | "
                     f"{r['step_time_p90_s'] * 1e3:.2f} | {r['data_share_pct']:.1f} | {_gib(r['peak_memory_bytes'])} | "
                     f"{r['achieved_tflops']:.3f} | {frac} |")
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.bench`, or its console script): errors as one line, exit 2."""
    from hpc.cli import run

    return run("hpc.bench", main, argv)


if __name__ == "__main__":
    from hpc import bench  # the imported module, so its error classes are the ones hpc.cli catches

    sys.exit(bench.cli())
