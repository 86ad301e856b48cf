"""A job's Slurm side (hpc/launch/submission/slurm.py, hpc/launch/requeue.py): the sbatch text pinned by a
golden file, partial and whole nodes, Slurm's restart count, the one requeue rule."""

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from hpc.launch.submission.sbatchflags import JobOptions
from hpc.launch.submission.slurm import JobRequest, sbatch_text, slurm_parameters
from hpc.settings.config import load_cluster

REPO = Path(__file__).resolve().parents[3]


GOLDEN = REPO / "tests" / "golden" / "perlmutter_command_2x4.sbatch"


def command_sbatch_text() -> str:
    cluster = load_cluster("perlmutter")
    req = JobRequest(nodes=2, gpus=4, time_min=120, name="train", options=JobOptions(account="m1234_g"))
    folder = Path("/scratch/runs/train/%j")
    return sbatch_text(slurm_parameters(cluster, req, folder=folder), folder, python="python")


def test_a_command_jobs_sbatch_text_is_pinned_by_a_golden_file():
    text = command_sbatch_text()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "sbatch text changed; rerun with UPDATE_GOLDEN=1 if intended"
    assert "#SBATCH --signal=TERM@180" in text and "USR2" not in text  # scripts save on SIGTERM


def test_a_partial_node_job_sees_every_gpu_of_its_job():
    """A script's `cuda:LOCAL_RANK` needs the job's GPUs visible to every task: not one per task. One
    policy for every task (issue 50): the training takes `cuda:LOCAL_RANK` too."""
    cluster = load_cluster("perlmutter")
    req = JobRequest(nodes=1, gpus=2, time_min=30, name="t", options=JobOptions(account="m1_g"))
    params = slurm_parameters(cluster, req)
    assert params["qos"] == "shared" and params["gpus_per_node"] == 2 and "gpus_per_task" not in params


@pytest.mark.parametrize("launcher, tasks, cpus", [("srun", 4, 32), ("torchrun", 1, 128), ("node", 1, 128)])
def test_a_node_launcher_job_is_one_task_a_node_with_every_gpu(launcher, tasks, cpus):
    """`launcher: node`: one process a node owning its 4 GPUs (a DataParallel script), its CPUs with it."""
    cluster = dataclasses.replace(load_cluster("perlmutter"), launcher=launcher)
    params = slurm_parameters(cluster, JobRequest(nodes=2, gpus=4, time_min=30, name="t", options=JobOptions(account="m1_g")))
    assert (params["ntasks_per_node"], params["gpus_per_node"], params["cpus_per_task"]) == (tasks, 4, cpus)


@pytest.mark.parametrize("line, restarts", [
    # scontrol show job -o, Slurm 22.05, as the test cluster prints it for a job requeued once
    ("JobId=55 JobName=lit UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 Account=m1234_g "
     "QOS=normal JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 "
     "ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:10:00", 1),
    ("JobId=56 JobName=Restarts=9 JobState=RUNNING Restarts=0 BatchFlag=1", 0),  # a job named so is not its count
    ("slurm_load_jobs error: Invalid job id specified", None),
    ("", None),
])
def test_slurms_restart_count_is_read_from_scontrols_line(line, restarts):
    from hpc.launch.requeue import restarts_in

    assert restarts_in(line) == restarts


@pytest.mark.parametrize("line, start, already", [
    ("JobId=7 JobState=COMPLETING Restarts=2 BatchFlag=1", "1", True),  # requeued once since this start
    ("JobId=7 JobState=COMPLETING Restarts=1 BatchFlag=1", "1", False),  # this start's own count
    ("JobId=7 JobState=COMPLETING Restarts=0 BatchFlag=1", "1", False),
    ("JobId=7 JobState=COMPLETING Restarts=1 BatchFlag=1", None, True),  # a first start has no variable: 0
    ("JobId=7 JobState=COMPLETING Restarts=0 BatchFlag=1", None, False),
    ("slurm_load_jobs error: Invalid job id specified", "0", False),  # no answer: the requeue is tried
])
def test_a_job_requeued_since_this_start_is_not_requeued_again(line, start, already):
    from hpc.launch.requeue import ALREADY, requeued_since

    env = {} if start is None else {"SLURM_RESTART_COUNT": start}
    assert requeued_since(line, env) == (ALREADY if already else None)


