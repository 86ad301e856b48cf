"""Your own command (issue 39) as a task (issue 50), in-process: its words filled and checked, each rank's
environment from literal Slurm and submitit environments, the sbatch text of a command job (pinned by a
golden file), the plan of a command line and of a command sweep, and how a run ended from literal rank
records."""

import json
import dataclasses
import os
import signal
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.core.errors import UsageError
from hpc.core.rundir import RunPaths
from hpc.core.summary import (attempt_of, build_summary, exit_code_of, failure_line, last_said, read_records,
                              root_cause, run_outcome)
from hpc.launch.submission.plan import make_plan
from hpc.launch.submission.points import split_command
from hpc.launch.rank.rankenv import ordered_gpus, rank_env
from hpc.launch.submission.slurm import JobRequest, sbatch_text, slurm_parameters
from hpc.launch.submission.submit import STUDY_RUN, build_parser
from hpc.settings.rankcommand import (PROFILER_VARIABLE, RUN_DIR_VARIABLE, check_command, user_command, fill, launcher_in,
                              python_script)
from hpc.settings.config import load_cluster
from hpc.placement.distenv import from_environ

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "perlmutter_command_2x4.sbatch"
SCRIPT = str(REPO / "tests" / "scripts" / "torchrun_ddp.py")

# What srun gives task 3 of a 2-node x 2-task step (as Slurm 22.05 sets them on the test cluster).
SRUN_TASK3 = {
    "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "nid[001-002]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_NODES": "2", "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": "/x", "PATH": "/usr/bin",
}


# --- the words ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, script", [
    (["python", "train.py", "--lr", "0.1"], "train.py"),
    (["python3.11", "-u", "-W", "ignore", "a/b.py"], "a/b.py"),
    (["/usr/bin/python3", "-m", "pkg.train"], None),
    (["python", "-c", "print(1)"], None),
    (["torchrun", "train.py"], None),
    (["python"], None),
])
def test_the_script_of_a_python_command(argv, script):
    assert python_script(argv) == script


def test_a_command_that_cannot_start_is_one_line_naming_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data.txt").write_text("")
    check_command(["python3", "train.py"], tmp_path)
    for argv, needle in [([], "no command after it"), (["no-such-program-xyz"], "'no-such-program-xyz': not found on PATH"),
                         (["./data.txt"], "'./data.txt': not an executable file"),
                         (["python3", "missing.py"], "'missing.py': no such script")]:
        with pytest.raises(UsageError) as e:
            check_command(argv, tmp_path)
        assert needle in str(e.value) and "\n" not in str(e.value)
    check_command(["program-in-the-image", "x"], tmp_path, in_image=True)  # found in the image, not here


WORD = st.text(alphabet=string.ascii_letters + string.digits + "-_=/. {}", max_size=24)


@given(literal=st.text(alphabet=string.printable.replace("{", "").replace("}", ""), max_size=40))
def test_a_word_without_fields_is_kept_verbatim(literal):
    assert fill(literal, {"batch": 8}, "s") == literal
    assert fill(fill(literal, {"batch": 8}, "s", final=False), {"run_dir": "/r"}, "s") == literal


@given(batch=st.integers(1, 10**6), run_dir=st.text(alphabet=string.ascii_letters + "/{}", min_size=1, max_size=20),
       prefix=st.text(alphabet=string.ascii_letters + "-=", max_size=8))
def test_a_sweep_word_filled_in_two_stages_is_the_word_filled_at_once(batch, run_dir, prefix):
    """Planned (the point's values) then started (the run directory): the same as both at once, whatever
    the run directory holds (braces included)."""
    word = prefix + "{{x}}{batch}/{run_dir}"
    planned = fill(word, {"batch": batch}, "s", final=False)
    assert fill(planned, {"run_dir": run_dir}, "s") == fill(word, {"batch": batch, "run_dir": run_dir}, "s")
    assert fill(planned, {"run_dir": run_dir}, "s") == f"{prefix}{{x}}{batch}/{run_dir}"


@given(word=WORD)
def test_filling_any_word_either_fills_or_names_the_problem(word):
    try:
        out = fill(word, {"batch": 8, "gpus": 2}, "command.args")
    except UsageError as e:
        assert str(e).startswith("command.args: ") and "\n" not in str(e)
    else:
        assert "{batch}" not in out and "{gpus}" not in out


# --- each rank's environment ---------------------------------------------------------------------------

