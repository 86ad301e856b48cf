"""A script's own metrics read from what its logger wrote (issue 88), each file made by the logger's own code:
torch's SummaryWriter, Lightning's CSVLogger and TensorBoardLogger in a real fit, the HF Trainer's TrainerState,
a plain JSONL and the toolkit's metrics.jsonl. The oracle is the values handed to the logger."""

import json
import struct

import pytest

from analysis.read.metrics import choose, logged_metrics, summarise


def f32(value: float) -> float:
    """A value as TensorBoard stores it (simple_value is a 32-bit float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def test_summary_writer_scalars_are_read_whole_with_their_steps(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logged = {"train/loss": [(s, 2.0 / (s + 1)) for s in range(0, 300, 3)], "val/acc": [(50, 0.25), (100, 0.5)]}
    with SummaryWriter(str(tmp_path / "tb")) as writer:
        for name, points in logged.items():
            for step, value in points:
                writer.add_scalar(name, value, step)
    found = logged_metrics(tmp_path)
    assert set(found) == set(logged)
    for name, points in logged.items():
        assert list(zip(found[name].steps, found[name].values)) == [(s, f32(v)) for s, v in points]
        assert found[name].source == "tb"  # the event files' folder, read by TensorBoard's reader
    assert summarise(found["train/loss"]).final == f32(2.0 / 298) and summarise(found["val/acc"]).highest == 0.5


def test_lightnings_loggers_in_a_real_fit_give_the_logged_values(tmp_path):
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    said = []

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, i):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train_loss", loss)
            self.log("train_mse", loss, on_step=True, on_epoch=True)  # Lightning names them train_mse_step, _epoch
            return loss

        def validation_step(self, batch, i):
            value = 1.0 / (self.current_epoch + 1)  # the same every batch: the epoch's mean is it
            self.log("val_loss", value)

        def on_validation_epoch_end(self):
            if not self.trainer.sanity_checking:
                said.append(1.0 / (self.current_epoch + 1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), batch_size=4)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=[CSVLogger(tmp_path), TensorBoardLogger(tmp_path)],
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                        log_every_n_steps=1)
    trainer.fit(Tiny(), data, data)
    found = logged_metrics(tmp_path)
    assert [f32(v) for v in found["val_loss"].values] == [f32(v) for v in said] == [1.0, f32(0.5), f32(1 / 3)]
    steps = found["val_loss"].steps
    assert len(steps) == 3 and list(steps) == sorted(set(steps)) and len(found["train_loss"].values) == 12
    assert "epoch" not in found and "hp_metric" not in found  # a counter and a placeholder, not metrics
    assert len(found["train_mse_step"].values) == 12 and len(found["train_mse_epoch"].values) == 3


def test_the_hf_trainers_state_gives_its_log_history(tmp_path):
    from transformers import TrainerState

    history = [{"loss": 2.3, "grad_norm": 1.5, "learning_rate": 0.01, "epoch": 0.5, "step": 4},
               {"loss": 2.1, "learning_rate": 0.005, "epoch": 1.0, "step": 8},
               {"eval_loss": 2.2, "eval_runtime": 0.1, "epoch": 1.0, "step": 8}]
    (tmp_path / "out" / "checkpoint-4").mkdir(parents=True)
    TrainerState(log_history=history[:1], global_step=4).save_to_json(str(tmp_path / "out" / "checkpoint-4" /
                                                                         "trainer_state.json"))
    TrainerState(log_history=history, global_step=8).save_to_json(str(tmp_path / "out" / "trainer_state.json"))
    found = logged_metrics(tmp_path)
    assert found["loss"].steps == (4, 8) and found["loss"].values == (2.3, 2.1)  # the final file, not the checkpoint's
    assert found["eval_loss"].values == (2.2,) and "epoch" not in found
    assert choose(found).name == "eval_loss" and choose(found).mode == "min"


def test_the_toolkits_metrics_jsonl_and_a_plain_one_go_through_the_same_code(tmp_path):
    lines = [{"kind": "train", "step": 10, "epoch": 0, "time": 1.0, "loss": 4.0, "lr": 0.1},
             {"kind": "epoch", "step": 20, "epoch": 0, "time": 2.0, "eval_loss": 3.5, "eval_top1": 12.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "tr')
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "log.jsonl").write_text('{"step": 1, "val_accuracy": 0.5}\n{"step": 2, "val_accuracy": 0.75}\n')
    found = logged_metrics(tmp_path)
    assert found["epoch/eval_top1"].values == (12.5,) and found["train/loss"].steps == (10,)
    assert found["val_accuracy"].values == (0.5, 0.75) and "train/time" not in found
    assert choose(found).name == "epoch/eval_loss"


@pytest.mark.parametrize("names, metric, taken", [
    (["train_loss", "val_loss", "val_acc"], None, ("val_loss", "min")),
    (["train_loss", "lr"], None, ("train_loss", "min")),
    (["val_acc", "train_loss"], None, ("val_acc", "max")),  # an evaluation's before training's
    (["lr", "grad_norm"], None, None),  # nothing says loss or accuracy
    (["val_loss", "val_acc"], "val_acc", ("val_acc", "max")),
    (["val_loss"], "bleu", None),  # set, but no run logged it
    (["valid_loss_step", "valid_loss_epoch", "train_loss_epoch"], None, ("valid_loss_epoch", "min")),  # Lightning's
    (["valid_loss_step", "train_loss"], None, ("valid_loss_step", "min")),
])
def test_the_metric_taken_is_the_one_set_else_an_evaluations_loss_or_accuracy(names, metric, taken):
    got = choose(names, metric)
    assert (got.name, got.mode) == taken if taken else got is None