@pytest.mark.parametrize("rank, code, refused, marked", [
    (0, 3, None, True),  # rank 0 asks Slurm; nothing forbids it
    (0, 3, "was cancelled (scancel)", False),  # rank 0 asks Slurm; a person's cancel forbids it
    (1, 3, None, False),  # a stop's requeue is rank 0's to ask for
    (1, 5, "never asked", True),  # a rank that lost its peer marks without asking (rank 0 may be the peer)
    (1, 0, None, False),
])
def test_the_ranks_ask_their_batch_shell_for_a_requeue(tmp_path, monkeypatch, rank, code, refused, marked):
    from hpc.core.errors import EXIT_PEER_LOST
    from hpc.launch import requeue

    assert EXIT_PEER_LOST == 5  # the README's exit codes: 5 a lost peer
    asked = []
    monkeypatch.setattr(requeue, "not_to_requeue", lambda job, env: asked.append(job) or refused)
    assert requeue.ask_for_requeue("88", rank, code, tmp_path, "stopped") is marked
    assert asked == (["88"] if rank == 0 else [])
    mark = tmp_path / requeue.REQUEST
    assert (mark.read_text() if mark.exists() else None) == ("88" if marked else None)


def test_a_mark_that_cannot_be_written_is_no_requeue(tmp_path, monkeypatch, caplog):
    from hpc.launch import requeue

    monkeypatch.setattr(requeue, "not_to_requeue", lambda job, env: None)
    gone = tmp_path / "gone"  # the run directory removed under the rank: the write fails
    assert requeue.ask_for_requeue("88", 0, 3, gone, "stopped") is False
    assert "could not ask its batch shell for a requeue" in caplog.text and str(gone) in caplog.text


@pytest.mark.parametrize("code, signum, env, requeued", [
    (3, None, {}, True), (5, None, {}, True), (0, None, {}, False), (1, None, {}, False),
    (3, signal.SIGINT, {}, False),  # Ctrl-C: a person's stop
    (3, signal.SIGTERM, {"SUBMITIT_EXECUTOR": "local"}, False),  # SIGTERM here is a person's too
    (3, signal.SIGTERM, {"SUBMITIT_EXECUTOR": "slurm"}, True),  # on Slurm, a preemption
    (3, None, {"SLURM_RESTART_COUNT": "3"}, False),  # no requeue left
])
def test_the_one_requeue_rule(code, signum, env, requeued):
    """may_requeue, the rule both the job (hpc/launch/submission/job.py) and the batch shell apply; the training's
    codes (3 saved and stopped, 5 a lost peer), a budget of 3."""
    from hpc.launch.requeue import may_requeue

    assert may_requeue(code, (3, 5), signum, env, 3) is requeued
    assert may_requeue(5, (3,), None, {}, 3) is False  # a user's command asks with 3 alone


@pytest.mark.parametrize("record, code", [
    ({"kind": "stopped", "exit_code": 3}, 3),  # saved and stopped
    ({"kind": "stopped", "exit_code": 0}, 3),  # exit 0 after a stop, not known to have finished
    ({"kind": "stopped", "exit_code": 5}, 5),  # the training's lost peer
    ({"kind": "killed", "exit_code": None, "signal": "SIGKILL", "stop": "SIGTERM"}, 3),  # took the stop, hung
    ({"kind": "killed", "exit_code": None, "signal": "SIGKILL", "stop": "SIGINT"}, None),  # a person's Ctrl-C
    ({"kind": "killed", "exit_code": None, "signal": "SIGKILL", "stop": "rank 1 failed"}, None),  # a failure's
    ({"kind": "interrupted", "exit_code": None, "signal": "SIGTERM", "stop": "SIGTERM"}, None),  # died of it
    ({"kind": "failed", "exit_code": 1}, None), ({"kind": "ok", "exit_code": 0}, None),
    ({"kind": "oom", "exit_code": 1}, None), ({"kind": "peer", "exit_code": 1, "stop": "rank 0 failed"}, None),
])
def test_the_code_the_requeue_rule_reads_from_a_ranks_end(record, code):
    """Issue 60: a command that took Slurm's SIGTERM and hung (Lightning's DDP ranks, deadlocked in its
    SIGTERM handler) is killed after the grace time and resumes as a stopped one does: 3; a kill that
    followed a person's stop or another rank's failure, and a command that died of the signal, are not."""
    from hpc.launch.batch import run_code
    from hpc.launch.requeue import requeue_code

    assert requeue_code(record) == code
    ranks = [{"rank": r, **record} for r in (0, 1)]  # the batch shell's code for a run of such ranks
    if code is not None:
        assert run_code({"ranks": ranks, "outcome": "preempted"}, 0, False) == code


