"""Public scripts as their authors wrote them (tests/public/, kept byte for byte). pytorch/examples'
imagenet/main.py on CPUs makes a process group and a DistributedSampler but never wraps its model in
DistributedDataParallel, so each rank trains its own copy. The toolkit says so once during the run and
in the analysis, and judges no imbalance between ranks that never wait for each other."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from publicdata import write_mnist

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PUBLIC = REPO / "tests" / "public"
IMAGENET = PUBLIC / "imagenet_main.py"
IMAGENET_SHA256 = "f67ca2cd730bf91afe0504694abf07b88cbd03ac8c8a0426023620d29175c158"  # pytorch/examples 77f55b9
DDP_EXAMPLE = PUBLIC / "ddp_example.py"
DDP_EXAMPLE_SHA256 = "a261723f015d6bce1247450c5a8732a8702f3158a89a7a0032c6a120f7065c86"  # the same commit
MNIST = PUBLIC / "mnist_main.py"
MNIST_SHA256 = "30a3359d1911d2d859dd090ce20be7ed132a33f508dc389f40366010b3e9ecc8"  # the same commit
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(PY).parent}:{os.environ['PATH']}")
SAID = "ranks each train a separate copy: the script's process group ran no collective"


def test_the_public_scripts_are_as_their_authors_wrote_them():
    assert hashlib.sha256(IMAGENET.read_bytes()).hexdigest() == IMAGENET_SHA256
    assert hashlib.sha256(DDP_EXAMPLE.read_bytes()).hexdigest() == DDP_EXAMPLE_SHA256
    assert hashlib.sha256(MNIST.read_bytes()).hexdigest() == MNIST_SHA256


def test_a_command_that_steps_no_optimizer_is_said_not_a_silent_done(tmp_path):
    """pytorch/examples' DDP example on a machine without 2 GPUs says so itself and exits 0 untrained
    (its own line is the oracle): the run is done, and one line says no optimizer step was seen."""
    r = subprocess.run([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--",
                        PY, str(DDP_EXAMPLE)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "Unable to locate sufficient 2 gpus to run this example. Exiting." in said, said
    assert said.count("with no torch.optim optimizer step on any rank") == 1, said[-3000:]


def stop_after(proc: subprocess.Popen, steps: int, log: Path, timeout_s: float = 240) -> None:
    """SIGINT to hpc.submit (a Ctrl-C) once rank 0 printed `steps` of its own progress lines."""
    deadline = time.monotonic() + timeout_s
    while len(re.findall(r"^Epoch: \[0\]", log.read_text(errors="replace"), re.M)) < steps:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)


def test_imagenet_example_on_cpus_is_said_to_train_separate_copies(tmp_path):
    log = tmp_path / "submit.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--",
             PY, str(IMAGENET), "--dummy", "-a", "resnet18", "-b", "4", "-p", "1", "-j", "0",
             "--dist-url", "env://", "--dist-backend", "gloo"],
            cwd=tmp_path, env=ENV, stdout=out, stderr=subprocess.STDOUT, text=True)
        stop_after(proc, 10, log)
    said = log.read_text()
    assert said.count(SAID) == 1 and "2 ranks each train a separate copy" in said, said[-3000:]
    assert "using CPU, this will be slow" in said  # the script's own word: no DDP on this path
    run = Path(re.findall(r"^job \S+: run dir (\S+)", said, flags=re.M)[-1])
    summary = json.loads((run / "summary.json").read_text())
    ranks = sorted(summary["ranks"], key=lambda r: r["rank"])
    assert [r["process_group"] for r in ranks] == [True, True]
    # killed by the stop with no SIGTERM handler of its own, the script still has its steps counted: at least
    # the batches it printed after their optimizer step (-p 1), at most one more (issue 60: null, or 5)
    printed = len(re.findall(r"^Epoch: \[0\]", (run / "logs" / "rank0.out").read_text(errors="replace"), re.M))
    assert printed >= 10 and printed <= ranks[0]["steps"] <= printed + 1, (printed, ranks[0]["steps"])
    assert all(r["collectives_in_steps"]["with_collectives"] == 0 for r in ranks), ranks
    analysed = subprocess.run([PY, "-m", "analysis", str(run)], capture_output=True, text=True, env=ENV, timeout=120)
    assert analysed.returncode == 0, analysed.stderr
    verdicts = analysed.stdout.split("Verdict:")[1]
    assert "2 ranks each trained a separate copy: a process group, but no collective" in verdicts, verdicts
    assert "imbalance:" not in verdicts and "then imbalance" not in verdicts, verdicts
    left = subprocess.run(["pgrep", "-f", str(IMAGENET)], capture_output=True, text=True).stdout
    assert not left.split(), left


@pytest.mark.slurm
def test_mnist_examples_lr_and_seed_swept_as_written_on_slurm(slurm_cluster, tmp_path):
    """Issue 75 on a script nobody here wrote: pytorch/examples' mnist/main.py, its --lr and --seed swept
    2 x 2 in one study. Its own lines are the oracle: its first loss is printed before its first step, so it
    depends on the seed (the initial weights) and not on the learning rate; its test loss on both."""
    work = tmp_path / "work"
    work.mkdir()
    write_mnist(tmp_path / "data" / "MNIST" / "raw", 256, 64)  # ../data from where it runs, as it reads
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: mnist\n  batch_sizes: [64]\n  gpus: [1]\n  data_fractions: [1]\n"
                     "  axes:\n    lr: [1.0, 0.01]\n")
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--account", "m1_g", "--axis", "seed=1,2",
                        "--runs-dir", str(tmp_path / "runs"), "--export", "ALL,OMP_NUM_THREADS=1", "--wait", "--",
                        PY, str(MNIST), "--epochs", "1", "--no-accel", "--log-interval", "1", "--lr", "{lr}",
                        "--seed", "{seed}"], cwd=work, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (index,) = (tmp_path / "runs" / "mnist").glob("sweep-*/index.json")
    said = {}
    for p in json.loads(index.read_text())["points"]:
        out = (index.parent / p["run_dir"] / "logs" / "rank0.out").read_text()
        losses = re.findall(r"^Train Epoch: 1 .*Loss: ([\d.]+)$", out, flags=re.M)
        test = re.search(r"^Test set: Average loss: ([\d.]+)", out, flags=re.M)
        assert len(losses) == 4 and test, out  # 256 images, 64 a batch: 4 steps, each logged
        said[(p["values"]["lr"], p["values"]["seed"])] = (losses[0], test.group(1))
    assert said[(1.0, 1)][0] == said[(0.01, 1)][0] != said[(1.0, 2)][0] == said[(0.01, 2)][0], said
    assert said[(1.0, 1)][1] != said[(0.01, 1)][1], said
    status = subprocess.run([PY, "-m", "hpc.study", "status", str(index.parent), "--format", "json"],
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert sorted((p["lr"], p["seed"], p["state"]) for p in json.loads(status.stdout)) == [
        (0.01, 1, "done"), (0.01, 2, "done"), (1.0, 1, "done"), (1.0, 2, "done")]
