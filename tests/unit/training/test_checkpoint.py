"""hpc/training/checkpoint.py: the save policy, the atomic save with its checksum, the checked load, and a
failed write agreed on every rank."""

import json

import pytest
import torch

from hpc.core.errors import UsageError, WriteError
from hpc.training.checkpoint import Checkpointer, load_checkpoint, state_digest


def test_checkpointer_policy_save_and_checked_load(tmp_path):
    said = []
    agreed = []
    ckpt = Checkpointer(tmp_path, every_steps=5, is_main=True, agree=lambda failed: agreed.append(failed) or failed,
                        log=said.append)
    assert [s for s in range(1, 16) if ckpt.due(s)] == [5, 10, 15]
    assert not Checkpointer(tmp_path, 0, True, lambda f: f, said.append).due(5)
    assert ckpt.load() is None and ckpt.saved_step is None
    (tmp_path / "checkpoints").mkdir()
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "scheduler": {}, "epoch": 1, "position": 0, "step": 5,
             "rng": {}}
    ckpt.save(state, "periodic", stop_at=20, complete=False)
    assert said and "checkpoint (periodic): epoch 1, batch 0, step 5" in said[0] and agreed == [False]
    assert torch.equal(load_checkpoint(ckpt.path)["model"]["w"], torch.ones(2)) and ckpt.saved_step == 5
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))  # the temp file was renamed
    info = json.loads((tmp_path / "checkpoints" / "last.json").read_text())
    assert (info["step"], info["stop_at"], info["reason"]) == (5, 20, "periodic")
    ckpt.save({**state, "step": 10, "model": {"w": torch.full((2,), 2.0)}}, "periodic", stop_at=20, complete=False)
    assert load_checkpoint(tmp_path / "checkpoints" / "previous.pt")["step"] == 5  # the one before, kept
    assert load_checkpoint(ckpt.path)["step"] == 10


def test_a_flipped_byte_in_a_tensor_is_found_and_the_previous_checkpoint_offered(tmp_path):
    ckpt = Checkpointer(tmp_path, 0, True, lambda failed: failed, lambda line: None)
    (tmp_path / "checkpoints").mkdir()
    state = {"model": {"w": torch.arange(64, dtype=torch.float32)}, "optimizer": {"state": {0: {"m": torch.ones(3)}}},
             "scheduler": {"lr": [0.1]}, "epoch": 0, "position": 3, "step": 3, "rng": {"python": [3, (1, 2), None]}}
    ckpt.save(state, "periodic", stop_at=9, complete=False)
    ckpt.save({**state, "step": 6}, "periodic", stop_at=9, complete=False)
    data = bytearray(ckpt.path.read_bytes())
    at = bytes(data).index(torch.arange(64, dtype=torch.float32).numpy().tobytes())  # the tensor's own bytes
    data[at + 100] ^= 0x04
    ckpt.path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"last.pt: damaged: its contents do not match the checksum.*"
                                         r"previous.pt \(step 3\) is intact: add --resume-from previous"):
        ckpt.load()
    ckpt.use_previous()  # what --resume-from previous does on rank 0
    assert ckpt.load()["step"] == 3 and (tmp_path / "checkpoints" / "damaged.pt").exists()
    ckpt.save({**state, "step": 4}, "periodic", stop_at=9, complete=False)  # previous.pt is the step-3 one, not the damaged one
    assert load_checkpoint(tmp_path / "checkpoints" / "previous.pt")["step"] == 3
    assert not [p.name for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]


def test_the_checksum_reads_the_same_through_a_save_and_a_load(tmp_path):
    state = {"model": {"w": torch.randn(3, 4).to(torch.bfloat16), "b": torch.tensor(True)}, "optimizer": {
        "state": {0: {"momentum_buffer": torch.zeros(2)}}, "param_groups": [{"lr": 0.1, "params": [0], "x": None}]},
        "scheduler": {}, "epoch": 0, "position": 0, "step": 0, "rng": {"python": [3, tuple(range(5)), None]}}
    before = state_digest(state)
    torch.save(state, tmp_path / "s.pt")
    assert state_digest(torch.load(tmp_path / "s.pt", weights_only=True)) == before
    assert state_digest({**state, "step": 1}) != before
    assert state_digest({**state, "model": {**state["model"], "w": state["model"]["w"] + 1}}) != before


def test_a_failed_write_is_one_error_on_every_rank(tmp_path):
    """rank 0's WriteError on itself; the others learn through `agree` and stop with a line naming the file."""
    (tmp_path / "checkpoints").mkdir()
    blocked = tmp_path / "checkpoints" / "last.pt"
    blocked.mkdir()  # a directory where the file would go: the rename fails
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 0, "position": 0, "step": 1, "rng": {}}
    with pytest.raises(WriteError, match="last.pt: could not be written"):
        Checkpointer(tmp_path, 0, True, lambda failed: failed, print).save(state, "periodic", 5, False)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]
    with pytest.raises(WriteError, match="rank 0 could not write the checkpoint"):
        Checkpointer(tmp_path, 0, False, lambda failed: True, print).save(state, "periodic", 5, False)
