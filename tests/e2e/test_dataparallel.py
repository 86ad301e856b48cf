"""A DataParallel script as the seeds write it (issue 52; tests/scripts/dataparallel.py: one process using
every GPU it sees, no process group). Started on every GPU it would train a separate copy on each, which
is said in one line during the run, and its ranks get no imbalance verdict (none waits for another); run
one process a node (`--set cluster.launcher=node`) it is one rank with the node's GPUs, here and on the
local Slurm cluster."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from analysis.explain.verdict import judged_run
from analysis.runs.fold import run_record
from hpc.core.summary import RunRecord
from recordedruns import summary_of

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "dataparallel.py"
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(PY).parent}:{os.environ['PATH']}")
COPIES = "ranks each train a separate copy: the script made no torch.distributed process group"


def submit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpc.submit", *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=600)


def run_dir_of(stdout: str) -> Path:
    return Path(re.findall(r"^job \S+: run dir (\S+)", stdout, flags=re.M)[-1])


# Rank 1 made several times slower in its own work (a sleep before every module's forward), so that ranks
# judged as one run would be named imbalanced: the oracle of "judged alone" is a real uneven run, not noise.
# 30 ms a module (8 a step: about 0.24 s), not 10: on loaded cores rank 0's own step grew to 0.098 s, and
# 10 ms a module left rank 1 only 1.09x slower (a CI run beside a mutation run); the sleep, not the load,
# must set the ratio.
SLOWED = """import os, runpy, sys, time
if os.environ.get("RANK") == "1":
    import torch
    torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: time.sleep(0.03))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_dataparallel_script_on_two_gpus_is_two_copies_said_once_and_judged_alone(tmp_path):
    slowed = tmp_path / "slowed.py"
    slowed.write_text(SLOWED)
    r = submit("--local", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--", PY, str(slowed), str(SCRIPT),
               "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert said.count(COPIES) == 1 and "2 ranks each train a separate copy" in said, said
    assert "--set cluster.launcher=node" in said
    # the run's end says it beside its verdict, not only `python -m analysis` (issue 73)
    assert "\nverdict, ranks: 2 ranks each trained a separate copy: no torch.distributed process group" in r.stdout
    run = run_dir_of(r.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert [(x["rank"], x["process_group"], x["steps"]) for x in summary["ranks"]] == [(0, False, 16), (1, False, 16)]
    analysed = subprocess.run([PY, "-m", "analysis", str(run)], capture_output=True, text=True, env=ENV, timeout=120)
    assert analysed.returncode == 0, analysed.stderr
    verdicts = analysed.stdout.split("Verdict:")[1].split("\n\n")[0]
    assert ": imbalance" not in verdicts and "then imbalance" not in verdicts, analysed.stdout  # no class named
    assert "2 ranks each trained a separate copy: no torch.distributed process group" in verdicts, verdicts
    own = [x["own_step_time_s"]["median"] for x in sorted(summary["ranks"], key=lambda x: x["rank"])]
    # The run really is uneven: judged as one, (max - mean) / max is 1/3 at 2x, over the 10% that names imbalance.
    # 2x, not more: on 2 busy cores rank 0's own step slows too (2.3x seen in CI where 3x was asked).
    assert own[1] > 2 * own[0], own


def test_ranks_that_never_communicate_get_no_imbalance_however_uneven(tmp_path):
    """The analysis's rule on a summary: rank 1's own work 31x rank 0's. In a process group it is named; the
    same ranks never grouped get no imbalance (no rank waits for another)."""
    ranks = [{"rank": r, "node": "nid001", "own_step_time_s": {"n": 12, "median": own},
              "own_step_series": {"first_step": 1, "ms": [own * 1e3] * 12},
              "step_time_s": {"median": 0.6}} for r, own in enumerate([0.01, 0.31])]
    for grouped, named in ((True, True), (False, False)):
        summary = summary_of(world_size=2, ranks=[{**x, "process_group": grouped} for x in ranks])
        verdict = judged_run(run_record(tmp_path, [], summary), [], summary).verdict
        assert (verdict.bound == "imbalance") is named, verdict
        assert ("rank 1 on nid001" in verdict.line) is named


@pytest.mark.slow
def test_one_process_a_node_owns_its_gpus_is_one_rank_and_stops_keeping_its_epochs(tmp_path):
    """Stopped by Ctrl-C once an epoch is saved: recorded cancelled (a person's stop), not done, the saved epochs whole (the
    seed's script saves each epoch and never resumes: what it finished is what it keeps), nothing left."""
    # what the one process is given: every GPU of the node (submitit's local job holds 2), as one rank
    probe = "import os; print('sees', os.environ.get('CUDA_VISIBLE_DEVICES'), 'world', os.environ.get('WORLD_SIZE'))"
    script = tmp_path / "dp_probe.py"
    script.write_text(f"{probe}\n{SCRIPT.read_text()}")
    proc = subprocess.Popen([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--set", "cluster.launcher=node",
                             "--runs-dir", str(tmp_path / "runs"), "--", PY, str(script), "--out", str(tmp_path),
                             "--epochs", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=ENV)
    deadline = time.monotonic() + 300
    while not (tmp_path / "CIFAR10_dp_epoch1.pt").exists():  # written after epoch 0's is whole
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "hpc: stopped (SIGINT)" in err and COPIES not in out + err, out + err
    run = run_dir_of(out)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 1 and [(x["rank"], x["local_rank"]) for x in summary["ranks"]] == [(0, 0)]
    assert re.search(r"^sees 0,1 world 1$", (run / "logs" / "rank0.out").read_text(), re.M), out
    assert summary["outcome"] == "cancelled", summary
    weights = torch.load(tmp_path / "CIFAR10_dp_epoch0.pt", weights_only=True)
    assert sorted(weights) == ["module.0.bias", "module.0.weight", "module.4.bias", "module.4.weight"]
    left = subprocess.run(["pgrep", "-f", f"{script} --out {tmp_path}"], capture_output=True, text=True).stdout
    assert not left.split(), left


@pytest.mark.slurm
@pytest.mark.slow
def test_one_process_a_node_on_slurm_holds_every_gpu_of_its_node(slurm_cluster, tmp_path):
    """2 nodes x 2 GPUs, launcher node: one task a node (Slurm's own count), each seeing the node's 2 GPUs;
    the two processes still train separate copies (DataParallel stays on its node), which is said."""
    # Slurm's count of the GPUs its task's node holds (this cluster's GPUs are names, no devices to see)
    probe = "import os; print('gpus', os.environ.get('SLURM_GPUS_ON_NODE'), 'tasks', os.environ['SLURM_NTASKS'])"
    script = tmp_path / "dp_probe.py"
    script.write_text(f"{probe}\n{SCRIPT.read_text()}")
    r = submit("--nodes", "2", "--gpus", "2", "--account", "m1234_g", "--set", "cluster.launcher=node", "--wait",
               "--runs-dir", str(tmp_path / "runs"), "--export", "ALL,OMP_NUM_THREADS=1", "--", PY, str(script),
               "--epochs", "1", "--out", str(tmp_path), cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_dir_of(r.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert [(x["rank"], x["node_rank"], x["local_rank"]) for x in summary["ranks"]] == [(0, 0, 0), (1, 1, 0)]
    for rank in (0, 1):
        out = (run / "logs" / f"rank{rank}.out").read_text()
        seen = re.search(r"gpus (\S+) tasks (\d+)", out)
        assert seen and (seen[1], seen[2]) == ("2", "2"), out
    assert COPIES in (run / "logs" / "rank0.err").read_text()
