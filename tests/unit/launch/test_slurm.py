"""A job's Slurm side (hpc/launch/submission/slurm.py, hpc/launch/requeue.py): the sbatch text pinned by a
golden file, partial and whole nodes, Slurm's restart count, the one requeue rule."""

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest

from hpc.core.ending import RankExit
from hpc.launch.submission.sbatchflags import Exports, JobOptions
from hpc.launch.submission.slurm import JobRequest, local_parameters, sbatch_text, slurm_parameters
from hpc.placement.affinity import threads_per_rank
from hpc.settings.config import load_cluster
from recordedruns import entries, recorded_run

REPO = Path(__file__).resolve().parents[3]


GOLDEN = REPO / "tests" / "golden" / "perlmutter_command_2x4.sbatch"


def command_sbatch_text() -> str:
    cluster = load_cluster("perlmutter")
    req = JobRequest(nodes=2, gpus=4, time_min=120, name="train", options=JobOptions(account="m1234_g"))
    folder = Path("/scratch/runs/train/%j")
    return sbatch_text(slurm_parameters(cluster, req), folder, python="python")


def test_a_command_jobs_sbatch_text_is_pinned_by_a_golden_file():
    text = command_sbatch_text()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "sbatch text changed; rerun with UPDATE_GOLDEN=1 if intended"
    # the warning to the batch shell alone, which python becomes: a bare SIGTERM is then Slurm ending the job
    assert "#SBATCH --signal=B:USR2@180" in text and "\nexec python -u -m submitit.core._submit " in text
    assert "srun" not in text  # the batch shell's own srun step (hpc/launch/batch.py), not submitit's


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


@pytest.mark.parametrize("code, warned, env, requeued", [
    (3, True, {}, True),  # saved and stopped after the job's warning (the time limit's, a site's preemption signal)
    (3, False, {}, False),  # saved and stopped with no warning to the batch shell: a person's scancel --signal
    (5, False, {}, True),  # the training's lost peer: a fault, not a stop
    (0, True, {}, False), (1, True, {}, False), (4, True, {}, False),
    (3, True, {"SLURM_RESTART_COUNT": "2"}, True), (3, True, {"SLURM_RESTART_COUNT": "3"}, False),  # budget of 3
    (5, False, {"SLURM_RESTART_COUNT": "3"}, False),
])
def test_the_one_requeue_rule(code, warned, env, requeued):
    """may_requeue, the rule the one executor (requeue_after_step) applies; the training's codes (3 saved and
    stopped, 5 a lost peer), a budget of 3."""
    from hpc.launch.requeue import may_requeue

    assert may_requeue(code, (3, 5), warned, env, 3) is requeued
    assert may_requeue(5, (3,), True, {}, 3) is False  # a user's command asks with 3 alone


