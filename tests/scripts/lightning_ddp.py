"""PyTorch Lightning as its documentation writes it: a LightningModule, `L.Trainer(devices=...,
num_nodes=..., strategy="ddp")`, `ModelCheckpoint(save_last=True)` and `trainer.fit(..., ckpt_path="last")`
so that a requeued job resumes. Lightning finds its ranks itself (SLURMEnvironment under Slurm; torchrun's
variables elsewhere). Synthetic CIFAR-shaped data stand in for the download. Prints the final weights'
digest on rank 0. Test knobs: --step-sleep (each step takes longer), --straggler-sleep (global rank 0 sleeps
that much more each step: the other ranks wait for it in DDP's all-reduce)."""

import argparse
import hashlib
import time

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self, step_sleep: float = 0.0, straggler_sleep: float = 0.0, say_steps: bool = False,
                 lr: float = 0.01):
        super().__init__()
        self.lr = lr
        self.say_steps = say_steps
        self.model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                   nn.Linear(128, 10))
        self.step_sleep = step_sleep
        self.straggler_sleep = straggler_sleep

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.log("train_loss", loss)
        if self.step_sleep:
            time.sleep(self.step_sleep)
        if self.straggler_sleep and self.global_rank == 0:
            time.sleep(self.straggler_sleep)
        if self.say_steps and self.global_rank == 0:  # a line a test can wait for, instead of a clock
            print(f"epoch {self.current_epoch} batch {batch_idx} done", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--root", default="lightning_logs")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--straggler-sleep", type=float, default=0.0)
    parser.add_argument("--say-steps", action="store_true", help="rank 0 prints a line after each training step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    L.seed_everything(args.seed)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 32, 32, generator=g), torch.randint(0, 10, (256,), generator=g))
    trainer = L.Trainer(accelerator="auto", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp",
                        max_epochs=args.epochs, default_root_dir=args.root, enable_progress_bar=False,
                        callbacks=[ModelCheckpoint(dirpath=f"{args.root}/checkpoints", save_last=True)])
    model = LitClassifier(args.step_sleep, args.straggler_sleep, args.say_steps, args.lr)
    trainer.fit(model, DataLoader(data, batch_size=16), ckpt_path="last")
    if trainer.is_global_zero:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        print(f"final weights sha256 {digest} after {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