def test_a_rank_gets_torchruns_contract_from_sruns_variables(tmp_path):
    spec = user_command(["python", "t.py"], "/work", {"enabled": True, "wait": 1}, 60)
    env = rank_env(from_environ(SRUN_TASK3), tmp_path, spec, SRUN_TASK3, "41.0.0", hook_dir=Path("/hook"))
    # the oracle: the literal values above, as Slurm's documentation defines them
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "nid001"}
    assert "MASTER_PORT" not in env  # rank 0's runner's pick, added where the run meets (hpc/core/meet.py)
    assert env[RUN_DIR_VARIABLE] == str(tmp_path) and env["SLURM_PROCID"] == "3" and env["PATH"] == "/usr/bin"
    assert not [k for k in env if k.startswith("SUBMITIT_")]  # the command is no submitit job
    assert json.loads(env[PROFILER_VARIABLE])["wait"] == 1 and env["PYTHONPATH"] == "/hook"
    assert env["HPC_ATTEMPT"] == "41.0.0" and env["HPC_RANK_LAUNCHER"] == "slurm"  # the runner's, for the task
    off = rank_env(from_environ(SRUN_TASK3), tmp_path, user_command(["x"], "/", None, 60),
                   {**SRUN_TASK3, PROFILER_VARIABLE: "{}"}, "41.0.0")
    assert PROFILER_VARIABLE not in off and "PYTHONPATH" not in off
    # the toolkit's training profiles itself: no hook, whatever profiler section came with it
    training = user_command(["python", "-m", "hpc.train", "--epochs", "1"], "/", {"enabled": True}, 60)
    assert training.profiler is None and training.requeue_codes == (3, 5)
    assert PROFILER_VARIABLE not in rank_env(from_environ(SRUN_TASK3), tmp_path, training, SRUN_TASK3, "41.0.0")


def test_a_local_ranks_environment_has_no_outer_jobs_slurm_variables(tmp_path):
    """--local inside an sbatch or salloc shell: Lightning's SLURMEnvironment reads SLURM_NTASKS and
    SLURM_PROCID; the task gets this run's ranks (torchrun's variables) and none of the outer job's."""
    outer = {"SLURM_JOB_ID": "55", "SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "HOME": "/h",
             "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
             "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_JOB_ID": "991"}
    env = rank_env(from_environ(outer), tmp_path, user_command(["x"], "/", None, 60), outer, attempt_of(outer))
    assert not [k for k in env if k.startswith(("SLURM_", "SUBMITIT_"))] and env["HOME"] == "/h"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2") and attempt_of(outer) == "991.0.0"


def test_a_sweeps_environment_gets_the_run_directory(tmp_path):
    spec = user_command(["x"], "/", None, 60, env={"OUT": "{run_dir}/out", "B": "8"})
    env = rank_env(from_environ({}), tmp_path, spec, {"PYTHONPATH": "/mine"}, "here.0.0")
    assert env["OUT"] == f"{tmp_path}/out" and env["B"] == "8" and env["RANK"] == "0" and env["WORLD_SIZE"] == "1"


