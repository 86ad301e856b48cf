"""The batch shell's run and the allocation's run (hpc/launch/batch.py), in-process, with stand-ins for srun,
scontrol, squeue and scancel on PATH: each stand-in records what it was asked; srun starts its command as
one task (the real per-rank runner, then the command). The oracle is each stand-in's record and the run's
files as the runner wrote them; the real Slurm runs the same roads in the Slurm tier (test_slurm_jobs.py,
test_sbatch_habits_slurm.py)."""

import json
import os
import sys
from pathlib import Path

import pytest
from commands import call

# srun: its options dropped, the rest run as task 0 of 1; its SIGTERM passed on to the task's processes, as
# srun(1) passes it on. The task's pid is kept: scancel signals it and every process under it, as Slurm
# signals every process of a step.
TREE = 'tree() { echo "$1"; for c in $(ps -o pid= --ppid "$1"); do tree "$c"; done; }\n'
SRUN = TREE + """while [ $# -gt 0 ]; do
  case "$1" in -*) echo "$1" >> "$STANDIN/srun.args"; shift;; *) break;; esac
done
echo "$@" >> "$STANDIN/srun.args"
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_STEP_ID=0 SLURM_NODEID=0 SLURM_TASKS_PER_NODE=1
"$@" &
task=$!
echo $task > "$STANDIN/srun.pid"
trap 'kill -TERM $(tree $task) 2>/dev/null' TERM
while :; do wait $task; rc=$?; kill -0 $task 2>/dev/null || exit $rc; done
"""
RECORD = 'echo "$@" >> "$STANDIN/{name}.args"\n'
SCANCEL = RECORD.format(name="scancel") + TREE + """echo "scancel: what it says is kept from the terminal"
kill -TERM $(tree "$(cat "$STANDIN/srun.pid")")
"""


def stand_ins(folder: Path, **extra: str) -> dict[str, str]:
    """The stand-ins in `folder`, and an environment whose PATH finds them (then this Python's)."""
    folder.mkdir(parents=True, exist_ok=True)
    bodies = {"srun": SRUN, "scontrol": RECORD.format(name="scontrol"), "scancel": SCANCEL, **extra}
    for name, body in bodies.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}")
        (folder / name).chmod(0o755)
    path = f"{folder}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {"STANDIN": str(folder), "PATH": path, "BATCH_PID": str(os.getpid())}


def asked(folder: Path, name: str) -> list[str]:
    """The lines a stand-in recorded (none: it was not run)."""
    place = folder / f"{name}.args"
    return place.read_text().splitlines() if place.exists() else []


JOB = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
       "SLURM_JOB_NODELIST": "vm", "SLURM_CPUS_PER_TASK": "2", "SLURM_JOB_NAME": "mine",
       "SLURM_JOB_ACCOUNT": "m1_g", "SLURM_JOB_QOS": "regular", "SLURM_JOB_PARTITION": "gpu",
       "SLURM_RESTART_COUNT": "2", "ENVIRONMENT": "BATCH", "OMP_NUM_THREADS": "1"}


def saves_on_sigterm(sends: str, itself: bool = False) -> list[str]:
    """A command that sends `sends` (a signal's name) to this process (the batch shell, or hpc.submit in an
    allocation), and to itself too where `itself`, then waits for SIGTERM and exits 3, as a script that saved
    does. It gives up after 20 s (a stop that never came) and exits 0."""
    own = "os.kill(os.getpid(), signal.SIGTERM)\n" if itself else ""
    script = ("import os, signal, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: os._exit(3))\n"
              f"os.kill(int(os.environ['BATCH_PID']), signal.{sends})\n{own}"
              "time.sleep(20)\n")
    return [sys.executable, "-c", script]


def batch(tmp_path: Path, command: list[str], **env: str):
    bin_dir = tmp_path / "bin"
    out = call("hpc.batch", ["--profile", "local", "--run-dir", str(tmp_path / "run"), "--", *command],
               {**JOB, **stand_ins(bin_dir), **env})
    return out, bin_dir


