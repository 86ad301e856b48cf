"""The study's points measured as users wait for them: the paper-style script (tests/gpu/seed_script.py)
and `hpc.train` on the same files, each a whole process, one after the other:

    python tests/gpu/study_point.py --data-root DATA --out results/gpu/study_point.json \\
        [--points 1/2:128,1/2:1024,1/2:2048,1/10:2048,1:128] [--epochs 3] [--workers 8] [--mode graph] \\
        [--submit-points 1/2:128,1/10:2048] [--arch resnet152] [--nproc 1] [--no-profile]

At each point (data fraction : per-GPU batch) both sides run under torchrun (`--standalone`): the same
launcher. The toolkit also runs at --submit-points the way it starts its own ranks, `hpc.submit --local`
(a runner per rank, one torch import per rank, no torchrun agent): its rows say `launcher: submit`.
The toolkit runs profiles/study.yaml's run sections (the paper's optimizer, its profiler window) at the
point, in step mode --mode; the script with --workers DataLoader workers (its own timer per epoch).
`whole_s` is the process's wall time (started to exited); `epoch_s` each epoch as the process measured
it. The comparisons and their targets: tests/gpu/study_targets.py. The JSON (and study_point.md beside
it) is written again after each row, atomically: a call cut short keeps the rows it measured. Exit 1
when a process failed (its row keeps its exit status), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc.core.files import write_atomic  # noqa: E402  (torch-free: the project's one atomic write)
from study_targets import comparisons, markdown  # noqa: E402  (beside this file)

SEED_SCRIPT = REPO / "tests" / "gpu" / "seed_script.py"
STUDY = REPO / "profiles" / "study.yaml"
POINTS = "1/2:128,1/2:1024,1/2:2048,1/10:2048,1:128"


def points(text: str) -> list[tuple[str, int]]:
    """'1/2:128,1:128' -> [('1/2', 128), ('1', 128)]; ValueError naming the bad one."""
    out = []
    for word in filter(None, text.split(",")):
        fraction, _, batch = word.partition(":")
        if not (0 < Fraction(fraction) <= 1) or int(batch) < 1:
            raise ValueError(word)
        out.append((fraction, int(batch)))
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--work-dir", help="run directories and configs (default: a temporary directory)")
    p.add_argument("--points", default=POINTS, help="fraction:batch, comma-separated")
    p.add_argument("--submit-points", default="1/2:128,1/10:2048",
                   help="where the toolkit also runs under hpc.submit --local ('' for none)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=8, help="the script's DataLoader workers")
    p.add_argument("--mode", default="auto", choices=("auto", "graph", "eager"),
                   help="the toolkit's step mode (auto: graph on CUDA)")
    p.add_argument("--no-profile", action="store_true", help="the toolkit without the study's profiler window")
    p.add_argument("--arch", default="resnet152", help="for both (a torchvision ResNet name)")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per run")
    p.add_argument("--timeout-s", type=float, default=600, help="per process")
    args = p.parse_args(argv)
    for name in ("points", "submit_points"):
        try:
            setattr(args, name, points(getattr(args, name)))
        except (ValueError, ZeroDivisionError) as e:
            p.error(f"--{name.replace('_', '-')}: {e} is not fraction:batch (a fraction in (0, 1], a batch >= 1)")
    if args.epochs < 1:
        p.error(f"--epochs {args.epochs}: at least 1")
    return args


def timed(cmd: list[str], timeout_s: float, log: Path) -> tuple[int, float]:
    """(exit status, wall seconds) of a whole process; its output goes to log."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            done = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - start


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def slug(fraction: str, batch: int) -> str:
    return f"f{fraction.replace('/', '_')}-b{batch}"


def seed_row(args: argparse.Namespace, work: Path, fraction: str, batch: int) -> dict[str, Any]:
    out = work / f"script-{slug(fraction, batch)}.json"
    cmd = [*torchrun(args.nproc), str(SEED_SCRIPT), "--data-root", args.data_root, "--fraction", fraction,
           "--batch-size", str(batch), "--epochs", str(args.epochs), "--workers", str(args.workers),
           "--arch", args.arch, "--out", str(out)]  # fmt: skip
    rc, whole_s = timed(cmd, args.timeout_s, out.with_suffix(".log"))
    epochs = json.loads(out.read_text())["epoch_s"] if rc == 0 and out.is_file() else []
    return {"side": "script", "launcher": "torchrun", "fraction": fraction, "batch": batch, "mode": "eager",
            "ddp": True, "workers": args.workers, "whole_s": whole_s, "epoch_s": epochs, "rc": rc}  # fmt: skip


