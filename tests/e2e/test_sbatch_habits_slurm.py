"""sbatch's habits on the local Slurm cluster (issue 72): what Slurm itself made of `hpc.submit`'s options,
asked of scontrol and of the ranks, and a run inside an `salloc` allocation. The oracle is Slurm: its
job record, its hold, the environment its tasks got."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from test_slurm_jobs import job_state, wait_gone

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(PY).parent}:{os.environ['PATH']}")
# A probe, not a user's script: prints what its process was given (its stdout is its rank's log).
PROBE = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'SLURM_JOB_ID', "
         "'FOO', 'KEEPME', 'DROPME', 'OMP_NUM_THREADS', 'HOME')}))")


def submit(*args, env=None, timeout=600):
    return subprocess.run([PY, "-m", "hpc.submit", *args], capture_output=True, text=True, cwd=REPO,
                          env={**ENV, **(env or {})}, timeout=timeout)


def job_id_of(said: str) -> str:
    return re.findall(r"^job (\d+): run dir", said, flags=re.M)[-1]


def test_a_dependency_is_held_by_slurm_and_a_time_is_slurms_time(slurm_cluster, tmp_path):
    blocker = subprocess.run(["sbatch", "--parsable", "-H", "-A", "m1234_g", "-q", "regular", "-C", "gpu", "-n", "1",
                              "-t", "5", "-o", "/dev/null", "--wrap", "true"], capture_output=True, text=True)
    assert blocker.returncode == 0, blocker.stderr
    first = blocker.stdout.strip().split(";")[0]
    job = None
    try:
        r = submit("-N", "1", "--gpus", "1", "-A", "m1234_g", "-t", "1:30:00", "-d", f"afterok:{first}",
                   "--runs-dir", str(tmp_path), "--no-profile", "--", PY, "-c", "pass")
        assert r.returncode == 0, r.stdout + r.stderr
        job = job_id_of(r.stdout + r.stderr)
        state = job_state(job)
        assert state["JobState"] == "PENDING" and state["Reason"] == "Dependency", state
        assert state["Dependency"].startswith(f"afterok:{first}"), state["Dependency"]
        assert state["TimeLimit"] == "01:30:00", state["TimeLimit"]
    finally:
        subprocess.run(["scancel", first, *([job] if job else [])])
    if job:
        wait_gone(job, 60)


def probe_ranks(r: subprocess.CompletedProcess, ranks: int) -> list[dict]:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = Path(re.findall(r"^\s+run:\s+(\S+)", r.stdout, flags=re.M)[-1])
    return [json.loads((run / "logs" / f"rank{rank}.out").read_text()) for rank in range(ranks)]


def test_export_is_what_the_ranks_see(slurm_cluster, tmp_path):
    """sbatch's grammar reaches the ranks: without ALL only the variables named (and the login environment
    Slurm loads) go; with ALL this environment goes too; a bare name takes its value from here."""
    here = {"KEEPME": "kept", "DROPME": "dropped"}
    common = ["-N", "1", "--gpus", "2", "-A", "m1234_g", "--runs-dir", str(tmp_path), "--no-profile", "--wait"]
    listed = probe_ranks(submit(*common, "--export", "FOO=1,KEEPME", "--", PY, "-c", PROBE, env=here), 2)
    for rank, env in enumerate(listed):
        assert (env["RANK"], env["FOO"], env["KEEPME"], env["DROPME"]) == (str(rank), "1", "kept", None), env
        assert env["OMP_NUM_THREADS"] == "8"  # the profile's environment still, set by the job's script
    whole = probe_ranks(submit(*common, "--export", "ALL,FOO=2", "--", PY, "-c", PROBE, env=here), 2)
    for env in whole:
        assert (env["FOO"], env["KEEPME"], env["DROPME"]) == ("2", "kept", "dropped"), env


def test_a_run_inside_salloc_runs_in_that_allocation(slurm_cluster, tmp_path):
    """`salloc ...` then `python -m hpc.submit ...`: one srun step of that job, no job of its own."""
    r = subprocess.run(["salloc", "-N", "1", "--gpus-per-node=2", "-n", "2", "-A", "m1234_g", "-q", "regular", "-C",
                        "gpu", "-t", "10", PY, "-m", "hpc.submit", "--runs-dir", str(tmp_path), "--no-profile",
                        "--export", "ALL,FOO=in", "--", PY, "-c", PROBE], capture_output=True, text=True, cwd=REPO,
                       env=ENV, timeout=600)
    allocation = re.search(r"Granted job allocation (\d+)", r.stderr).group(1)
    assert f"inside allocation {allocation} (salloc)" in r.stdout + r.stderr, r.stderr[-2000:]
    seen = probe_ranks(r, 2)
    assert [(e["RANK"], e["WORLD_SIZE"], e["SLURM_JOB_ID"], e["FOO"]) for e in seen] == [
        ("0", "2", allocation, "in"), ("1", "2", allocation, "in")]
    run = Path(re.findall(r"^\s+run:\s+(\S+)", r.stdout, flags=re.M)[-1])
    assert run.name == f"{allocation}.0" and json.loads((run / "summary.json").read_text())["outcome"] == "done"
    steps = subprocess.run(["sacct", "-n", "-P", "-j", allocation, "-o", "JobID"], capture_output=True, text=True)
    assert f"{allocation}.0" in steps.stdout.split(), steps.stdout  # the run was a step of the allocation


SALLOC = ["salloc", "-N", "1", "--gpus-per-node=2", "-n", "2", "-A", "m1234_g", "-q", "regular", "-C", "gpu", "-t",
          "10"]


def wait_for_line(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until `text` is in the file `path` (the process's output), bounded; the process must still run."""
    import time

    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.1)