def test_a_job_runs_its_command_as_one_srun_step_and_records_the_job(tmp_path):
    """The profile's environment reaches the task (profiles/local.yaml: GLOO_SOCKET_IFNAME=lo)."""
    says = "import os; print('trained on', os.environ['GLOO_SOCKET_IFNAME'])"
    out, bin_dir = batch(tmp_path, [sys.executable, "-c", says])
    run = tmp_path / "run"
    assert out.code == 0, out.stdout + out.stderr
    assert f"job 77 (restart 2) on vm: 1 node(s) x 1 GPU(s); run dir {run}" in out.stdout + out.stderr
    assert f"hpc.batch: {run}: done" in out.stdout + out.stderr
    srun = asked(bin_dir, "srun")
    assert srun[0] == "--kill-on-bad-exit=1" and srun[-1] == f"python -m hpc.rank --run-dir {run}", srun
    assert asked(bin_dir, "scontrol") == [] and asked(bin_dir, "scancel") == []
    job = json.loads((run / "job.json").read_text())
    assert {k: job[k] for k in ("nodes", "gpus", "profile", "name", "account", "qos", "partition")} == {
        "nodes": 1, "gpus": 1, "profile": "local", "name": "mine", "account": "m1_g", "qos": "regular",
        "partition": "gpu"}
    assert json.loads((run / "task.json").read_text())["words"] == [sys.executable, "-c", says]
    assert "trained on lo" in (run / "logs" / "rank0.out").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "done" and [r["exit_code"] for r in summary["ranks"]] == [0]


@pytest.mark.parametrize("shape, gpus", [
    ({}, 4),  # no --ntasks-per-node: four ranks a node, Perlmutter's
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "gpu:a100:2"}, 2),  # a typed count: its last field
])
def test_the_job_record_holds_the_steps_shape(tmp_path, shape, gpus):
    job = {k: v for k, v in JOB.items() if k != "SLURM_NTASKS_PER_NODE"}
    bin_dir = tmp_path / "bin"
    out = call("hpc.batch", ["--profile", "local", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c",
                             "pass"], {**job, **stand_ins(bin_dir), **shape})
    assert out.code == 0, out.stdout + out.stderr
    assert json.loads((tmp_path / "run" / "job.json").read_text())["gpus"] == gpus


def test_a_failed_command_fails_the_job_with_its_code_and_is_not_requeued(tmp_path):
    out, bin_dir = batch(tmp_path, [sys.executable, "-c", "raise SystemExit(5)"])
    assert out.code == 5, out.stdout + out.stderr
    assert f"hpc.batch: {tmp_path / 'run'}: failed" in out.stdout + out.stderr
    assert "requeue 77" not in asked(bin_dir, "scontrol")


@pytest.mark.parametrize("budget, requeued", [("3", True), ("2", True), ("1", False), ("0", False)])
def test_the_warning_tells_the_tasks_and_a_saved_run_requeues_while_requeues_are_left(tmp_path, budget, requeued):
    """SIGUSR2 to the batch shell: scancel --signal=TERM of the job (its tasks), the command's exit 3, then
    `scontrol requeue` of the job while HPC_MAX_REQUEUES exceeds its restarts (SLURM_RESTART_COUNT is 1 here:
    a budget of 2 allows one more, 1 none).
    The job's exit code is the run's, 3: never 0 for a run that did not finish."""
    out, bin_dir = batch(tmp_path, saves_on_sigterm("SIGUSR2"), HPC_MAX_REQUEUES=budget, SLURM_RESTART_COUNT="1")
    assert out.code == 3, out.stdout + out.stderr
    assert "job 77: Slurm's warning (SIGUSR2): the ranks are told to save and stop (SIGTERM)" in out.stdout + out.stderr
    assert asked(bin_dir, "scancel") == ["--signal=TERM 77"]
    assert ("requeue 77" in asked(bin_dir, "scontrol")) is requeued, asked(bin_dir, "scontrol")
    assert ("hpc.batch: job 77 requeued from the batch shell" in out.stdout + out.stderr) is requeued


def test_a_dry_run_says_the_command_and_the_step_and_writes_nothing(tmp_path):
    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--run-dir", str(tmp_path / "dry"), "--", "python",
                             "-c", "print(1)", "a b"], {**JOB, **stand_ins(tmp_path / "bin2")})
    said, step = out.stdout.splitlines()
    assert said == "# each rank runs: python -c 'print(1)' 'a b'"
    assert step.startswith("srun --kill-on-bad-exit=1 ")
    assert step.endswith(f"python -m hpc.rank --run-dir {tmp_path}/dry")
    assert not (tmp_path / "dry").exists() and not asked(tmp_path / "bin2", "srun")


