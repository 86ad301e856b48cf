"""The study's training script as its paper describes it (shared/seeds/003, sections 3-4), written out
so the toolkit can be timed against what its users would otherwise run: torchvision's CIFAR100 with
ToTensor/Normalize, a Subset of the training set, a DataLoader over a DistributedSampler with
pin_memory=True, ResNet wrapped in DistributedDataParallel (NCCL on a GPU, gloo on the CPU), SGD with
lr 0.001 and momentum 0.9, fp32, no profiler. One process per GPU, under torchrun:

    torchrun --standalone --nproc-per-node 1 tests/gpu/seed_script.py --data-root DATA --fraction 1/2 \\
        --batch-size 128 --epochs 1 --workers 8 --out seed.json

Each epoch is timed on rank 0 from its first batch request to its last optimizer step, after a
synchronize (the GPU's queue drained at both ends); --out receives {"epoch_s": [...], "steps_per_epoch",
"world_size", "device"}. Not part of the toolkit: tests/gpu/study_point.py runs it, and
tests/e2e/test_study_point.py runs it on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import transforms

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


class CifarFiles(torchvision.datasets.CIFAR100):
    """torchvision's reader, unchanged, but without its md5 checks (an md5 of None checks that the file
    exists): the machines that run this have no internet and use a synthetic set in CIFAR-100's exact
    format (hpc.data synth), whose bytes differ."""

    train_list = [[name, None] for name, _ in torchvision.datasets.CIFAR100.train_list]
    test_list = [[name, None] for name, _ in torchvision.datasets.CIFAR100.test_list]
    meta = {**torchvision.datasets.CIFAR100.meta, "md5": None}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--fraction", default="1", help="of the training set: 1, 1/2, 0.1 ...")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--arch", default="resnet152", help="a torchvision ResNet (resnet18 on the CPU in tests)")
    p.add_argument("--out", help="JSON file for the epoch times (written by rank 0)")
    return p.parse_args()


def loader(args: argparse.Namespace, rank: int, world: int, cuda: bool) -> tuple[DataLoader, DistributedSampler]:
    normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize(CIFAR100_MEAN, CIFAR100_STD)])
    trainset = CifarFiles(args.data_root, train=True, download=False, transform=normalize)
    trainset = Subset(trainset, range(int(len(trainset) * Fraction(args.fraction))))
    sampler = DistributedSampler(trainset, num_replicas=world, rank=rank)
    batches = DataLoader(trainset, batch_size=args.batch_size, sampler=sampler, pin_memory=cuda,
                         num_workers=args.workers, persistent_workers=args.workers > 0)
    return batches, sampler


def main() -> None:
    args = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    batches, sampler = loader(args, rank, world, cuda)
    model = torchvision.models.get_model(args.arch, num_classes=100).to(device)
    model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    epoch_s = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for images, labels in batches:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        epoch_s.append(time.perf_counter() - start)
        if rank == 0:
            print(f"epoch {epoch + 1}: {epoch_s[-1]:.2f} s, loss {loss.item():.4f}", flush=True)
    if rank == 0 and args.out:
        write_json(Path(args.out), {"epoch_s": epoch_s, "steps_per_epoch": len(batches), "world_size": world,
                                    "device": torch.cuda.get_device_name(device) if cuda else "cpu"})
    dist.destroy_process_group()


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(doc, f)
    os.replace(f.name, path)


if __name__ == "__main__":
    main()
