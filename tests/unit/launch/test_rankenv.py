"""A rank's environment (hpc/launch/rank/rankenv.py) from literal Slurm, submitit and torchrun
environments; `python -m hpc.rank`'s exit code."""

import json
import os
from pathlib import Path

import pytest

from hpc.core.summary import attempt_of, exit_code_of
from recordedruns import entries
from hpc.launch.rank.rankenv import ordered_gpus, rank_env
from hpc.placement.distenv import from_environ
from hpc.settings.rankcommand import PROFILER_VARIABLE, RUN_DIR_VARIABLE, user_command

# What srun gives task 3 of a 2-node x 2-task step (as Slurm 22.05 sets them on the test cluster).
SRUN_TASK3 = {
    "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "nid[001-002]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_NODES": "2", "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": "/x", "PATH": "/usr/bin",
}


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


@pytest.mark.parametrize("rec, code", [
    ({"kind": "ok"}, 0), ({"kind": "stopped", "exit_code": 3}, 3), ({"kind": "failed", "exit_code": 7}, 7),
    ({"kind": "failed", "exit_code": None, "signal": "SIGSEGV"}, 139), ({"kind": "killed", "signal": "SIGKILL"}, 137),
    ({"kind": "failed", "exit_code": 127}, 127),
    ({"kind": "stopped", "exit_code": 0}, 3),  # exit 0 after a stop, unfinished: the stop's code, requeued as one
])
def test_hpc_rank_exits_as_its_command_did(rec, code):
    assert exit_code_of(entries([{"rank": 0, **rec}])[0]) == code


BATCH_SHELL = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
               "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_CPUS_PER_TASK": "8", "PATH": os.environ["PATH"]}


@pytest.mark.parametrize("launcher, env, shared", [
    ("torchrun", {}, "1"), ("srun", {}, None), ("node", {}, None),
    ("torchrun", {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}, "0"),  # the job's own setting wins
])
def test_torchruns_agent_gives_each_start_of_the_group_a_store_of_its_own(launcher, env, shared):
    """Whatever made the job (hpc.submit's profile, a hand-written script's HPC_LAUNCHER): the step's shape says."""
    from hpc.launch.batch import Step, step_env

    got = step_env(Step(launcher, 1, 2, None), {**BATCH_SHELL, **env})
    assert got.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == shared