@pytest.mark.parametrize("words, found", [
    (["--run-dir", "r1"], "r1"), (["--run-dir=r2"], "r2"), (["--epochs", "1"], "runs/hpc.train/77"),
])
def test_the_trainings_own_run_dir_is_the_runs(words, found):
    from hpc.launch.batch import run_dir_for

    assert run_dir_for(None, ["python", "-m", "hpc.train", *words], {"SLURM_JOB_ID": "77"}, "hpc.train") == Path(found)
    # a command of your own: its --run-dir is its own word, not the run's; with no job id the run is "here"
    own = run_dir_for(None, ["python", "t.py", *words], {"SCRATCH": "/s"}, "t")
    assert own == Path("/s/hpc-resnet-study/runs/t/here")
    assert run_dir_for(Path("given"), ["python", "-m", "hpc.train", *words], {}, "x") == Path("given")


# salloc's shell (the test cluster's Slurm 22.05): one node, 2 GPUs
SALLOC = {"SLURM_JOB_ID": "29", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_GPUS_PER_NODE": "2",
          "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_JOB_NODELIST": "vm", "OMP_NUM_THREADS": "1"}


def in_allocation(tmp_path: Path, command: list[str], *options: str, **extra: str):
    bin_dir = tmp_path / "bin"
    env = {**SALLOC, **stand_ins(bin_dir, **extra)}
    name = [] if "--name" in options else ["--name", "mine"]
    out = call("hpc.submit", ["--runs-dir", str(tmp_path / "runs"), "--profile", "perlmutter", "--gpus", "1",
                              *name, *options, "--", *command], env)
    return out, bin_dir


def test_each_run_in_an_allocation_is_a_step_of_its_own_in_a_folder_of_its_own(tmp_path):
    """Each start: RUNS/<name>/<job id>.<n>, the first free n; the command line's --export reaches the ranks."""
    says = "import os; print('given:', os.environ['WORD'])"
    for n in (0, 1, 2):
        out, bin_dir = in_allocation(tmp_path, [sys.executable, "-c", says], "--export", "ALL,WORD=mine")
        assert out.code == 0, out.stdout + out.stderr
        run = tmp_path / "runs" / "mine" / f"29.{n}"
        # what hpc.submit says of itself goes to stderr; the run's end, to stdout
        said = f"hpc.submit: inside allocation 29 (salloc): the run is one srun step there; run dir {run}\n"
        assert said in out.stderr
        assert out.stdout.startswith(f"job 29: done\n  run:     {run}\n")
        assert json.loads((run / "summary.json").read_text())["outcome"] == "done"
        assert "given: mine" in (run / "logs" / "rank0.out").read_text()
    srun = asked(bin_dir, "srun")
    assert srun.count("--job-name=hpc:mine/29.0") == 1 and srun.count("--job-name=hpc:mine/29.1") == 1, srun
    assert "--ntasks-per-node=1" in srun and "--nodes=1" in srun and "--cpus-per-task=4" in srun  # 4 CPUs, 1 GPU


def test_a_failed_run_in_an_allocation_is_its_exit_code_and_a_step_that_started_nothing_says_so(tmp_path):
    """hpc.submit's code for a failed run is 1, as for --wait and --local (docs/faults.md), not the rank's."""
    out, _ = in_allocation(tmp_path, [sys.executable, "-c", "raise SystemExit(5)"])
    assert out.code == 1, out.stdout + out.stderr
    out, _ = in_allocation(tmp_path, [sys.executable, "-c", "pass"], srun="exit 1\n")  # srun refused the step
    assert out.code == 1
    assert "hpc.submit: the step ended (srun exit 1) before any rank started; see" in out.stdout + out.stderr


def test_a_sigterm_inside_an_allocation_stops_its_step_by_name_and_says_how_to_resume(tmp_path, capfd):
    """`kill` of hpc.submit inside salloc: the step (found by its --job-name in squeue) gets scancel
    --signal=TERM, as a preemption's tasks do; the command exits 3, and the resume line is printed."""
    listing = RECORD.format(name="squeue") + 'echo "29.0 hpc:a=b/29.0"\necho "29.1 someone-else"\n'
    out, bin_dir = in_allocation(tmp_path, saves_on_sigterm("SIGTERM"), "--name", "a=b", squeue=listing)
    assert out.code == 3, out.stdout + out.stderr
    assert "hpc.submit: SIGTERM: the ranks stop and save what they can (step 29.0)" in out.stdout + out.stderr
    assert asked(bin_dir, "squeue") == ["-h -s -j 29 -o %i %j"]  # the job's steps, by id and name
    assert asked(bin_dir, "scancel") == ["--signal=TERM 29.0"]
    assert "scancel:" not in capfd.readouterr().out
    assert "hpc.submit: to resume it in an allocation: srun " in out.stdout + out.stderr


