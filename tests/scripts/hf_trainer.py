"""HF Trainer as its documentation writes it: `TrainingArguments`, `Trainer(model, args, train_dataset)`,
a model of one's own that returns its loss first (the Trainer's documented contract for a plain
`nn.Module`), and the examples' resume rule: `trainer.train(resume_from_checkpoint=...)` from the last
`checkpoint-N` in the output directory. Run with `accelerate launch hf_trainer.py` or `torchrun`. Prints,
on each process, what the Trainer's Accelerate state made of it: its process index, the number of
processes, the mixed precision, and the optimizer steps done."""

import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class RandomImages(Dataset):
    def __init__(self, size=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (size,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                                    nn.Flatten(), nn.Linear(128, 10))

    def forward(self, x, labels=None):
        logits = self.layers(x)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="hf_out")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=16,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        logging_steps=4,
        save_strategy="epoch",
        report_to="none",
        seed=args.seed,
    )
    trainer = Trainer(model=SmallNet(), args=training_args, train_dataset=RandomImages())
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    state = trainer.accelerator.state
    print(f"process {state.process_index} of {state.num_processes}: mixed precision {state.mixed_precision}, "
          f"device {state.device}, {trainer.state.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