def data_source(root: Path) -> str:
    """What the root holds, as data.source says it: the real CIFAR-100, or the synthetic set a GPU machine
    without internet gets (tests/gpu/run.sh writes one)."""
    import pickle

    with open(root / "cifar-100-python" / "meta", "rb") as f:
        names = pickle.load(f, encoding="latin1").get("fine_label_names", [])  # our own files here
    return "synthetic" if names and str(names[0]) in ("class_000", "b'class_000'") else "cifar100"


def toolkit_config(args: argparse.Namespace, fraction: str, batch: int) -> dict[str, Any]:
    """profiles/study.yaml's run sections for this point (its sweep section is the grid, not a run)."""
    cfg = {k: v for k, v in yaml.safe_load(STUDY.read_text()).items() if k != "sweep"}
    cfg.setdefault("data", {})["fraction"] = fraction
    cfg["data"]["source"] = data_source(Path(args.data_root))  # the same files the seed script reads
    cfg["model"]["arch"] = args.arch
    graph = {"auto": "auto", "graph": True, "eager": False}[args.mode]
    cfg["train"].update({"batch_size": batch, "epochs": args.epochs, "cuda_graph": graph})
    return cfg


def toolkit_row(args: argparse.Namespace, work: Path, fraction: str, batch: int, launcher: str) -> dict[str, Any]:
    name = f"toolkit-{launcher}-{slug(fraction, batch)}"
    config, run_dir = work / f"{name}.yaml", work / name
    config.write_text(yaml.safe_dump(toolkit_config(args, fraction, batch)))
    common = ["--config", str(config), "--data-root", args.data_root, *(["--no-profile"] if args.no_profile else [])]
    if launcher == "torchrun":
        cmd = [*torchrun(args.nproc), "-m", "hpc.train", "--run-dir", str(run_dir), *common]
    else:  # the toolkit's own way: a runner per rank (submitit's local executor here, srun on Slurm)
        cmd = [sys.executable, "-m", "hpc.submit", "--local", "--gpus", str(args.nproc), "--wait",
               "--runs-dir", str(work / "submitted"), "--name", name, *common]  # fmt: skip
    rc, whole_s = timed(cmd, args.timeout_s, work / f"{name}.log")
    if launcher != "torchrun":  # RUNS/NAME/<job id>/
        run_dir = next(iter(sorted((work / "submitted" / name).glob("*/summary.json"))), run_dir).parent
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    first = (summary.get("ranks") or [{}])[0]
    return {"side": "toolkit", "launcher": launcher, "fraction": fraction, "batch": batch,
            "mode": first.get("step_mode", args.mode), "ddp": bool(first.get("ddp")), "whole_s": whole_s,
            "epoch_s": [r["epoch_time_s"] for r in records if r["kind"] == "epoch"], "rc": rc,
            "step_median_s": (first.get("step_time_s") or {}).get("median"), "startup": first.get("startup"),
            "graph_check": first.get("graph_check"), "gpus": summary.get("gpus"), "run_dir": str(run_dir)}  # fmt: skip


def document(args: argparse.Namespace, rows: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
            "epochs": args.epochs, "workers": args.workers, "mode": args.mode, "profiled": not args.no_profile,
            "complete": complete, "rows": rows, "comparisons": comparisons(rows)}  # fmt: skip


def write(args: argparse.Namespace, rows: list[dict[str, Any]], complete: bool) -> None:
    doc = document(args, rows, complete)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1))
    write_atomic(out.with_suffix(".md"), markdown(doc))


def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for fraction, batch in args.points:
        launchers = ["torchrun", *(["submit"] if (fraction, batch) in args.submit_points else [])]
        rows.append(seed_row(args, work, fraction, batch))
        print(json.dumps(rows[-1]), flush=True)
        for launcher in launchers:
            rows.append(toolkit_row(args, work, fraction, batch, launcher))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "gpus"}), flush=True)
        write(args, rows, complete=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = measure(args, work)
    write(args, rows, complete=True)
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.md')}")
    return 1 if any(r["rc"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
