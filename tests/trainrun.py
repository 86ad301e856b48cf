"""Helpers to start hpc.train ranks the way torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from conftest import free_port

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "profiles" / "smoke.yaml")


def start_ranks(world: int, args: list[str], extra_env: dict | None = None, only: list[int] | None = None
                ) -> list[subprocess.Popen]:
    """The ranks of a `world`-rank run on this machine (`only`: these ranks; the others never come)."""
    port = free_port()
    procs = []
    for rank in range(world) if only is None else only:
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, "-m", "hpc.train", *args], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def wait_all(procs, timeout=300) -> list[tuple[int, str, str]]:
    """Every rank's (exit code, stdout, stderr). A rank still running after `timeout` fails the test with
    what each rank said last, every rank killed first (a hung run outlives no test, and says where it was)."""
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            left = procs[len(out):]
            for q in left:
                q.kill()
            said = [f"rank {len(out) + i}: {(q.communicate()[1] or '')[-1500:]}" for i, q in enumerate(left)]
            raise AssertionError(f"ranks still running after {timeout} s (killed):\n" + "\n".join(said)) from None
        out.append((p.returncode, stdout, stderr))
    return out


def train(world: int, args: list[str], extra_env: dict | None = None, expect: int = 0, timeout: float = 300):
    results = wait_all(start_ranks(world, args, extra_env), timeout=timeout)
    for rc, stdout, stderr in results:
        assert rc == expect, f"rc={rc}\n{stdout}\n{stderr}"
    return results


def weights(run_dir: Path) -> dict:
    return torch.load(Path(run_dir) / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