@pytest.mark.parametrize("env, expected", [
    ({"HPC_GPU_ORDER": "3,2,1,0", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "3,2,1,0"),
    ({"HPC_GPU_ORDER": "3,2,1,0", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "7,6,5,4"),
    ({"HPC_GPU_ORDER": "3,2,1,0", "CUDA_VISIBLE_DEVICES": "2"}, None),  # a shared node's one GPU
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None),
    ({"HPC_GPU_ORDER": "1,0,x", "CUDA_VISIBLE_DEVICES": "0,1,2"}, None),
])
def test_the_gpus_are_ordered_so_cuda_local_rank_is_the_near_one(env, expected):
    assert ordered_gpus(env) == expected


# --- the job's Slurm side ------------------------------------------------------------------------------

def command_sbatch_text() -> str:
    cluster = load_cluster("perlmutter")
    req = JobRequest(nodes=2, gpus=4, time_min=120, name="train", account="m1234_g")
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
    req = JobRequest(nodes=1, gpus=2, time_min=30, name="t", account="m1_g")
    params = slurm_parameters(cluster, req)
    assert params["qos"] == "shared" and params["gpus_per_node"] == 2 and "gpus_per_task" not in params


@pytest.mark.parametrize("launcher, tasks, cpus", [("srun", 4, 32), ("torchrun", 1, 128), ("node", 1, 128)])
def test_a_node_launcher_job_is_one_task_a_node_with_every_gpu(launcher, tasks, cpus):
    """`launcher: node`: one process a node owning its 4 GPUs (a DataParallel script), its CPUs with it."""
    cluster = dataclasses.replace(load_cluster("perlmutter"), launcher=launcher)
    params = slurm_parameters(cluster, JobRequest(nodes=2, gpus=4, time_min=30, name="t", account="m1_g"))
    assert (params["ntasks_per_node"], params["gpus_per_node"], params["cpus_per_task"]) == (tasks, 4, cpus)


# --- the plan of a command line -----------------------------------------------------------------------

def plan_of(tmp_path, argv):
    """hpc.submit's plan of `argv`; a sweep (--sweep FILE) is hpc.study run's, as the commands take them."""
    own, words = split_command(argv)
    if "--sweep" in own:
        at = own.index("--sweep")
        own = [own[at + 1], *own[:at], *own[at + 2:]]
        return make_plan(build_parser(STUDY_RUN).parse_args(["--runs-dir", str(tmp_path), *own]), words)
    return make_plan(build_parser().parse_args(["--runs-dir", str(tmp_path), *own]), words)


def test_split_command_keeps_the_words_after_the_first_double_dash():
    assert split_command(["--nodes", "2", "--", "python", "t.py", "--", "x"]) == (["--nodes", "2"],
                                                                                  ["python", "t.py", "--", "x"])
    assert split_command(["--dry-run"]) == (["--dry-run"], None)


def test_a_command_plan_keeps_the_words_verbatim(tmp_path):
    words = ["python", SCRIPT, "--name", "a b; $HOME *", "{batch}"]
    plan = plan_of(tmp_path, ["--dry-run", "--gpus", "2", "--", *words])
    (spec,) = plan.specs
    ((point, command),) = spec.points
    assert point is None and command.words_for(Path("/r"), "py") == words
    assert spec.folder == tmp_path / "torchrun_ddp" / "%j" and command.cwd == os.getcwd()
    assert command.profiler["enabled"] and command.stop_grace_s == 120  # perlmutter's


@pytest.mark.parametrize("argv, needle", [
    (["--batch-size", "8", "--", "python", SCRIPT], "--batch-size: a flag of the toolkit's own training"),
    (["--set", "train.lr=1", "--", "python", SCRIPT], "section 'train' is not used here"),
    (["--", "python", "nope.py"], "'nope.py': no such script"),
    (["--"], "no command"),
])
def test_a_bad_command_line_is_one_line(tmp_path, argv, needle):
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", *argv])
    assert needle in str(e.value)


def test_a_single_jobs_config_may_add_words_but_not_a_points_field(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("command:\n  args: [--out, '{run_dir}/w.pt']\n  env: {SEED: '7'}\nprofiler: {active: 2}\n")
    ((_, command),) = plan_of(tmp_path, ["--dry-run", "--config", str(config), "--", "python", SCRIPT]).specs[0].points
    assert command.words_for(Path("/r"), "py") == ["python", SCRIPT, "--out", "/r/w.pt"] and command.env == {"SEED": "7"}
    config.write_text("command:\n  args: [--batch-size, '{batch}']\n")
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", "--config", str(config), "--", "python", SCRIPT])
    assert str(e.value).startswith(f"--config {config}: command: '{{batch}}': no value for {{batch}}")


def test_a_command_sweep_fills_each_point_and_skips_axes_it_never_uses(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: s\n  batch_sizes: [8, 16]\n  gpus: [1, 2]\n"
                     "command:\n  args: [--batch-size, '{batch}', --out, '{run_dir}/w.pt']\n  env: {N: '{ranks}'}\n")
    plan = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    points = [(p, c) for spec in plan.specs for p, c in spec.points]
    # data_fractions defaults to three values, but no word uses {fraction}: one each, not three copies
    assert sorted((p["batch_size"], p["gpus"]) for p, _ in points) == [(8, 1), (8, 2), (16, 1), (16, 2)]
    for p, c in points:
        assert c.words[2:] == ("--batch-size", str(p["batch_size"]), "--out", "{run_dir}/w.pt")
        # and the batch the start-up hook's out-of-memory record names (the words use {batch})
        assert c.env == {"N": str(p["gpus"]), "HPC_POINT_BATCH": str(p["batch_size"])} and c.point == p
        assert c.words_for(Path("/r/7"), "py")[-1] == "/r/7/w.pt"
    sweep.write_text("sweep:\n  data_fractions: [1, 0.5]\ncommand:\n  args: ['{batch}']\n")
    with pytest.raises(UsageError) as e:
        plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    assert "sweep.data_fractions has 2 values but the command never uses {fraction}" in str(e.value)


def test_a_command_sweep_planned_again_from_its_sweep_file_is_the_same(tmp_path):
    """`hpc.study resubmit` plans the points again from sweep.yaml alone, from any directory."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: s\n  batch_sizes: [8, 16]\n  gpus: [1]\ncommand:\n  args: ['{batch}']\n"
                     "  env: {OUT: '{run_dir}'}\nprofiler: {active: 2}\n")
    first = plan_of(tmp_path, ["--dry-run", "--sweep", str(sweep), "--", "python", SCRIPT])
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(first.sweep_file))
    cwd = os.getcwd()
    os.chdir("/")
    try:
        again = plan_of(tmp_path, ["--dry-run", "--sweep", str(saved)])
    finally:
        os.chdir(cwd)
    points = lambda plan: [(p, c.to_dict()) for spec in plan.specs for p, c in spec.points]  # noqa: E731
    assert points(again) == points(first) and points(first)[0][1]["profiler"]["active"] == 2


def test_a_dry_run_says_what_each_rank_runs(tmp_path):
    from commands import call

    out = call("hpc.submit", ["--dry-run", "--nodes", "2", "--runs-dir", str(tmp_path), "--", "python", SCRIPT, "a b"])
    assert out.code == 0, out.stderr
    assert f"# each rank runs: python {SCRIPT} 'a b'" in out.stdout and "#SBATCH --signal=TERM@180" in out.stdout
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


# --- how a run ended, from literal records --------------------------------------------------------------

def record(rank, kind, ended, **more):
    return {"rank": rank, "kind": kind, "ended_ns": ended, "attempt": "9.0.0", "hostname": f"nid00{rank // 2 + 1}",
            "local_rank": rank % 2, "world_size": 4, "message": more.pop("message", f"{kind} {rank}"),
            "logs": {"err": f"/r/logs/rank{rank}.err"}, **more}


def test_the_root_cause_is_the_first_rank_to_fail_on_its_own():
    records = [record(0, "peer", 50), record(1, "failed", 30, message="exit 1: ValueError: x"),
               record(2, "failed", 20, message="signal SIGSEGV: "), record(3, "peer", 10)]
    assert root_cause(records)["rank"] == 2  # the victims ended first, yet are never the cause
    assert run_outcome(records, 4) == "failed"
    line = failure_line(records, 4)
    assert line.startswith("rank 2 failed first (on nid002, local rank 0): signal SIGSEGV")
    assert "/r/logs/rank2.err" in line and "ranks 0,1,3 ended after it" in line
    assert "left no record" in failure_line(records[1:3], 4) and "ranks 0,3 left no record" in failure_line(records[1:3], 4)
    tie = [record(3, "failed", 5), record(1, "failed", 5)]
    assert root_cause(tie)["rank"] == 1


@pytest.mark.parametrize("kinds, outcome", [
    (["ok"] * 4, "done"), (["ok"] * 3, "running"), (["stopped"] * 4, "stopped"), (["ok", "stopped"] * 2, "stopped"),
    (["stopped", "killed", "stopped", "stopped"], "preempted"), (["interrupted"] * 4, "preempted"),
    (["running", "ok", "ok", "ok"], "running"),
])
def test_a_runs_outcome_from_its_ranks(kinds, outcome):
    assert run_outcome([record(r, k, r) for r, k in enumerate(kinds)], 4) == outcome
    assert failure_line([record(r, k, r) for r, k in enumerate(kinds)], 4) is None


def test_only_the_latest_attempt_is_read(tmp_path):
    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    old = {**record(0, "failed", 1), "attempt": "9.0.0", "group": "9.0.0", "started_ns": 100}
    new = {**record(0, "ok", 2), "attempt": "9.1.0", "group": "9.1.0", "started_ns": 200}
    paths.rank_exit(0).write_text(json.dumps(new))
    paths.rank_exit(1).write_text(json.dumps({**old, "rank": 1}))
    paths.rank_exit(2).write_text("{cut sho")  # a record cut by a full disk is not read
    assert [(r["rank"], r["attempt"]) for r in read_records(paths)] == [(0, "9.1.0")]
    (tmp_path / "task.json").write_text(json.dumps(user_command(["x"], "/", None, 60).to_dict()))
    summary = build_summary(paths, read_records(paths), {})
    assert summary["outcome"] == "running" and summary["world_size"] == 4 and not summary["profiled"]


def test_an_earlier_starts_records_are_kept_and_said(tmp_path):
    """A torchrun restart across two nodes: each rank's runner moves its first start's record aside, and
    summary.json and one line name the rank that start lost first. The node whose worker died counts a
    restart (9.0.1), the other restarts its worker without counting (9.0.0 again): the group's store
    (a new one each start) says which records are one start. A requeue (9.1.0) is not torchrun's
    restart: no line."""
    from hpc.core.summary import restarts_line
    from hpc.launch.rank.rankrecords import keep_earlier

    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    first = [record(0, "interrupted", 6, message="signal SIGTERM after SIGTERM", started_ns=1),
             record(1, "failed", 5, message="signal SIGKILL: killed from outside", started_ns=2)]
    first[1].update(hostname="nid002", local_rank=0)  # one rank a node
    for r in first:
        paths.rank_exit(r["rank"]).write_text(json.dumps({**r, "world_size": 2, "group": "9.0@nid001:111"}))
    for rank, attempt in ((0, "9.0.0"), (1, "9.0.1")):
        keep_earlier(paths, rank)
        paths.rank_exit(rank).write_text(json.dumps({**record(rank, "ok", 9, started_ns=7 + rank), "world_size": 2,
                                                     "attempt": attempt, "group": "9.0@nid001:222"}))
    assert sorted(p.name for p in paths.earlier.iterdir()) == ["rank0.1.exit.json", "rank1.2.exit.json"]
    assert [(r["rank"], r["attempt"]) for r in read_records(paths)] == [(0, "9.0.0"), (1, "9.0.1")]
    summary = build_summary(paths, read_records(paths), {})
    assert summary["outcome"] == "done" and summary["attempt"] == "9.0.1"
    assert summary["earlier"] == [{
        "attempt": "9.0.0", "outcome": "failed", "first": "rank 1 (nid002): signal SIGKILL: killed from outside",
        "failure": "rank 1 failed first (on nid002, local rank 0): signal SIGKILL: killed from outside; its stderr: "
                   "/r/logs/rank1.err; rank 0 ended after it"}]
    assert restarts_line(summary) == (
        "torchrun restarted the worker group 1 time (ranks/earlier/ has how each rank ended): after 9.0.0, "
        "rank 1 (nid002): signal SIGKILL: killed from outside")
    assert restarts_line({**summary, "attempt": "9.1.0"}) is None  # a requeue's earlier start


@pytest.mark.parametrize("lines, said", [
    # seen in CI: the script raised, then gloo's threads aborted its exit (SIGABRT)
    (["[rank1]: Traceback (most recent call last):", '[rank1]:   File "crash_ddp.py", line 24, in main',
      "[rank1]: ValueError: bad batch at step 3 on rank 1 (pid 9)", "terminate called without an active exception"],
     "[rank1]: ValueError: bad batch at step 3 on rank 1 (pid 9)"),
    (["Traceback (most recent call last):", "torch.distributed.DistBackendError: [../gloo] Connection closed"],
     "torch.distributed.DistBackendError: [../gloo] Connection closed"),
    (["loading", "Segmentation fault (core dumped)"], "Segmentation fault (core dumped)"),
    ([], None),
])
def test_a_failed_rank_is_said_by_its_exception_where_it_raised_one(lines, said):
    assert last_said(lines) == said


@pytest.mark.parametrize("env, attempt", [
    ({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}, "12.2.0"),
    ({"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "1"}, "12_1.0.0"),
    ({"SUBMITIT_LOCAL_JOB_ID": "777", "TORCHELASTIC_RESTART_COUNT": "1"}, "777.0.1"),
    ({}, "here.0.0"),
])
def test_an_attempt_is_the_job_and_its_restarts(env, attempt):
    assert attempt_of(env) == attempt


@pytest.mark.parametrize("rec, code", [
    ({"kind": "ok"}, 0), ({"kind": "stopped", "exit_code": 3}, 3), ({"kind": "failed", "exit_code": 7}, 7),
    ({"kind": "failed", "exit_code": None, "signal": "SIGSEGV"}, 139), ({"kind": "killed", "signal": "SIGKILL"}, 137),
    ({"kind": "failed", "exit_code": 127}, 127),
    ({"kind": "stopped", "exit_code": 0}, 3),  # exit 0 after a stop, unfinished: the stop's code, requeued as one
])
def test_hpc_rank_exits_as_its_command_did(rec, code):
    assert exit_code_of(rec) == code


# --- the sbatch scripts' batch shell (hpc/launch/batch.py), inside a literal 2-node allocation ---------------

BATCH_SHELL = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
               "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_CPUS_PER_TASK": "8", "PATH": os.environ["PATH"]}


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "node"])
def test_the_batch_shell_runs_one_step_of_runners(tmp_path, launcher):
    """What jobs/resnet152.sbatch runs after `module load`: the training's own --run-dir is the run's, and
    its step is one srun of runners (one a task), or of torchrun over runners (one a node)."""
    from commands import call

    env = {**BATCH_SHELL, "HPC_LAUNCHER": launcher}
    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "-m", "hpc.train", "--run-dir",
                             str(tmp_path / "r"), "--epochs", "1"], env)
    assert out.code == 0, out.stderr
    said, step = out.stdout.splitlines()
    assert said == f"# each rank runs: python -m hpc.train --run-dir {tmp_path / 'r'} --epochs 1"
    runner = f"-m hpc.rank --run-dir {tmp_path / 'r'}"
    if launcher == "srun":
        assert step.startswith("srun --kill-on-bad-exit=1 ") and step.endswith(f"python {runner}")
        assert "--ntasks" not in step
    elif launcher == "node":  # one runner a node, its CPUs for the one process that uses every GPU
        assert "--ntasks-per-node=1 --ntasks=2 --cpus-per-task=16" in step and step.endswith(f"python {runner}")
        assert "torch.distributed.run" not in step
    else:  # 2 nodes: one task each, its CPUs for both workers, torchrun's rendezvous at the first node
        assert "--ntasks-per-node=1 --ntasks=2 --cpus-per-task=16" in step and "--nproc-per-node=2" in step
        assert "--rdzv-endpoint=nid001:" in step and step.endswith(runner)
    assert not (tmp_path / "r").exists()  # a dry run writes nothing


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


@pytest.mark.parametrize("launcher, env, shared", [
    ("torchrun", {}, "1"), ("srun", {}, None), ("node", {}, None),
    ("torchrun", {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}, "0"),  # the job's own setting wins
])
def test_torchruns_agent_gives_each_start_of_the_group_a_store_of_its_own(launcher, env, shared):
    from hpc.launch.batch import job_environment

    got = job_environment(load_cluster("local"), {**BATCH_SHELL, **env, "HPC_LAUNCHER": launcher})
    assert got.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == shared


def test_the_batch_shell_names_a_commands_run_after_its_script(tmp_path, monkeypatch):
    from commands import call

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    out = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "train.py"], BATCH_SHELL)
    assert out.code == 0, out.stderr
    assert out.stdout.splitlines()[1].endswith("python -m hpc.rank --run-dir runs/train/77")  # no $SCRATCH here
    scratch = call("hpc.batch", ["--dry-run", "--profile", "local", "--", "python", "train.py"],
                   {**BATCH_SHELL, "SCRATCH": "/s"})
    assert scratch.stdout.splitlines()[1].endswith("--run-dir /s/hpc-resnet-study/runs/train/77")


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


@pytest.mark.parametrize("argv, instead", [
    (["torchrun", "--nproc-per-node", "2", "train.py"], "set cluster.launcher: torchrun"),
    (["/opt/bin/torchrun", "train.py"], "set cluster.launcher: torchrun"),
    (["python", "-m", "torch.distributed.run", "--standalone", "train.py"], "set cluster.launcher: torchrun"),
    (["python3", "-u", "-mtorch.distributed.launch", "train.py"], "set cluster.launcher: torchrun"),
    (["accelerate", "launch", "train.py"], "ACCELERATE_* variables"),
    (["python", "-m", "accelerate.commands.launch", "train.py"], "ACCELERATE_* variables"),
    (["deepspeed", "train.py"], "deepspeed.init_distributed()"),
    (["mpirun", "-n", "4", "python", "train.py"], "one process per GPU itself"),
    (["srun", "python", "train.py"], "one process per GPU itself"),
])
def test_a_launcher_inside_the_command_is_refused_naming_what_to_write(tmp_path, argv, instead):
    with pytest.raises(UsageError) as e:
        check_command(argv, tmp_path)
    said = str(e.value)
    assert said.startswith(f"command line: -- '{argv[0]}': a launcher inside the command would start one on every "
                           "rank") and instead in said and "\n" not in said
    assert launcher_in(["accelerate", "config"]) is None and launcher_in(["python", "-m", "torch.utils.bottleneck"]) is None
