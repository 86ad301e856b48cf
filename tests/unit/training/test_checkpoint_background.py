"""An epoch's checkpoint written in the background (hpc/training/checkpoint.py, issue 54): off the steps'
critical path, yet as whole as one written in place. Real files, real threads; the writer is held back
only where a test must see the moment between the copy and the write."""

import os
import threading

import pytest
import torch

from hpc.core.errors import WriteError
from hpc.training import checkpoint
from hpc.training.checkpoint import Checkpointer, load_checkpoint


def state(step, w):
    return {"model": {"w": w}, "optimizer": {}, "scheduler": {}, "epoch": 0, "position": step, "step": step, "rng": {}}


def test_a_background_save_returns_at_once_and_the_ranks_agree_on_it_at_the_next_save(tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    release, real = threading.Event(), checkpoint.save_checkpoint

    def held(*args, **kwargs):  # the write waits until the test has looked
        release.wait(10)
        real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_checkpoint", held)
    said, agreed = [], []
    ckpt = Checkpointer(tmp_path, 0, True, lambda failed: agreed.append(failed) or failed, said.append)
    w = torch.ones(4)
    ckpt.save(state(5, w), "epoch end", stop_at=20, complete=False, background=True)
    w += 1  # training goes on and changes the weights: the checkpoint holds the copy taken at the save
    assert ckpt.latest_step == 5 and ckpt.saved_step is None and agreed == [] and said == []
    assert not ckpt.path.exists()  # not written yet: the save did not wait for it
    release.set()
    ckpt.settle()
    assert ckpt.saved_step == 5 and ckpt.latest_step == 5 and agreed == [False]
    assert said == [f"checkpoint (epoch end): epoch 0, batch 5, step 5 -> {ckpt.path}"]
    assert torch.equal(load_checkpoint(ckpt.path)["model"]["w"], torch.ones(4))  # checksum checked by the load
    ckpt.settle()  # nothing in flight: no second agreement
    assert agreed == [False]


def test_a_failed_background_write_stops_every_rank_at_the_next_save(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt = Checkpointer(tmp_path, 0, True, lambda failed: failed, lambda line: None)
    ckpt.save(state(5, torch.ones(2)), "periodic", 20, False)  # in place: last.pt of step 5
    (tmp_path / "checkpoints" / "previous.pt").mkdir()  # the next save cannot keep it: the write fails
    blocked = tmp_path / "checkpoints" / "last.pt"
    os.replace(blocked, tmp_path / "keep.pt")
    blocked.mkdir()
    ckpt.save(state(10, torch.ones(2)), "epoch end", 20, False, background=True)
    with pytest.raises(WriteError, match="last.pt: could not be written"):
        ckpt.save(state(15, torch.ones(2)), "epoch end", 20, False, background=True)
    assert ckpt.saved_step == 5
    other = Checkpointer(tmp_path, 0, False, lambda failed: True, lambda line: None)  # a rank that is not 0
    other.save(state(10, torch.ones(2)), "epoch end", 20, False, background=True)
    with pytest.raises(WriteError, match="rank 0 could not write the checkpoint"):
        other.settle()


def test_a_fault_injected_run_writes_in_the_background_as_any_run(tmp_path):
    """Issue 60: faults armed, the writer users run is the one the fault tests meet (it wrote in place)."""
    from hpc.core.faults import parse_faults
    from hpc.training import inject

    (tmp_path / "checkpoints").mkdir()
    inject.arm(parse_faults("signal:TERM@step:99"), 0, lambda: 0)
    try:
        ckpt = Checkpointer(tmp_path, 0, True, lambda failed: failed, lambda line: None)
        ckpt.save(state(3, torch.ones(2)), "epoch end", 20, False, background=True)
        assert ckpt.writer is not None and ckpt.in_flight_step == 3
        ckpt.settle()
    finally:
        inject.arm((), 0, lambda: 0)
    assert ckpt.saved_step == 3 and load_checkpoint(ckpt.path)["step"] == 3


def test_a_lost_peers_line_names_the_checkpoint_rank_0_has_finished_writing(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt = Checkpointer(tmp_path, 0, True, lambda failed: failed, lambda line: None)
    ckpt.save(state(4, torch.ones(2)), "periodic", 20, False)
    ckpt.save(state(8, torch.ones(2)), "epoch end", 20, False, background=True)
    assert ckpt.written_step() == 8 and load_checkpoint(ckpt.path)["step"] == 8  # waited for, no peer asked
    other = Checkpointer(tmp_path, 0, False, lambda failed: failed, lambda line: None)
    other.save(state(4, torch.ones(2)), "periodic", 20, False)
    other.save(state(8, torch.ones(2)), "epoch end", 20, False, background=True)
    assert other.written_step() == 8  # not rank 0, not agreed yet: what is on disk (rank 0 finished it)
    (tmp_path / "checkpoints" / "last.json").write_text('{"step": 4, "stop_at": 20}')  # rank 0 died mid-write
    assert other.written_step() == 4
