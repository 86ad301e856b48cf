"""HF Accelerate as its documentation writes it: `Accelerator()`, `accelerator.prepare(model, optimizer,
dataloader)`, `accelerator.backward(loss)`, run with `accelerate launch accelerate_ddp.py` (which reads the
user's accelerate config); with --checkpoint-dir, its checkpointing guide's `accelerator.save_state` at
each epoch's end (`epoch_N`) and `load_state` of the last one at start, resuming at the next epoch, as
its examples' --resume_from_checkpoint does. Prints, on each process, what Accelerate made of it: its
process index, the number of processes, the mixed precision, and the final loss; on the main process
the final weights' digest."""

import argparse
import hashlib
import os
import time

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def last_epoch_saved(folder):
    done = [d for d in os.listdir(folder) if d.startswith("epoch_")] if folder and os.path.isdir(folder) else []
    return max(done, key=lambda d: int(d.split("_")[1]), default=None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 32, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=16))
    starting_epoch = 0
    last = last_epoch_saved(args.checkpoint_dir)
    if last is not None:
        accelerator.load_state(os.path.join(args.checkpoint_dir, last))
        starting_epoch = int(last.split("_")[1]) + 1
        accelerator.print(f"resumed from {last}")
    for epoch in range(starting_epoch, args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            time.sleep(args.step_sleep)
        if args.checkpoint_dir:
            accelerator.save_state(os.path.join(args.checkpoint_dir, f"epoch_{epoch}"))
            accelerator.print(f"saved epoch_{epoch}")
    print(f"process {accelerator.process_index} of {accelerator.num_processes}: mixed precision "
          f"{accelerator.mixed_precision}, device {accelerator.device}, loss {loss.item():.4f}", flush=True)
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict().values()
        digest = hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in weights)).hexdigest()
        print(f"final weights sha256 {digest}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
