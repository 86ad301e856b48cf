"""A DDP script with a bug on one rank: rank --crash-rank raises at step --crash-step."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def leave_group():
    """A pause, then destroy the group: gloo's thread must drop its last tensors before Python shuts down
    (torchrun_ddp.py's leave_group says why)."""
    time.sleep(0.05)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--crash-step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        if rank == args.crash_rank and step == args.crash_step:
            raise ValueError(f"bad batch at step {step} on rank {rank} (pid {os.getpid()})")
        loss = model(torch.randn(8, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    leave_group()


if __name__ == "__main__":
    main()
