"""A DDP script that profiles itself, as PyTorch's profiler recipe teaches: `torch.profiler.profile` with
a schedule and `tensorboard_trace_handler` around its training loop, `prof.step()` after each step. Run
it with `torchrun --nproc-per-node 2 own_profiler_ddp.py --logdir ./log`.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", default="./log")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--wait", type=int, default=2, help="the schedule's wait steps")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=args.wait, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(args.logdir, worker_name=f"mine{rank}")) as prof:
        for _ in range(args.steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    print(f"rank {rank}: done, {args.steps} steps", flush=True)
    time.sleep(0.05)  # see torchrun_ddp.py's leave_group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
