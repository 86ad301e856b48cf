"""DataParallel as seed 004's TrainerDP writes it: one process, the model wrapped in `DataParallel` on
"cuda" (every GPU the process sees; the CPU here), the same loop as a single GPU's, a checkpoint saved
each epoch. No process group, no RANK read: run it as `python dataparallel.py`. Synthetic
CIFAR-shaped data stand in for the download."""

import argparse
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.parallel import DataParallel
from torch.utils.data import DataLoader, TensorDataset


class TrainerSingle:
    def __init__(self, gpu_id, model, trainloader):
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.trainloader = trainloader
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def _run_epoch(self, epoch):
        loss = None
        for src, tgt in self.trainloader:
            src, tgt = src.to(self.gpu_id), tgt.to(self.gpu_id)
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(src), tgt)
            loss.backward()
            self.optimizer.step()
        print(f"[{self.gpu_id}] epoch {epoch} loss {loss.item():.4f}", flush=True)

    def train(self, epochs, out):
        for epoch in range(epochs):
            self._run_epoch(epoch)
            torch.save(self.model.state_dict(), out / f"CIFAR10_dp_epoch{epoch}.pt")


class TrainerDP(TrainerSingle):
    def __init__(self, model, trainloader):
        self.gpu_id = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(self.gpu_id, model, trainloader)
        self.model = DataParallel(self.model)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 32, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(256, 10))
    TrainerDP(model, DataLoader(data, batch_size=32, shuffle=True)).train(args.epochs, Path(args.out))


if __name__ == "__main__":
    main()