def test_a_sigterm_before_the_step_is_listed_is_sruns_own_stop(tmp_path):
    """A step squeue does not list (not started yet): srun itself gets the SIGTERM, and nothing is scancelled."""
    out, bin_dir = in_allocation(tmp_path, saves_on_sigterm("SIGTERM"), squeue=RECORD.format(name="squeue"))
    assert "hpc.submit: SIGTERM: the ranks stop and save what they can (step ?)" in out.stdout + out.stderr
    assert asked(bin_dir, "scancel") == [] and out.code == 3, out.stdout + out.stderr


@pytest.mark.parametrize("code", [0, 3, 5])
def test_submitits_job_takes_the_same_road_in_its_folder_and_ends_with_the_runs_code(tmp_path, capsys, code):
    """`BatchJob`, what hpc.submit's job runs through submitit: the run in submitit's folder (its %j, the job
    id), submitit's unexpanded '%j' folder beside it removed, and an unfinished run's code raised past
    submitit (SystemExit), so that the job ends with it."""
    from commands import environment

    from hpc.core.rundir import JobRecord
    from hpc.launch.batch import BatchJob, Step
    from hpc.launch.rank.rankcli import command_task
    from hpc.settings.config import load_cluster

    if code:  # submitit's unexpanded folder, left empty beside the run; a job may not have made it
        (tmp_path / "runs" / "%j").mkdir(parents=True)
    env = {**JOB, **stand_ins(tmp_path / "bin"), "SUBMITIT_EXECUTOR": "slurm",
           "SUBMITIT_FOLDER": str(tmp_path / "runs" / "%j")}
    task = command_task([sys.executable, "-c", f"raise SystemExit({code})"], None, False, [], 30)
    job = BatchJob(task, load_cluster("local"), Step("srun", 1, 1, None), JobRecord(nodes=1, gpus=1, profile="local"))
    with environment(env):
        if code:
            with pytest.raises(SystemExit) as ended:
                job()
            assert ended.value.code == code
        else:
            assert job() == "done"
    run = tmp_path / "runs" / "77"
    said = capsys.readouterr()
    assert f"hpc.submit: {run}: " in said.out + said.err  # its lines begin with the command whose log they are in
    assert json.loads((run / "job.json").read_text())["profile"] == "local"
    assert json.loads((run / "task.json").read_text())["words"][-1] == f"raise SystemExit({code})"
    assert json.loads((run / "summary.json").read_text())["ranks"][0]["exit_code"] == code
    assert not (tmp_path / "runs" / "%j").exists()


def test_a_sigterm_to_the_batch_shell_is_final_never_requeued(tmp_path):
    """SIGTERM to the batch shell is Slurm ending the job (a person's scancel, the time limit): the run that
    saved and exited 3 is not requeued, whatever requeues are left; scontrol is asked why the job ends."""
    # Slurm's SIGTERM reaches every process of the job: the batch shell and the task alike
    out, bin_dir = batch(tmp_path, saves_on_sigterm("SIGTERM", itself=True), HPC_MAX_REQUEUES="9",
                         SLURM_RESTART_COUNT="0")
    assert out.code == 3, out.stdout + out.stderr
    assert "show job -o 77" in asked(bin_dir, "scontrol") and "requeue 77" not in asked(bin_dir, "scontrol")
    # scontrol gives no time-limit reason: a person's scancel, recorded as Slurm names it
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["outcome"] == "cancelled"
    assert f"hpc.batch: {tmp_path / 'run'}: cancelled" in out.stdout + out.stderr


def test_a_step_srun_refused_ends_the_job_with_sruns_code(tmp_path):
    bin_dir = tmp_path / "bin"
    job = {k: v for k, v in JOB.items() if k not in ("SLURM_RESTART_COUNT", "SLURM_NNODES")}
    out = call("hpc.batch", ["--profile", "local", "--no-profile", "--run-dir", str(tmp_path / "run"), "--",
                             sys.executable, "-c", "pass"], {**job, **stand_ins(bin_dir, srun="exit 7\n")})
    assert out.code == 7, out.stdout + out.stderr
    assert f"job 77 (restart 0) on vm: 1 node(s) x 1 GPU(s); run dir {tmp_path / 'run'}" in out.stdout + out.stderr
    assert f"hpc.batch: {tmp_path / 'run'}: no rank started" in out.stdout + out.stderr


