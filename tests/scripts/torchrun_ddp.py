"""A small DDP training script in torchrun's style: run it with `torchrun --nproc-per-node 2 torchrun_ddp.py`.

It trains a small convolutional net on a fixed synthetic CIFAR-shaped set, saves a checkpoint when it
gets SIGTERM (a preemption, a time limit's warning) and exits 3, and resumes from the checkpoint when
started again. At the end it writes the final weights to --out.
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

stop_requested = False


def on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def make_data(n=512):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(x, y)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10),
    )


def leave_group():
    """Destroy the process group after a pause. With gloo (torch 2.14), a collective's last reference can
    be dropped on gloo's own thread, which then needs the GIL: if the interpreter is already shutting
    down, that thread exits inside a C++ destructor and the process aborts at its very end (SIGABRT,
    'terminate called without an active exception'; pytorch issue 190489; 2 of 15 runs of torchrun_ddp.py
    here). A pause gives the thread the GIL first (0 of 40 runs then)."""
    time.sleep(0.05)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--ckpt", default="checkpoint.pt")
    parser.add_argument("--out", default="final.pt")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    data = make_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(make_model().to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    epoch, step = 0, 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location="cpu", weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        epoch, step = state["epoch"], state["step"]
        print(f"rank {rank}: resumed at epoch {epoch} step {step}", flush=True)

    while epoch < args.epochs:
        sampler.set_epoch(epoch)
        loss = None  # an epoch resumed at its last step has none left
        for i, (x, y) in enumerate(loader):
            if i < step:
                continue  # done before the checkpoint
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step = i + 1
            time.sleep(args.step_sleep)
            flag = torch.tensor([1.0 if stop_requested else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item() > 0:
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                                "epoch": epoch, "step": step}, args.ckpt + ".tmp")
                    os.replace(args.ckpt + ".tmp", args.ckpt)
                    print(f"rank 0: SIGTERM: saved epoch {epoch} step {step} to {args.ckpt}", flush=True)
                dist.barrier()
                leave_group()
                sys.exit(3)
        if rank == 0 and loss is not None:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
        epoch, step = epoch + 1, 0

    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
        digest = hashlib.sha256()
        for t in model.module.state_dict().values():
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        print(f"final weights sha256 {digest.hexdigest()}", flush=True)
    leave_group()


if __name__ == "__main__":
    main()
