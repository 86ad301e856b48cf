"""DDP training with an evaluation on rank 0 alone between epochs, as many scripts write it
(`if rank == 0: evaluate(...)` then `dist.barrier()`): minutes without an optimizer step, rank 0's CPU busy
with forward passes over the validation set, the other ranks waiting in the barrier. Prints each
evaluation's length and 'done' at the end."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model, seconds, busy):
    """Forward passes over a fixed validation set until `seconds` have gone (a large set, a slow model). With
    busy under 1, each pass is followed by a wait for the next batch, as from a loader reading a disk: the
    passes are that share of the time."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 3, 32, 32, generator=g)
    began, batches = time.monotonic(), 0
    model.eval()
    with torch.no_grad():
        while time.monotonic() - began < seconds:
            start = time.monotonic()
            model(x)
            batches += 1
            time.sleep((time.monotonic() - start) * (1 - busy) / busy)
    model.train()
    return time.monotonic() - began, batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps an epoch")
    parser.add_argument("--eval-s", type=float, default=60.0)
    parser.add_argument("--busy", type=float, default=1.0, help="the evaluation's share of time in forward passes")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(16, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    for epoch in range(args.epochs):
        for _ in range(args.steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if rank == 0:
            took, batches = evaluate(model.module, args.eval_s, args.busy)
            print(f"epoch {epoch}: evaluated {batches} batches in {took:.0f} s", flush=True)
        dist.barrier()
    print(f"rank {rank}: done", flush=True)
    time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
