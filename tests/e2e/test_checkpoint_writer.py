"""An epoch's checkpoint written in the background (hpc/training/checkpoint.py), with the process ending
while the write is in flight: by itself (the write completes first) or by SIGKILL in the middle of the
file (the earlier checkpoint stays whole). A real process, real files; the unit tests of the same path
are in tests/unit/training/test_checkpoint_background.py."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from hpc.training.checkpoint import load_checkpoint

WRITER = """
import os, signal, sys, threading, torch
from pathlib import Path
from hpc.training.checkpoint import Checkpointer
run, how = Path(sys.argv[1]), sys.argv[2]
(run / "checkpoints").mkdir(exist_ok=True)
ckpt = Checkpointer(run, 0, True, lambda failed: failed, print)
big = lambda v: {"model": {"w": torch.full((48 * 2**20,), float(v))}, "optimizer": {}, "scheduler": {},
                 "epoch": 0, "position": v, "step": v, "rng": {}}
ckpt.save(big(1), "periodic", 9, False)  # in place: last.pt of step 1
ckpt.save(big(2), "epoch end", 9, False, background=True)
print("in flight", flush=True)
if how == "kill":
    while not any(".tmp" in p.name for p in (run / "checkpoints").iterdir()):
        pass  # the temp file has begun
    os.kill(os.getpid(), signal.SIGKILL)
# how == "exit": the main thread ends here, the write still in flight
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_process_that_ends_while_the_write_is_in_flight_leaves_a_whole_checkpoint(tmp_path, how):
    """Leaving normally, the process finishes the write first (its thread is not a daemon): last.pt is the
    new step's. SIGKILL in the middle of the file: last.pt is still the earlier whole one."""
    proc = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), how], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert "in flight" in proc.stdout, proc.stderr
    if how == "exit":
        assert proc.returncode == 0 and "checkpoint (epoch end): epoch 0, batch 2, step 2" in proc.stdout
        assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["step"] == 2
    else:
        assert proc.returncode == -signal.SIGKILL
        saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")  # whole, its checksum checked
        assert saved["step"] == 1 and torch.equal(saved["model"]["w"][:3], torch.ones(3))
