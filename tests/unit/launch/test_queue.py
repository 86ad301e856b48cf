"""The queue (hpc/launch/submission/queue.py) behind a stand-in subprocess: squeue's and sacct's outputs as Slurm 22.05
prints them (recorded on the local test cluster and on a slurmdbd site), parsed, and what each caller
gets when the queue lists a job, has forgotten it, or cannot say. Stood in here for the answers a real
cluster gives only in a fault (a controller that refuses or hangs, a database that refuses, no Slurm at
all), in the unit tier; the same calls against the real squeue and slurmdbd are in
tests/e2e/test_slurm_accounting.py, and a controller killed for real in tests/e2e/test_slurm_controller.py."""

import subprocess

import pytest

from hpc.core.errors import QueueError
from hpc.launch.submission import queue

# `squeue -h -r -O 'JobArrayID:|,State:|,RestartCnt:|' -j 320,321`: array tasks one by one, a pending array
# task requeued twice, a plain job
SQUEUE = "320_0|RUNNING|0|\n320_1|PENDING|2|\n321|COMPLETING|0|\n"
# `sacct -n -P -X -o JobID,State -j 320_0,320_1,325` on a site with slurmdbd
SACCT = "320_0|COMPLETED\n320_1|CANCELLED by 0\n325|TIMEOUT\n325.batch|\n"


def test_parsers_read_the_literal_outputs():
    assert queue.parse_squeue(SQUEUE) == {"320_0": queue.Queued("RUNNING"), "320_1": queue.Queued("PENDING", 2),
                                          "321": queue.Queued("COMPLETING")}
    assert queue.parse_squeue("") == {}
    assert queue.parse_sacct(SACCT) == {"320_0": "COMPLETED", "320_1": "CANCELLED", "325": "TIMEOUT"}
    assert queue.parse_sacct("garbage line\n|\n") == {}


@pytest.fixture
def fake_slurm(monkeypatch):
    """Slurm's commands replaced by recorded answers: calls[name] = (returncode, stdout, stderr)."""
    answers, seen = {}, []

    def run(cmd, capture_output=True, text=True, timeout=None):
        seen.append(cmd)
        if answers[cmd[0]] == "hang":
            raise subprocess.TimeoutExpired(cmd, timeout)
        rc, out, err = answers[cmd[0]]
        return subprocess.CompletedProcess(cmd, rc, out, err)

    monkeypatch.setattr(queue.subprocess, "run", run)
    monkeypatch.setattr(queue.shutil, "which", lambda name: f"/usr/bin/{name}" if name in answers else None)
    return answers, seen


def test_queued_lists_what_squeue_lists(fake_slurm):
    answers, seen = fake_slurm
    answers["squeue"] = (0, SQUEUE, "")
    assert queue.queued(["321", "320", "320"]) == {"320_0": "RUNNING", "320_1": "PENDING", "321": "COMPLETING"}
    assert seen[-1] == ["squeue", "-h", "-r", "-O", "JobArrayID:|,State:|,RestartCnt:|", "-j", "320,321"]
    watch = queue.QueueWatch()
    assert not watch.left("320_1") and watch.left("320_5")


def test_a_forgotten_job_has_left_and_a_failing_squeue_is_not_an_empty_queue(fake_slurm, capsys):
    answers, _ = fake_slurm
    answers["squeue"] = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    assert queue.queued(["99"]) == {} and queue.QueueWatch().left("99")
    answers["squeue"] = (1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")
    with pytest.raises(QueueError, match=r"squeue failed \(exit 1: slurm_load_jobs error: Unable to contact"):
        queue.queued(["99"])
    watch = queue.QueueWatch()
    assert not watch.left("99") and not watch.left("99")  # unknown is not "ended": keep waiting
    assert capsys.readouterr().err.count("Unable to contact slurm controller") == 1  # said once per outage
    answers["squeue"] = (0, "", "")
    assert watch.left("99") and "answers again" in capsys.readouterr().err
    answers["squeue"] = "hang"
    with pytest.raises(QueueError, match="squeue did not answer in 60 s"):
        queue.queued(["99"])


def test_without_slurm_nothing_is_queued_here(fake_slurm):
    """A laptop (local runs): no squeue at all is not a controller that is down."""
    assert queue.queued(["1"]) == {} and queue.queued([]) == {}
    assert queue.accounted(["1"]) == {}


def test_sacct_where_it_works_and_not_where_it_does_not(fake_slurm):
    answers, _ = fake_slurm
    answers["sacct"] = (0, SACCT, "")
    assert queue.accounted(["320_0", "325"])["325"] == "TIMEOUT"
    answers["sacct"] = (1, "", "sacct: error: Problem talking to the database: Connection refused\n")
    assert queue.accounted(["320_0"]) == {}
