"""Slurm's own accounting on the test cluster (tests/slurm/cluster.sh: slurmdbd over a real MariaDB, the
accounts and QOS the profiles use, AccountingStorageEnforce=associations,limits,qos): Slurm itself refuses
a job of an unknown account or QOS, or over its QOS's time limit, and hpc.submit says so in one line; a job
runs under the QOS it asked for; sacct reports each step's state and exit code. The expectations come from
the jobs as built here (a step that runs `true`, one that runs `false`), not from the toolkit."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, wait_until
from test_slurm_jobs import job_state, wait_gone

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
SMOKE = str(REPO / "profiles" / "smoke.yaml")


def sbatch(*args: str, wrap: str = "true") -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", wrap], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, said", [
    (("-A", "m9999_g"), "Invalid account"),
    (("-A", "m1234_g", "-q", "nonesuch"), "Invalid qos"),
    (("-A", "m1234_g", "-q", "debug", "-t", "60"), "QOSMaxWallDurationPerJobLimit"),  # debug: 30 min at most
    (("-A", "m1234_g", "-q", "shared", "-N", "2"), "QOSMaxNodePerJobLimit"),  # shared: part of one node
])
def test_slurm_itself_refuses_an_unknown_account_or_qos_or_a_job_over_its_qos(slurm_cluster, args, said):
    r = sbatch(*args)
    assert r.returncode != 0 and said in r.stderr, (r.stdout, r.stderr)


def test_the_same_jobs_within_their_limits_are_taken(slurm_cluster):
    for args in (("-A", "m1234", "-C", "cpu"), ("-A", "m1234_g", "-q", "debug", "-t", "30"),
                 ("-A", "m1234_g", "-q", "shared", "-N", "1")):
        r = sbatch(*args)
        assert r.returncode == 0, (args, r.stderr)
        wait_gone(r.stdout.strip(), 120)
        state = job_state(r.stdout.strip())
        assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), (args, state)  # it ran, `true`


def test_the_queue_as_the_launcher_reads_it_from_the_real_squeue_and_sacct(slurm_cluster):
    """hpc/launch/submission/queue.py against this cluster's squeue and slurmdbd (the unit tier has the literal outputs
    and the failures a controller can give): an array whose one task sleeps and one waits for it, a job
    Slurm never had, and the finished tasks' states in sacct."""
    from hpc.launch.submission import queue

    r = sbatch("-A", "m1234_g", "-q", "debug", "-t", "5", "--array=0-1%1", wrap="sleep 8")
    assert r.returncode == 0, r.stderr
    array = r.stdout.strip()
    states = wait_until(lambda: (s := queue.queued([array])) and "RUNNING" in s.values() and s, "the array running")
    assert states == {f"{array}_0": "RUNNING", f"{array}_1": "PENDING"}, states  # %1: one task at a time
    assert queue.queued(["999999"]) == {} and queue.QueueWatch().left("999999")  # never Slurm's: it has left
    wait_gone(array, 120)
    # slurmdbd records a job's end after the controller drops it from the queue (seen in CI: the last task
    # still RUNNING in sacct once squeue no longer listed it): wait for both ends, not only for both records
    accounted = wait_until(lambda: (a := queue.accounted([f"{array}_0", f"{array}_1"])) and len(a) == 2
                           and "RUNNING" not in a.values() and a, "sacct's records of the array's ends", 60, every_s=1)
    assert accounted == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED"}, accounted


def test_hpc_submit_says_slurms_refusal_in_one_line(slurm_cluster, tmp_path):
    r = subprocess.run([sys.executable, "-m", "hpc.submit", "--account", "m9999_g", "--config", SMOKE, "--runs-dir",
                        str(tmp_path), "--no-profile"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert_one_line_error(r, "m9999_g", "Invalid account")


def test_a_job_runs_under_its_qos_and_sacct_has_each_steps_state_and_exit_code(slurm_cluster):
    r = sbatch("-A", "m1234_g", "-q", "preempt", "-N", "1", wrap="srun -n 1 true; srun -n 1 false")
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    wait_gone(job, 120)
    assert job_state(job)["QOS"] == "preempt"

    def records() -> tuple[dict[str, tuple[str, ...]], str] | None:
        """Once slurmdbd has them all (the job's QOS reads Unknown there for a few seconds after it ends)."""
        out = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,State,ExitCode"], capture_output=True,
                             text=True).stdout
        rows = {line.split("|")[0]: tuple(line.split("|")[1:]) for line in out.splitlines() if line}
        qos = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "QOS"], capture_output=True,
                             text=True).stdout.strip()
        done = {f"{job}.0", f"{job}.1"} <= set(rows) and rows.get(job, ("",))[0] != "RUNNING"
        return (rows, qos) if done and qos not in ("", "Unknown") else None

    rows, qos = wait_until(records, f"sacct's records of job {job}", 60, every_s=1)
    assert rows[f"{job}.0"] == ("COMPLETED", "0:0"), rows  # `true`
    assert rows[f"{job}.1"] == ("FAILED", "1:0"), rows  # `false`: exit 1
    assert rows[job] == ("FAILED", "1:0"), rows  # the batch script ends with the last step's code
    assert qos == "preempt", qos
