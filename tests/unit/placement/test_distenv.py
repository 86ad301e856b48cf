"""hpc.distenv: hostlists (literal cases; against scontrol in test_hostlist_scontrol) and env mapping."""

import dataclasses

import pytest
from conftest import run_module

from hpc.core.errors import DistEnvError, HostlistError
from hpc.placement import distenv, torchrun
from hpc.placement.distenv import export_lines, from_environ
from hpc.placement.hostlist import expand_hostlist, expand_tasks_per_node

# Literal cases whose answers were read off `scontrol show hostnames` (Slurm 22.05), so they hold
# where scontrol is absent.
SCONTROL_ANSWERS = {
    "nid[001-003,010],gpu-a[1-2]b[01-02]":
        ["nid001", "nid002", "nid003", "nid010", "gpu-a1b01", "gpu-a1b02", "gpu-a2b01", "gpu-a2b02"],
    "a[1-2]b[3-4]c[5-6]": ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
    "x[08-11]": ["x08", "x09", "x10", "x11"],
    "x[8-011]": ["x8", "x9", "x10", "x11"],
    "a[01-2,5-06]": ["a01", "a02", "a5", "a6"],
    "a,b,a": ["a", "b", "a"],
    "n[1-3],n2": ["n1", "n2", "n3", "n2"],
    "n[1-2]-[3-4]": ["n1-3", "n1-4", "n2-3", "n2-4"],
    "a[1-2][3-4]": ["a13", "a14", "a23", "a24"],
    "a[1-2]1[3-4]": ["a113", "a114", "a213", "a214"],
    "[1-2]": ["1", "2"],
    "a[1-]": ["a1"],
    "a[ 1-2]": ["a01", "a02"],
    "a[+1-2]": ["a01", "a02"],
    "a[1-2] b[3]": ["a1", "a2", "b3"],
    "a[1-2],,b": ["a1", "a2", "b"],
    "ab[1-2": ["ab]"],
    "[1-2": ["1-2"],
    "a[[1-2]": ["a[1", "a[2"],
    "a[1-2]x[3": ["a[1-2]x]"],
    "a9999999999999999999999": ["a0018446744073709551615"],
    "au[008-10,2-0,3]gax[0007]g3[100]": [],  # bad inner group: Slurm drops the name silently
    "": [],
}
SCONTROL_INVALID = ["a[1-2]c", "a[3-1]", "a[]", "a[1-2,]", "a[-1]", "a[x-y]", "a[1-2]]", "a[1-2]-b",
                    "a[1-2]b[3-4]x", "a[0-65536]", "[07-16,000,9 9],pg"]


@pytest.mark.parametrize("expr", sorted(SCONTROL_ANSWERS))
def test_hostlist_literal(expr):
    assert expand_hostlist(expr) == SCONTROL_ANSWERS[expr]


@pytest.mark.parametrize("expr", SCONTROL_INVALID)
def test_hostlist_invalid(expr):
    with pytest.raises(HostlistError):
        expand_hostlist(expr)


def test_hostlist_large_range_and_limit():
    assert len(expand_hostlist("a[0-65535]")) == 65536


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    for bad in ["", "2(x", "a", "2(3)"]:
        with pytest.raises(DistEnvError, match="SLURM_TASKS_PER_NODE"):
            expand_tasks_per_node(bad)


