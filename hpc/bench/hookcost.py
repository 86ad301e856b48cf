"""What the start-up hook costs a user's step (a benchmark, not a test):

    python -m hpc.bench.hookcost --steps 400 --layers 8 --repeats 3

Runs one small training loop (an MLP of `--layers` linear layers, SGD, on the CPU; a GPU's step only
hides the hook's host time behind its kernels) as a whole process three ways, alternating, `--repeats`
times each: plain (no hook), hooked with profiling off (the step hook's count and times, the
first-gradient hook on every parameter, the beat), and hooked with the toolkit's profiler on its default
schedule. Each process times its own steps (perf_counter around the optimizer step, from the first
step after the warm-up ones); printed: the median step per way and the difference from plain, per step
and per parameter. No torch import here: each way is a process of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hpc.core.beat import BEAT_VARIABLE, beat_pipe
from hpc.core.cli import Parser, counts, run
from hpc.core.errors import EXIT_OK
from hpc.launch.rank.rankenv import HOOK_DIR
from hpc.settings.rankcommand import PROFILER_VARIABLE, RUN_DIR_VARIABLE

WARMUP_STEPS = 20
LOOP = """import json, sys, time, torch
torch.manual_seed(0); torch.set_num_threads(1)
steps, layers = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(16, 64)
times = []
for i in range(steps):
    began = time.perf_counter()
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
    times.append(time.perf_counter() - began)
print(json.dumps({"times": times[int(sys.argv[3]):], "params": sum(1 for _ in model.parameters())}))
"""


def one_process(way: str, steps: int, layers: int, run_dir: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in (PROFILER_VARIABLE, RUN_DIR_VARIABLE, BEAT_VARIABLE)}
    env["OMP_NUM_THREADS"] = "1"
    fds: tuple[int, ...] = ()
    read_fd = None
    if way != "plain":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH", "")) if p)
        env[RUN_DIR_VARIABLE] = str(run_dir)
        read_fd, write_fd, env[BEAT_VARIABLE] = beat_pipe()
        fds = (write_fd,)
        if way == "profiled":
            env[PROFILER_VARIABLE] = json.dumps({"enabled": True})
    try:  # the beat is read by nobody: the pipe's buffer takes a step's byte until it is full, then drops it
        words = [sys.executable, "-c", LOOP, str(steps), str(layers), str(WARMUP_STEPS)]
        out = subprocess.run(
            words, capture_output=True, text=True, env=env, pass_fds=fds, check=True, timeout=600
        ).stdout
    finally:
        for fd in (*fds, *((read_fd,) if read_fd is not None else ())):
            os.close(fd)
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hpc.bench.hookcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="400", help="optimizer steps a process (the first 20 not timed)")
    parser.add_argument("--layers", default="8", help="linear layers in the model (2 parameters each)")
    parser.add_argument("--repeats", default="3", help="processes per way")
    args = parser.parse_args(argv)
    steps, layers, repeats = (counts(getattr(args, k), f"--{k}", 1, "3")[0] for k in ("steps", "layers", "repeats"))
    steps = max(steps, WARMUP_STEPS + 1)
    ways = ("plain", "hooked", "profiled")
    medians: dict[str, list[float]] = {w: [] for w in ways}
    params = 0
    with tempfile.TemporaryDirectory(prefix="hookcost-") as tmp:
        for i in range(repeats):
            for way in ways:
                got = one_process(way, steps, layers, Path(tmp) / f"{way}{i}")
                medians[way].append(statistics.median(got["times"]))  # type: ignore[arg-type]  # JSON list
                params = int(got["params"])  # type: ignore[call-overload]  # JSON int
    plain = statistics.median(medians["plain"])
    print(f"{steps - WARMUP_STEPS} timed steps x {repeats} processes a way, {params} parameters, CPU, 1 thread")
    print("| way | median step (us) | over plain (us/step) | over plain (us/parameter) |")
    print("|---|---|---|---|")
    for way in ways:
        m = statistics.median(medians[way])
        print(f"| {way} | {m * 1e6:.1f} | {(m - plain) * 1e6:+.1f} | {(m - plain) * 1e6 / params:+.2f} |")
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    return run("hpc.bench.hookcost", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