@pytest.fixture
def slurm_clients(tmp_path, monkeypatch):
    """Stand-in sacct and scontrol first on PATH: each logs its arguments and prints what the test set
    (SACCT_SAYS, SCONTROL_SAYS: literal lines as Slurm 22.05 prints them); returns the log's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, says in (("sacct", "SACCT_SAYS"), ("scontrol", "SCONTROL_SAYS")):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "$CALLS"\nprintf "%s\\n" "${says}"\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    return tmp_path / "calls"


@pytest.mark.parametrize("sacct, scontrol, start, why_not", [
    ("88|CANCELLED by 1000", "JobId=88 JobState=COMPLETING Restarts=0", "0", "cancelled"),  # a person's scancel
    ("88|RUNNING", "JobId=88 JobState=COMPLETING Restarts=1 BatchFlag=1", "0", "already"),  # Lightning requeued it
    ("88|RUNNING", "JobId=88 JobState=RUNNING Restarts=1 BatchFlag=1", "1", None),  # this start's own count
    ("88|PREEMPTED", "JobId=88 JobState=PREEMPTED Restarts=0", "", None),  # a preemption: requeue it
    ("87|CANCELLED by 0", "JobId=88 JobState=RUNNING Restarts=0", "0", None),  # another job's cancel
    ("", "slurm_load_jobs error: Invalid job id specified", "0", None),  # no answer: the requeue is tried
])
def test_slurms_own_state_is_asked_before_a_requeue(slurm_clients, monkeypatch, sacct, scontrol, start, why_not):
    """not_to_requeue asks sacct, then (unless cancelled) scontrol, about this job and no other."""
    from hpc.launch.requeue import ALREADY, CANCELLED, not_to_requeue

    monkeypatch.setenv("SACCT_SAYS", sacct)
    monkeypatch.setenv("SCONTROL_SAYS", scontrol)
    env = {"SLURM_RESTART_COUNT": start} if start else {}
    assert not_to_requeue("88", env) == {"cancelled": CANCELLED, "already": ALREADY, None: None}[why_not]
    calls = slurm_clients.read_text().splitlines()
    assert calls[0].startswith("sacct ") and calls[0].split()[-2:] == ["-j", "88"]
    assert calls[1:] == ([] if why_not == "cancelled" else ["scontrol show job -o 88"])


def test_no_scontrol_to_ask_is_no_reason_not_to_requeue(tmp_path, monkeypatch):
    from hpc.launch.requeue import not_to_requeue

    monkeypatch.setenv("PATH", str(tmp_path))  # neither sacct nor scontrol here
    assert not_to_requeue("88", {"SLURM_RESTART_COUNT": "0"}) is None


def test_rank_0_asks_with_its_own_environment_and_says_what_it_did(tmp_path, monkeypatch, caplog):
    import logging

    from hpc.launch import requeue

    seen = []
    monkeypatch.setattr(requeue, "not_to_requeue", lambda job, env: seen.append(env) or None)
    with caplog.at_level(logging.INFO, logger=requeue.__name__):
        assert requeue.ask_for_requeue("88", 0, 3, tmp_path, "stopped by Slurm") is True
        assert requeue.ask_for_requeue("88", 1, 5, tmp_path, "lost its peer") is True
    assert seen == [os.environ]
    assert [r.getMessage() for r in caplog.records] == [
        "hpc: stopped by Slurm: job 88 is requeued by its batch shell once its step has ended"]
    caplog.clear()
    monkeypatch.setattr(requeue, "not_to_requeue", lambda job, env: requeue.CANCELLED)
    with caplog.at_level(logging.INFO, logger=requeue.__name__):
        assert requeue.ask_for_requeue("88", 0, 3, tmp_path, "stopped") is False
    assert [r.getMessage() for r in caplog.records] == [f"hpc: job 88 {requeue.CANCELLED}"]


def test_a_new_attempt_clears_the_last_ones_mark_and_survives_what_it_cannot_clear(tmp_path):
    from hpc.launch.requeue import REQUEST, clear_request

    (tmp_path / REQUEST).write_text("88")
    clear_request(tmp_path)
    assert not (tmp_path / REQUEST).exists()
    clear_request(tmp_path)  # none there: nothing to say
    (tmp_path / REQUEST).mkdir()  # something it cannot unlink (EISDIR): the attempt goes on
    clear_request(tmp_path)
    assert (tmp_path / REQUEST).is_dir()


@pytest.mark.parametrize("restarts, budget, requeued", [("", 1, True), ("0", 1, True), ("1", 1, False)])
def test_an_unset_restart_count_is_a_first_start(restarts, budget, requeued):
    from hpc.launch.requeue import may_requeue

    env = {"SLURM_RESTART_COUNT": restarts} if restarts else {}
    assert may_requeue(3, (3,), None, env, budget) is requeued