@pytest.mark.parametrize("no_profile", [False, True])
def test_the_tasks_config_and_no_profile_reach_task_json(tmp_path, no_profile):
    config = tmp_path / "c.yaml"
    config.write_text("command:\n  hang_timeout_s: 90\n")
    bin_dir = tmp_path / "bin"
    flags = ["--config", str(config), *(["--no-profile"] if no_profile else [])]
    out = call("hpc.batch", ["--profile", "local", *flags, "--run-dir", str(tmp_path / "run"), "--", sys.executable,
                             "-c", "pass"], {**JOB, **stand_ins(bin_dir)})
    assert out.code == 0, out.stdout + out.stderr
    task = json.loads((tmp_path / "run" / "task.json").read_text())
    assert task["hang_timeout_s"] == 90 and task["profiler"]["enabled"] is not no_profile, task


@pytest.mark.parametrize("words, found", [
    (["--run-dir"], "runs/hpc.train/77"),  # no value after it: not the run's
    (["--run-dir=a=b"], "a=b"),  # the value whole, past its first '='
])
def test_the_trainings_own_run_dir_is_read_whole(words, found):
    from hpc.launch.batch import run_dir_for

    assert run_dir_for(None, ["python", "-m", "hpc.train", *words], {"SLURM_JOB_ID": "77"}, "hpc.train") == Path(found)


def test_the_batch_shell_reads_its_own_command_line_and_profile_from_the_environment(tmp_path, monkeypatch, capsys):
    """`python -m hpc.batch` reads sys.argv; HPC_PROFILE names the profile when --profile does not, else
    perlmutter (whose srun binds CPUs: --cpu-bind=cores); the sized step's CPUs are 1 when Slurm says none."""
    from commands import environment

    from hpc.launch.batch import cli

    shape = {**JOB, "SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "2", "SLURM_JOB_ACCOUNT": "m1_g"}
    del shape["SLURM_CPUS_PER_TASK"]
    monkeypatch.setattr(sys, "argv", ["hpc.batch", "--dry-run", "--run-dir", "r", "--", "python", "-c", "pass"])
    for profile, bound in (({"HPC_PROFILE": "local"}, False), ({}, True)):
        with environment({**shape, **profile}):
            assert cli() == 0
        step = capsys.readouterr().out.splitlines()[-1]
        assert ("--cpu-bind=cores" in step) is bound and "--ntasks-per-node=2 --cpus-per-task=1" in step, step


def test_the_dry_runs_step_preview_is_the_steps_words():
    from hpc.launch.batch import Step, step_preview
    from hpc.settings.config import load_cluster

    cluster = load_cluster("local")
    assert step_preview(cluster, Path("r d"), Step("torchrun", 2, 4, 8, python="py"), None) == (
        "srun ... torchrun a node, its workers: py -m hpc.rank --run-dir 'r d'")
    assert step_preview(cluster, Path("r"), Step("srun", 1, 2, 8), "NONE").startswith("srun --kill-on-bad-exit=1 "
                                                                                       "--export=ALL ")
    assert "--export" not in step_preview(cluster, Path("r"), Step("srun", 1, 2, 8), None)
    assert step_preview(cluster, Path("r"), Step("srun", 1, 2, 8), None).endswith("python -m hpc.rank --run-dir r")


@pytest.mark.parametrize("launcher, gpus, agent, ordered", [
    ("torchrun", 4, True, True), ("srun", 4, False, True), ("srun", 2, False, False),
])
def test_an_allocations_step_environment_is_the_profiles_for_its_shape(tmp_path, launcher, gpus, agent, ordered):
    """torchrun's agents get a store of their own each start (AGENT_ENV); the GPU order only on a whole node."""
    from commands import environment

    from hpc.launch.batch import Step, allocation_words
    from hpc.launch.rank.rankcli import command_task
    from hpc.placement.torchrun import AGENT_ENV
    from hpc.settings.config import load_cluster

    task = command_task(["python", "t.py"], None, False, [], 30)
    with environment(SALLOC):
        _, words, env = allocation_words(task, tmp_path, load_cluster("perlmutter"), Step(launcher, 1, gpus, 8, True),
                                         {"A": "1"}, True)
    assert all(env.get(k) == v for k, v in AGENT_ENV.items()) is agent
    assert (env.get("HPC_GPU_ORDER") == "3,2,1,0") is ordered and env["A"] == "1"
    assert words[1] == f"--job-name=hpc:{tmp_path.name}/29.<n>" and not list(tmp_path.iterdir())  # made nothing