@pytest.mark.parametrize("record, code", [
    ({"kind": "stopped", "exit_code": 3}, 3),  # saved and stopped
    ({"kind": "stopped", "exit_code": 0}, 3),  # exit 0 after a stop, unfinished: Lightning's, which resumes
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
    followed a person's stop or another rank's failure, and a command that died of the signal, are not.
    Its job ends 3, not 0, whatever the tasks exited: the run did not finish (issue 87)."""
    from hpc.core.ending import Outcome
    from hpc.core.summary import CodeFor, requeue_code, run_exit_code

    ranks = entries({"rank": r, **record} for r in (0, 1))  # the batch shell's code for a run of such ranks
    assert requeue_code(ranks[0]) == code
    if code is not None:
        assert run_exit_code(Outcome.PREEMPTED, CodeFor.JOB, ranks) == code
    if record == {"kind": "stopped", "exit_code": 0}:
        assert run_exit_code(Outcome.STOPPED, CodeFor.JOB, ranks) == 3


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


@pytest.mark.parametrize("scontrol, sacct, start, why_not", [
    # scancel while the step ended: being torn down, whatever the accounting says (or without it)
    ("JobId=88 JobState=COMPLETING Restarts=0", "88|CANCELLED by 1000", "0", "ending"),
    ("JobId=88 JobState=COMPLETING Restarts=0", "", "0", "ending"),
    ("JobId=88 JobState=RUNNING Restarts=0", "88|CANCELLED by 1000", "0", "cancelled"),  # the accounting's word
    ("JobId=88 JobState=RUNNING Restarts=1 BatchFlag=1", "88|RUNNING", "0", "already"),  # Lightning requeued it
    ("JobId=88 JobState=RUNNING Restarts=1 BatchFlag=1", "88|RUNNING", "1", None),  # this start's own count
    ("JobId=88 JobState=RUNNING Restarts=0", "87|CANCELLED by 0", "0", None),  # another job's cancel
    ("slurm_load_jobs error: Invalid job id specified", "", "0", None),  # no answer: the requeue is tried
])
def test_slurms_own_state_is_asked_before_a_requeue(slurm_clients, monkeypatch, scontrol, sacct, start, why_not):
    """not_to_requeue asks scontrol, then (unless the job is being ended) sacct, about this job and no other."""
    from hpc.launch.requeue import ALREADY, CANCELLED, ENDING, not_to_requeue

    monkeypatch.setenv("SACCT_SAYS", sacct)
    monkeypatch.setenv("SCONTROL_SAYS", scontrol)
    env = {"SLURM_RESTART_COUNT": start} if start else {}
    expected = {"ending": ENDING.format(state="COMPLETING"), "cancelled": CANCELLED, "already": ALREADY, None: None}
    assert not_to_requeue("88", env) == expected[why_not]
    calls = slurm_clients.read_text().splitlines()
    assert calls[0] == "scontrol show job -o 88"
    assert [c.split()[0] for c in calls[1:]] == ([] if why_not == "ending" else ["sacct"])
    assert why_not == "ending" or calls[1].split()[-2:] == ["-j", "88"]


def test_no_scontrol_to_ask_is_no_reason_not_to_requeue(tmp_path, monkeypatch):
    from hpc.launch.requeue import not_to_requeue

    monkeypatch.setenv("PATH", str(tmp_path))  # neither sacct nor scontrol here
    assert not_to_requeue("88", {"SLURM_RESTART_COUNT": "0"}) is None


@pytest.mark.parametrize("restarts, budget, requeued", [("", 1, True), ("0", 1, True), ("1", 1, False)])
def test_an_unset_restart_count_is_a_first_start(restarts, budget, requeued):
    from hpc.launch.requeue import may_requeue

    env = {"SLURM_RESTART_COUNT": restarts} if restarts else {}
    assert may_requeue(3, (3,), True, env, budget) is requeued


@pytest.mark.parametrize("scontrol, start, state", [
    ("JobId=88 JobState=COMPLETING Reason=None Restarts=0", "0", "CANCELLED"),  # a person's scancel
    ("JobId=88 JobState=COMPLETING Reason=TimeLimit Restarts=0", "0", "TIMEOUT"),  # the time limit itself
    ("JobId=88 JobState=COMPLETING Reason=None Restarts=1", "0", None),  # requeued by its task (Lightning)
    ("JobId=88 JobState=COMPLETING Reason=None Restarts=1", "1", "CANCELLED"),
    ("slurm_load_jobs error: Unable to contact slurm controller", "0", "CANCELLED"),
])
def test_a_sigterm_to_the_batch_shell_is_named_as_slurm_names_it(slurm_clients, monkeypatch, scontrol, start, state):
    """What a batch shell's SIGTERM was, as `scontrol show job` says it during the teardown (seen on the test
    cluster: Reason=TimeLimit at the time limit, Reason=None after a scancel, Restarts above the start's after
    a requeue); the accounting is never asked (it may not answer within KillWait)."""
    from hpc.launch.requeue import ending_state

    monkeypatch.setenv("SCONTROL_SAYS", scontrol)
    assert ending_state("88", {"SLURM_RESTART_COUNT": start}) == state
    assert [c.split()[0] for c in slurm_clients.read_text().splitlines()] == ["scontrol"]


def ended_run(tmp_path, *ends):
    """A run directory after its step: each rank's exit record, (kind, exit code, stop) by rank."""
    return recorded_run(tmp_path / "run", [
        RankExit(rank=rank, kind=kind, attempt="88.0.0", world_size=len(ends), started_ns=1, ended_ns=2 + rank,
                 exit_code=code, stop=stop, message=(message or [None])[0])
        for rank, (kind, code, stop, *message) in enumerate(ends)], task=False)


RESUME = "resume with: python -m hpc.submit --resume"


@pytest.mark.parametrize("ends, end, env, code, calls, said", [
    # saved and stopped after the job's warning: Slurm asked, then requeued; the job still ends 3 (not done)
    ([("stopped", 3, "SIGTERM")] * 2, {"warned": True}, {}, 3, ["scontrol show", "sacct", "scontrol requeue 88"],
     "hpc.batch: the task asked to be requeued (exit 3): requeueing job 88\nhpc.batch: job 88 requeued from the "
     "batch shell"),
    # the same stop with no warning to the batch shell: a person's scancel --signal; nothing asked
    ([("stopped", 3, "SIGTERM")] * 2, {}, {}, 3, [], "job 88 was stopped by a person (scancel --signal: no warning reached its batch shell): not requeued; "
     f"{RESUME}"),
    # a person's scancel: the batch shell got SIGTERM; scontrol names it, the run reads cancelled, never requeued
    ([("stopped", 3, "SIGTERM")] * 2, {"ended": True}, {}, 3, ["scontrol show"],
     f"job 88 was ended by Slurm (scancel, its time limit or a preemption): not requeued; {RESUME}"),
    # rank 0 frozen and killed without a record of a stop; rank 1 lost its peer: 5 is a requeue code, no stop
    ([("killed", None, None), ("stopped", 5, "rank 0 lost")], {}, {}, 5,
     ["scontrol show", "sacct", "scontrol requeue 88"], "requeueing job 88"),
    # took the warning's stop and hung (Lightning's DDP ranks): killed after the grace time, requeued, said so
    ([("killed", None, "SIGTERM", "killed 10 s after SIGTERM")] * 2, {"warned": True}, {}, 3,
     ["scontrol show", "sacct", "scontrol requeue 88"],
     "the task took Slurm's stop and did not end in time (killed 10 s after SIGTERM)"),
    # a script that exited 0 after the warning, unfinished (Lightning's): requeued, and said that it resumes only
    # from a checkpoint of its own
    ([("stopped", 0, "SIGTERM")] * 2, {"warned": True}, {}, 3, ["scontrol show", "sacct", "scontrol requeue 88"],
     "it resumes only from a checkpoint of its own (Lightning's last.ckpt), else it starts again from its first"),
    # the budget spent (restart 3 of 3)
    ([("stopped", 3, "SIGTERM")] * 2, {"warned": True}, {"SLURM_RESTART_COUNT": "3"}, 3, [],
     "job 88 stopped after 3 requeues"),
    # a failure is no stop: its own code, nothing asked
    ([("failed", 7, None), ("killed", None, "rank 0 failed")], {"warned": True}, {}, 7, [], "rank 0 failed first"),
    ([("ok", 0, None)] * 2, {"ended": True}, {}, 0, ["scontrol show"], ": done"),  # finished as Slurm ended it
    ([("ok", 0, None)] * 2, {}, {}, 0, [], ": done"),
])
def test_the_one_requeue_executor_decides_from_the_runs_records(slurm_clients, monkeypatch, tmp_path, caplog, ends,
                                                                  end, env, code, calls, said):
    """requeue_after_step, as every batch shell runs it: the run's records and the batch shell's signals
    decide, once; Slurm is asked only for a requeue the rule allows, and scontrol requeues the job. The job's
    exit code is 0 only for a run that finished."""
    import logging

    from hpc.launch.requeue import StepEnd, requeue_after_step

    monkeypatch.setenv("SACCT_SAYS", "88|RUNNING")
    monkeypatch.setenv("SCONTROL_SAYS", "JobId=88 JobState=RUNNING Reason=None Restarts=0")
    paths = ended_run(tmp_path, *ends)
    with caplog.at_level(logging.INFO):
        assert requeue_after_step(paths, (3, 5), StepEnd("88", 0, **end), env, 3, "hpc.batch") == code
    made = slurm_clients.read_text().splitlines() if slurm_clients.exists() else []
    assert [c for c in made if not any(c.startswith(p) for p in calls)] == [] and len(made) == len(calls), made
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert said in lines, lines
    assert ("stopped after" in lines) is ("stopped after" in said), lines  # no budget said for an end
    summary = json.loads(paths.summary.read_text())  # the run's end, written once its step has ended
    assert (summary["outcome"] == "cancelled") is (end.get("ended", False) and code != 0), summary["outcome"]


def test_a_resume_refuses_a_task_that_is_not_one(tmp_path, capsys):
    from hpc.core.cli import run
    from hpc.launch.submission.submit import main

    (tmp_path / "task.json").write_text('{"schema": 99}')
    code = run("hpc.submit", main, ["--resume", str(tmp_path), "--dry-run", "-A", "m1_g"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "task.json is not a task" in err[0], err


def test_submitits_own_requeue_never_runs_our_jobs():
    """submitit requeues on a timeout only a Checkpointable (its max_num_timeout): the requeue is the batch
    shell's alone (hpc/launch/requeue.py), so the executor is made without that budget."""
    import submitit

    from hpc.launch.submission.job import TaskJob
    from hpc.settings.rankcommand import user_command

    job = TaskJob(user_command(["python", "x.py"], "/", None, 60))
    assert not isinstance(job, submitit.helpers.Checkpointable) and not hasattr(job, "checkpoint")


def test_a_local_rank_gets_its_share_of_the_machines_cpus_unless_someone_said():
    """hpc.submit --local: each rank's threads are the machine's CPUs over its ranks, at least one, written in
    the job's setup; nothing is written where the profile, --export or the submitter's environment sets
    OMP_NUM_THREADS (theirs is kept)."""
    assert [threads_per_rank(2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert [threads_per_rank(cpus, 2) for cpus in (3, 4, 5)] == [1, 2, 2] and threads_per_rank(8, 0) == 8
    local = load_cluster("local")
    req = JobRequest(nodes=1, gpus=2, time_min=30, name="t")
    assert local_parameters(local, req, {}, 8)["setup"][-1] == "export OMP_NUM_THREADS=4"
    assert local_parameters(local, dataclasses.replace(req, gpus=1), {}, 8)["setup"][-1] == "export OMP_NUM_THREADS=8"
    said = JobOptions(exports=Exports(values={"OMP_NUM_THREADS": "3"}))
    set_by_profile = dataclasses.replace(local, env={**local.env, "OMP_NUM_THREADS": "2"})
    for cluster, request, env in ((local, req, {"OMP_NUM_THREADS": "1"}),
                                  (local, dataclasses.replace(req, options=said), {}),
                                  (set_by_profile, req, {})):
        setup = local_parameters(cluster, request, env, 8)["setup"]
        assert sum(line.startswith("export OMP_NUM_THREADS=") for line in setup) <= 1
        assert "export OMP_NUM_THREADS=4" not in setup, (cluster.env, request.options, env)