def srun_env(procid, localid, nodeid, **extra):
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": "7", "SLURM_NNODES": "4",
        "SLURM_JOB_NODELIST": "nid[001-004]", "SLURM_STEP_NODELIST": "nid[002-004],nid001",
        "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_srun_task_heterogeneous_nodes():
    d = from_environ(srun_env(6, 0, 3))
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank, d.num_nodes) == (6, 7, 0, 1, 3, 4)
    assert d.master_addr == "nid002"  # first host of the *step* nodelist
    assert d.launcher == "slurm"
    # no task computes the port from the job id (public: squeue, argv): rank 0's runner picks it (issue 62)
    assert {from_environ(srun_env(r, r % 2, r // 2)).master_port for r in range(6)} == {None}
    assert "MASTER_PORT" not in d.torch_env()
    with pytest.raises(DistEnvError, match="MASTER_PORT is not set: export it from the batch script"):
        export_lines(d)


def test_master_port_override():
    assert from_environ(srun_env(0, 0, 0, MASTER_PORT=12345)).master_port == 12345
    assert from_environ(srun_env(0, 0, 0, HPC_MASTER_PORT=23456)).master_port == 23456


def test_torchrun_passthrough_wins():
    env = srun_env(3, 1, 1, RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4, MASTER_ADDR="h0",
                   MASTER_PORT=29400, GROUP_RANK=1)
    d = from_environ(env)
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank, d.master_addr, d.master_port,
            d.launcher) == (5, 8, 1, 4, 1, "h0", 29400, "torchrun")


def test_batch_shell_is_not_rank_zero_of_the_job():
    # What sbatch's batch step really has (read off the test cluster): PROCID=0 and NTASKS=4, no step id.
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4",
           "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "nid[001-002]",
           "SLURM_TASKS_PER_NODE": "2(x2)"}
    d = from_environ(env)
    assert d.world_size == 1 and d.launcher == "slurm-batch"
    assert d.master_addr == "nid001" and d.master_port is None  # the command picks a free one to export
    lines = export_lines(dataclasses.replace(d, master_port=40001))
    assert [line.split("=")[0] for line in lines] == ["export MASTER_ADDR", "export MASTER_PORT"]


def test_submitit_local_and_single():
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "3", "SUBMITIT_LOCAL_GLOBALID": "2",
           "SUBMITIT_LOCAL_LOCALID": "2", "SUBMITIT_LOCAL_JOB_ID": "991"}
    d = from_environ(env)
    assert (d.rank, d.world_size, d.local_world_size, d.master_addr, d.launcher) == (2, 3, 3, "127.0.0.1", "submitit-local")
    single = from_environ({})
    assert (single.rank, single.world_size, single.launcher) == (0, 1, "single")


def test_local_inside_an_outer_slurm_step_is_still_local():
    """`hpc.submit --local` from an salloc shell that is a step (SLURM_STEP_ID set, the outer job's rank 5
    of 8): the local run's own place, not the outer job's."""
    outer = srun_env(5, 1, 1, SLURM_NTASKS="8")
    env = {**outer, "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
           "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_JOB_ID": "991"}
    d = from_environ(env)
    assert (d.rank, d.world_size, d.launcher) == (1, 2, "submitit-local")


@pytest.mark.parametrize("env,needle", [
    (srun_env(7, 0, 3), "SLURM_PROCID=7"),  # rank >= world size
    (srun_env(0, 0, 0, SLURM_NODEID=9), "SLURM_NODEID=9"),
    ({k: v for k, v in srun_env(0, 0, 0).items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID"),
    (srun_env(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="2(x4)"), "SLURM_STEP_TASKS_PER_NODE"),
    (srun_env(0, 0, 0, SLURM_STEP_NUM_NODES=3), "SLURM_STEP_NUM_NODES=3"),
    (srun_env(0, 0, 0, SLURM_STEP_NODELIST="a[3-1]"), "SLURM_STEP_NODELIST"),
    (srun_env(0, 0, 0, SLURM_PROCID="x"), "SLURM_PROCID='x'"),
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "rank 3"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2"}, "RANK"),
    ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "2",
      "SUBMITIT_LOCAL_LOCALID": "0"}, "SUBMITIT_LOCAL_GLOBALID=2"),
])
def test_inconsistent_environments_are_named(env, needle):
    with pytest.raises(DistEnvError) as info:
        from_environ(env)
    assert needle in str(info.value)


