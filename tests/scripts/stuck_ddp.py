"""A DDP script with a bug on one rank: at step --stuck-step, rank --stuck-rank waits for a result its
worker thread never delivers (a lost wake-up), stuck in Python for ever while the others wait for it in
the gradient sync. Run it with `torchrun --nproc-per-node 2 stuck_ddp.py`.
"""

import argparse
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fetch_batch(ready: threading.Event) -> None:
    ready.wait()  # nobody sets it: the bug


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--stuck-step", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        if rank == args.stuck_rank and step == args.stuck_step:
            fetch_batch(threading.Event())
        loss = model(torch.randn(8, 16)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
