"""On the real (local, two-node) Slurm cluster: every srun task gets the right torch.distributed env."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]


def parse_exports(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = value
    return out


def test_srun_two_nodes_two_tasks_each(slurm_cluster):
    # Each task prints its own exports, prefixed by srun's task label.
    cmd = ["srun", "-N", "2", "--ntasks-per-node=2", "-l", "--kill-on-bad-exit=1", sys.executable, "-m",
           "hpc.distenv", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    records = {}
    for line in r.stdout.splitlines():
        label, _, body = line.partition(": ")
        records[int(label)] = json.loads(body)
    assert sorted(records) == [0, 1, 2, 3]
    ports = {rec["master_port"] for rec in records.values()}
    assert ports == {None}  # no task computes a port from the job id: rank 0's runner picks one (issue 62)
    for task, rec in records.items():
        assert rec["rank"] == task
        assert rec["world_size"] == 4
        assert rec["local_rank"] == task % 2
        assert rec["node_rank"] == task // 2
        assert rec["local_world_size"] == 2 and rec["num_nodes"] == 2
        assert rec["master_addr"] == "nid001"
        assert rec["launcher"] == "slurm"


def test_sbatch_batch_shell_and_step(slurm_cluster, tmp_path):
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -A m0000
#SBATCH -o {out}
cd {REPO}
echo "BATCH $({sys.executable} -m hpc.distenv | tr '\\n' ' ')"
eval "$({sys.executable} -m hpc.distenv)"
echo "EXPORTED $MASTER_PORT"
srun -l {sys.executable} -m hpc.distenv
""")
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip(),
               f"job {job_id} to leave the queue", 120, every_s=1)
    text = out.read_text()
    batch = next(line for line in text.splitlines() if line.startswith("BATCH"))
    # The batch shell exports only the rendezvous address: not RANK, which every srun task would inherit.
    assert "RANK" not in batch and "WORLD_SIZE" not in batch
    assert "MASTER_ADDR=nid001" in batch
    assert 1024 < int(batch.split("MASTER_PORT=", 1)[1].split()[0]) < 65536  # a free port of the first node
    port = int(next(line for line in text.splitlines() if line.startswith("EXPORTED")).split()[1])
    tasks = {}
    for line in text.splitlines():
        if ": export " in line:
            label, _, rest = line.partition(": ")
            tasks.setdefault(int(label), []).append(rest)
    assert sorted(tasks) == [0, 1, 2, 3]
    for label, lines in tasks.items():
        env = parse_exports("\n".join(lines))
        assert env["RANK"] == str(label) and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == str(label % 2)
        assert env["MASTER_PORT"] == str(port)  # each task has the batch shell's export
