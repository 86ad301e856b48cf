"""A DDP script that registers a communication hook of its own (torch's allreduce hook from
`torch.distributed.algorithms.ddp_comm_hooks`, counting the buckets it reduces), as scripts that compress
their gradients do. `--slow-rank R --slow-s 0.3` makes rank R do 300 ms more work than the others before
each backward pass (a slow data pipeline, a slower GPU). Run it with `torchrun --nproc-per-node 2
comm_hook_ddp.py`.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

buckets_reduced = 0


def counting_allreduce(state, bucket):
    global buckets_reduced
    buckets_reduced += 1
    return default_hooks.allreduce_hook(state, bucket)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    model.register_comm_hook(None, counting_allreduce)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        if rank == args.slow_rank:
            time.sleep(args.slow_s)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank}: done, {args.steps} steps, {buckets_reduced} buckets reduced by my hook", flush=True)
    time.sleep(0.05)  # see torchrun_ddp.py's leave_group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
