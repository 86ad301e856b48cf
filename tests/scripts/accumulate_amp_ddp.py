"""DDP with gradient accumulation and mixed precision, as PyTorch's AMP recipe writes them: `torch.autocast`
around the forward pass, `GradScaler` scaling the loss, `scaler.step(optimizer)` and `scaler.update()`
once every --accumulate micro-batches, the gradient sync skipped in between (`no_sync`). On the CPU the
autocast type is bfloat16 and the scaler is torch.amp's for "cpu". Run it with `torchrun
--nproc-per-node 2 accumulate_amp_ddp.py`."""

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count()) if cuda else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 3, 32, 32, generator=g), torch.randint(0, 10, (512,), generator=g))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                              nn.Linear(128, 10)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type)
    steps = 0
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % args.accumulate == 0
            with model.no_sync() if not last else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=torch.float16 if cuda else torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device)) / args.accumulate
                scaler.scale(loss).backward()
            if last:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                steps += 1
    print(f"rank {dist.get_rank()}: {steps} optimizer steps", flush=True)
    time.sleep(0.05)  # gloo's thread drops its tensors first (torchrun_ddp.py's leave_group says why)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
