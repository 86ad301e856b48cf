"""A plain DDP script that logs its loss as many do: torch's SummaryWriter on rank 0, `train/loss` every step
and `val/loss` after each epoch, into --logdir. Run it with torchrun, or any launcher that sets torchrun's
variables. It prints each value it logs (`logged val/loss 3 0.123`), for the tests to compare with what
they read back. Nothing else is special about it."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.tensorboard import SummaryWriter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--logdir", default="runs")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    train = TensorDataset(x[:192], y[:192])
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(train, seed=args.seed)
    loader = DataLoader(train, batch_size=16, sampler=sampler)
    writer = SummaryWriter(args.logdir) if rank == 0 else None
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if writer is not None:
                writer.add_scalar("train/loss", loss.item(), step)
        with torch.no_grad():
            val = nn.functional.cross_entropy(model.module(x[192:]), y[192:]).item()
        if writer is not None:
            writer.add_scalar("val/loss", val, step)
            print(f"logged val/loss {step} {val!r}", flush=True)
    if writer is not None:
        writer.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