def test_cli_exports_and_errors():
    ok = run_module("hpc.distenv", env=srun_env(4, 0, 2, MASTER_PORT=40001))  # the batch shell's export
    assert ok.returncode == 0, ok.stderr
    assert "export RANK=4" in ok.stdout and "export WORLD_SIZE=7" in ok.stdout
    assert "export MASTER_ADDR=nid002" in ok.stdout and "export MASTER_PORT=40001" in ok.stdout
    unset = run_module("hpc.distenv", env=srun_env(4, 0, 2))
    assert unset.returncode == 2 and "MASTER_PORT is not set: export it from the batch script" in unset.stderr
    bad = run_module("hpc.distenv", env=srun_env(9, 0, 2))
    assert bad.returncode == 2 and "SLURM_PROCID=9" in bad.stderr and "Traceback" not in bad.stderr
    hl = run_module("hpc.distenv", "--hostlist", "n[1-2]")
    assert hl.stdout.split() == ["n1", "n2"]


def test_distenv_does_not_import_torch():
    r = run_module("hpc.distenv", "--json")
    assert r.returncode == 0
    code = "import sys, hpc.distenv, hpc.config; print('torch' in sys.modules)"
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_torchrun_args_for_a_slurm_job():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_NNODES": "2"}
    args = distenv.slurm_torchrun_args(env, 4, 3, port=40123)
    assert args[:6] == ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=nid001:40123",
                        "--rdzv-id=4242", "--max-restarts=3"]
    assert args[6:] in ([], ["--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"])
    assert torchrun.torchrun_args(1, 2, "h:1", "j", 0, forward_signals=True)[-1].endswith("SIGUSR2")
    with pytest.raises(DistEnvError, match="SLURM_JOB_ID"):
        distenv.slurm_torchrun_args({}, 4, 3)


def test_torchrun_worker_knows_its_attempt_when_the_agent_hosts_the_store():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
           "MASTER_PORT": "44447"}
    assert distenv.from_environ(env).elastic_attempt is None  # a plain torchrun-style environment
    agent = {**env, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert distenv.from_environ(agent).elastic_attempt == 2  # the third start of the worker group


def test_a_hostlist_of_bytes_comes_back_as_those_bytes():
    """Undecodable bytes on the command line (Python reads them as surrogates) are printed back as the same
    bytes, not a UnicodeEncodeError traceback (found by the property tests)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "hpc.distenv", "--hostlist", b"n\xff[1-2]"], capture_output=True)
    assert proc.returncode == 0 and proc.stdout == b"n\xff1\nn\xff2\n", proc.stderr


def test_an_empty_host_name_is_no_master_address():
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0",
           "SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "[", "SLURM_TASKS_PER_NODE": "1"}
    with pytest.raises(DistEnvError, match="names no host"):
        from_environ(env)


def test_a_job_id_of_undecodable_bytes_still_gives_torchrun_args():
    """The environment may hold bytes that are not UTF-8 (Python reads them as surrogates): found by the
    property tests as a UnicodeEncodeError traceback."""
    args = distenv.slurm_torchrun_args({"SLURM_JOB_ID": "\udc80", "SLURM_JOB_NODELIST": "n1"}, 2, 1, port=40000)
    assert "--rdzv-endpoint=n1:40000" in args and "--rdzv-id=\udc80" in args


def test_the_agents_port_is_a_free_one_of_this_node_not_the_job_ids():
    """Without a port given, a batch shell's torchrun arguments name a port the kernel finds free here
    (its node is the job's first): another user can neither compute it nor already hold it."""
    import socket

    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1"}
    ports = set()
    for _ in range(3):
        endpoint = next(a for a in distenv.slurm_torchrun_args(env, 2, 1) if a.startswith("--rdzv-endpoint="))
        port = int(endpoint.rsplit(":", 1)[1])
        with socket.socket() as s:  # the oracle: the kernel lets a socket bind it
            s.bind(("localhost", port))
        ports.add(port)
    assert len(ports) == 3
