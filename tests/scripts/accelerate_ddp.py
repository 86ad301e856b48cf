"""HF Accelerate as its documentation writes it: `Accelerator()`, `accelerator.prepare(model, optimizer,
dataloader)`, `accelerator.backward(loss)`, run with `accelerate launch accelerate_ddp.py` (which reads the
user's accelerate config). Prints, on each process, what Accelerate made of it: its process index, the
number of processes, the mixed precision, and the final loss."""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 32, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=16))
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    print(f"process {accelerator.process_index} of {accelerator.num_processes}: mixed precision "
          f"{accelerator.mixed_precision}, device {accelerator.device}, loss {loss.item():.4f}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
