"""DDP as the study's main.py writes it: RANK and WORLD_SIZE read from the environment and handed to
init_process_group, a DistributedSampler over a subset of the data, the batch size and the data size
factor as arguments. Synthetic CIFAR-100-shaped data stand in for the download."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def get_train_loader(batch_size, data_size_factor, rank, world_size):
    g = torch.Generator().manual_seed(0)
    full = TensorDataset(torch.randn(1000, 3, 32, 32, generator=g), torch.randint(0, 100, (1000,), generator=g))
    trainset = Subset(full, range(int(len(full) * data_size_factor)))
    sampler = DistributedSampler(trainset, num_replicas=world_size, rank=rank)
    return DataLoader(trainset, batch_size=batch_size, sampler=sampler, pin_memory=torch.cuda.is_available())


def leave_group():
    """A pause, then destroy the group: gloo's thread must drop its last tensors before Python shuts down
    (torchrun_ddp.py's leave_group says why)."""
    time.sleep(0.05)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--data-size-factor", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    # initialize the process group
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")

    trainloader = get_train_loader(args.batch_size, args.data_size_factor, rank, world_size)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(256, 100)).to(device)
    model = DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    for epoch in range(args.epochs):
        trainloader.sampler.set_epoch(epoch)
        for inputs, labels in trainloader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}")
    leave_group()


if __name__ == "__main__":
    main()