def test_a_sigterm_inside_salloc_stops_at_a_step_and_the_printed_line_resumes(slurm_cluster, tmp_path):
    """`kill` (or `timeout`) of hpc.submit in an allocation is Slurm's stop for the step: the script saves and
    exits 3, hpc.submit exits 3 and prints the srun line that resumes it, which ends as an unstopped run does."""
    script = [PY, str(REPO / "tests" / "scripts" / "torchrun_ddp.py"), "--epochs", "4", "--step-sleep", "0.3"]
    whole = subprocess.run([*SALLOC, PY, "-m", "hpc.submit", "--runs-dir", str(tmp_path / "a"), "--no-profile",
                            "--", *script, "--ckpt", str(tmp_path / "a.pt"), "--out", str(tmp_path / "a.out")],
                           capture_output=True, text=True, cwd=REPO, env=ENV, timeout=600)
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    digest = re.search(r"final weights sha256 (\w+)", whole.stdout).group(1)
    said = tmp_path / "said.txt"
    with open(said, "w") as out:
        proc = subprocess.Popen([*SALLOC, PY, "-m", "hpc.submit", "--runs-dir", str(tmp_path / "b"), "--no-profile",
                                 "--", *script, "--ckpt", str(tmp_path / "b.pt"), "--out", str(tmp_path / "b.out")],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=ENV)
        try:
            wait_for_line(said, "epoch 0 loss", proc)
            submitter = next(int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                            text=True).stdout.split())
            os.kill(submitter, 15)  # hpc.submit alone, as `kill` would (salloc is its parent)
            assert proc.wait(timeout=300) == 3, said.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    text = said.read_text()
    assert "rank 0: SIGTERM: saved" in text and (tmp_path / "b.pt").exists(), text[-3000:]
    run = Path(re.findall(r"^\s+run:\s+(\S+)", text, flags=re.M)[-1])
    # stopped, every rank: the first rank to stop is no "bad exit" to srun's --kill-on-bad-exit (hpc.rank exits
    # 0 to it), which would otherwise signal the others again as they leave after saving
    assert json.loads((run / "summary.json").read_text())["outcome"] == "stopped"
    resume = shlex.split(re.search(r"to resume it in an allocation: (.+)", text).group(1))
    again = subprocess.run([*SALLOC, *resume], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"final weights sha256 {digest}" in again.stdout, again.stdout[-2000:]
    assert json.loads((run / "summary.json").read_text())["outcome"] == "done"
