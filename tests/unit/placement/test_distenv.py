"""hpc.distenv: hostlists (literal cases; against scontrol in test_hostlist_scontrol) and env mapping."""

import dataclasses
import json

import pytest
from conftest import run_module

from hpc.core.errors import DistEnvError, HostlistError
from hpc.placement import distenv, distenvcli, torchrun
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
    # the cases below read off scontrol on 2026-11-29 (tests/slurm/cluster.sh, Slurm 22.05)
    "[1-2]x[3-4]": ["1x3", "1x4", "2x3", "2x4"],
    "[1-2][3-4]": ["13", "14", "23", "24"],
    "a[1-2]b[3-4]c[5-6]d[7-8]": ["a1b3c5d7", "a1b3c5d8", "a2b3c5d7", "a2b3c5d8", "a1b4c5d7", "a1b4c5d8", "a2b4c5d7",
                                 "a2b4c5d8", "a1b3c6d7", "a1b3c6d8", "a2b3c6d7", "a2b3c6d8", "a1b4c6d7", "a1b4c6d8",
                                 "a2b4c6d7", "a2b4c6d8"],
    "a[1-3,5]b[1-2]": ["a1b1", "a1b2", "a2b1", "a2b2", "a3b1", "a3b2", "a5b1", "a5b2"],
    "a[1][2,3]": ["a12", "a13"],
    "a[1]b[2,3]": ["a1b2", "a1b3"],
    "a[1]b[2, 3] c": ["a1b2", "a1b03", "c"],
    # and these on 2026-11-29, at the edges of the bracket and number parsing
    "a[1X-3]": ["a01", "a02", "a03"],  # text after the low bound goes unchecked when a high one follows
    "a[  +1-2]": ["a0001", "a0002"],  # blanks and a sign count in the width
    "a[40000-40001]": ["a40000", "a40001"],
    "a[40000-40001]b[1]": ["a40000b1", "a40001b1"],
    "a[1-2]b[[3]": ["a[1-2]b[3"],
    "a]b[1,2]": ["a]b]", "2]"],
    "99999999999999999999999": ["00018446744073709551615"],
    "\u00e9" + "9" * 25: ["\u00e9" + "0" * 5 + "18446744073709551615"],
    "a[1 b": ["a]", "b"],
    "a[b[1],2]": ["a[b1", "2]"],
}
SCONTROL_INVALID = ["a[1-2]c", "a[3-1]", "a[]", "a[1-2,]", "a[-1]", "a[x-y]", "a[1-2]]", "a[1-2]-b",
                    "a[1-2]b[3-4]x", "a[0-65536]", "[07-16,000,9 9],pg",
                    # scontrol, 2026-11-29: a first group of more than 65536 hosts in all, each range under it
                    "a[0-40000,0-40000]b[1]", "a[0-65535,0]b[1]", "a[x]b[1]", "a[1]b[x]c[2]",
                    "a[X1]", "a[1x-3]", "a[1--3]", "a[1-2y]", "a[1-2]x]y[3]", "a[]b[1]", "a[3-1]b[1]",
                    "a[0-40000,40001-65536]b[1]", "a[1]x]", "a[1,]x"]
# Our words for Slurm's "Invalid hostlist": which range, or what follows a bracket.
HOSTLIST_ERRORS = {
    "a[1--3]": "invalid range '1--3' in hostlist 'a[1--3]'",
    "a[3-1]b[1]": "invalid range '3-1' in hostlist 'a[3-1]b[1]'",
    "a[0-65536]": "too many hosts in range '0-65536' of hostlist 'a[0-65536]'",
    "a[0-40000,40001-65536]b[1]": "too many hosts in hostlist 'a[0-40000,40001-65536]b[1]'",
    "a[1]x]": "invalid hostlist 'a[1]x]': text after ']' in 'a[1]x]'",
    "a[1,]x": "invalid hostlist 'a[1,]x': text after ']' in 'a[1,]x'",
}


@pytest.mark.parametrize("expr", sorted(SCONTROL_ANSWERS))
def test_hostlist_literal(expr):
    assert expand_hostlist(expr) == SCONTROL_ANSWERS[expr]


@pytest.mark.parametrize("expr", SCONTROL_INVALID)
def test_hostlist_invalid(expr):
    with pytest.raises(HostlistError):
        expand_hostlist(expr)


@pytest.mark.parametrize("expr", sorted(HOSTLIST_ERRORS))
def test_an_invalid_hostlist_is_named_with_the_part_at_fault(expr):
    with pytest.raises(HostlistError) as info:
        expand_hostlist(expr)
    assert str(info.value) == HOSTLIST_ERRORS[expr]


def test_hostlist_large_range_and_limit():
    assert len(expand_hostlist("a[0-65535]")) == 65536
    both = expand_hostlist("a[0-65535]b[1]")  # a first group of exactly 65536: scontrol expands it
    assert (len(both), both[0], both[-1]) == (65536, "a0b1", "a65535b1")


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


SUBMITIT_LOCAL = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "0",
                  "SUBMITIT_LOCAL_LOCALID": "0"}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}


@pytest.mark.parametrize("env, source, needle", [
    (srun_env(7, 0, 3), "slurm step", "SLURM_PROCID=7"),  # rank >= world size
    (srun_env(0, 0, 0, SLURM_NODEID=9), "slurm step", "SLURM_NODEID=9"),
    (srun_env(0, 0, 0, SLURM_NODEID=4), "slurm step", "SLURM_NODEID=4"),  # nodes 0..3: 4 is one past
    ({k: v for k, v in srun_env(0, 0, 0).items() if k != "SLURM_LOCALID"}, "slurm step", "SLURM_LOCALID"),
    (srun_env(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="2(x4)"), "slurm step", "SLURM_STEP_TASKS_PER_NODE"),
    (srun_env(0, 0, 0, SLURM_STEP_NUM_NODES=3), "slurm step", "SLURM_STEP_NUM_NODES=3"),
    (srun_env(0, 0, 0, SLURM_STEP_NODELIST="a[3-1]"), "slurm step", "SLURM_STEP_NODELIST"),
    (srun_env(0, 0, 0, SLURM_PROCID="x"), "slurm step", "SLURM_PROCID='x'"),
    ({k: v for k, v in srun_env(0, 0, 0).items() if not k.endswith("_NODELIST")}, "slurm step",
     "an srun task but SLURM_JOB_NODELIST"),
    ({"RANK": "0"}, "torchrun/env", "RANK is set but WORLD_SIZE not set"),
    ({**TORCHRUN, "RANK": "3"}, "torchrun", "rank 3 not in [0, world size 2)"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "torchrun/env", "WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT not set"),
    ({"WORLD_SIZE": "2"}, "torchrun/env", "set but RANK is not"),
    ({**TORCHRUN, "WORLD_SIZE": "0"}, "torchrun/env", "WORLD_SIZE=0: must be in 1.."),
    ({**TORCHRUN, "LOCAL_RANK": "x"}, "torchrun/env", "LOCAL_RANK='x'"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "0"}, "torchrun/env", "LOCAL_WORLD_SIZE=0"),
    ({**TORCHRUN, "GROUP_RANK": "y"}, "torchrun/env", "GROUP_RANK='y'"),
    ({**TORCHRUN, "MASTER_PORT": "z"}, "torchrun/env", "MASTER_PORT='z'"),
    ({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "w"}, "torchrun/env",
     "TORCHELASTIC_RESTART_COUNT='w'"),
    ({**SUBMITIT_LOCAL, "SUBMITIT_LOCAL_GLOBALID": "2"}, "submitit local", "SUBMITIT_LOCAL_GLOBALID=2"),
    ({**SUBMITIT_LOCAL, "SUBMITIT_LOCAL_GLOBALID": "-1"}, "submitit local", "SUBMITIT_LOCAL_GLOBALID=-1"),
    ({**SUBMITIT_LOCAL, "SUBMITIT_LOCAL_NTASKS": "0"}, "submitit local", "SUBMITIT_LOCAL_NTASKS=0"),
    ({**SUBMITIT_LOCAL, "SUBMITIT_LOCAL_LOCALID": "q"}, "submitit local", "SUBMITIT_LOCAL_LOCALID='q'"),
    ({**SUBMITIT_LOCAL, "MASTER_PORT": "p"}, "submitit local", "MASTER_PORT='p'"),
    ({"SUBMITIT_EXECUTOR": "local"}, "submitit local", "SUBMITIT_EXECUTOR=local but SUBMITIT_LOCAL_NTASKS"),
    ({"SUBMITIT_LOCAL_NTASKS": "2"}, "submitit local", "SUBMITIT_LOCAL_NTASKS is set but SUBMITIT_LOCAL_GLOBALID"),
    ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1", "MASTER_PORT": "v"}, "slurm batch", "MASTER_PORT='v'"),
    ({"MASTER_PORT": "u"}, "single", "MASTER_PORT='u'"),
])
def test_inconsistent_environments_are_named(env, source, needle):
    """One line that names where the values came from (the launcher read) and the value that is wrong."""
    with pytest.raises(DistEnvError) as info:
        from_environ(env)
    assert str(info.value).startswith(f"{source}: ") and needle in str(info.value), str(info.value)


@pytest.mark.parametrize("env, place", [
    (TORCHRUN, (0, 2, 0, 2, 0, 1, "a", 1, "torchrun")),  # one node: LOCAL_WORLD_SIZE is the world's
    ({**TORCHRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"},
     (5, 8, 1, 4, 1, 2, "a", 1, "torchrun")),  # node from RANK // LOCAL_WORLD_SIZE
    ({**TORCHRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "3"},
     (5, 8, 1, 4, 3, 4, "a", 1, "torchrun")),  # GROUP_RANK wins, and the nodes count it
    ({**TORCHRUN, "LOCAL_RANK": "1"}, (0, 2, 1, 2, 0, 1, "a", 1, "torchrun")),
    ({"RANK": "0", "WORLD_SIZE": "1"}, (0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "torchrun")),  # a world of one
    ({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "m",
      "MASTER_PORT": "9"}, (2, 3, 0, 2, 1, 2, "m", 9, "torchrun")),  # 3 over 2 a node: counted from its node
    ({**TORCHRUN, "HPC_RANK_LAUNCHER": "torchrun-agent"}, (0, 2, 0, 2, 0, 1, "a", 1, "torchrun-agent")),
    (SUBMITIT_LOCAL, (0, 2, 0, 2, 0, 1, "127.0.0.1", None, "submitit-local")),
    ({"SUBMITIT_LOCAL_NTASKS": "3", "SUBMITIT_LOCAL_GLOBALID": "2", "SUBMITIT_LOCAL_LOCALID": "2",
      "MASTER_ADDR": "h", "HPC_MASTER_PORT": "77"}, (2, 3, 2, 3, 0, 1, "h", 77, "submitit-local")),
    ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[4-5]"}, (0, 1, 0, 1, 0, 1, "n4", None, "slurm-batch")),
    ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[4-5]", "MASTER_ADDR": "x", "MASTER_PORT": "3"},
     (0, 1, 0, 1, 0, 1, "x", 3, "slurm-batch")),
    ({"SLURM_JOB_ID": "5", "SLURM_STEPID": "0", "SLURM_JOB_NODELIST": "n[4-5]", "SLURM_NTASKS": "1",
      "SLURM_STEP_NODELIST": "n4", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
      "SLURM_NODEID": "0"}, (0, 1, 0, 1, 0, 1, "n4", None, "slurm")),  # SLURM_STEPID alone marks a step
    ({}, (0, 1, 0, 1, 0, 1, "127.0.0.1", None, "single")),
    ({"MASTER_ADDR": "s", "MASTER_PORT": "2"}, (0, 1, 0, 1, 0, 1, "s", 2, "single")),
    ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}, (0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "torchrun")),
])
def test_each_launchers_variables_give_the_ranks_place(env, place):
    """(rank, world size, local rank, local world size, node rank, nodes, master address and port, launcher),
    worked out from each launcher's documented variables."""
    d = from_environ(env)
    got = (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank, d.num_nodes, d.master_addr,
           d.master_port, d.launcher)
    assert got == place


def test_a_lone_local_rank_is_torchruns_and_asks_for_its_rank():
    with pytest.raises(DistEnvError, match="^torchrun/env: "):
        from_environ({"LOCAL_RANK": "0"})


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


@pytest.mark.parametrize("argv, env, code, out", [
    (["--hostlist", "n[1-2],m"], {}, 0, "n1\nn2\nm\n"),
    (["--hostlist", "au[008-10,2-0,3]gax[0007]g3[100]"], {}, 0, ""),  # no host: nothing printed (as scontrol show hostnames)
    (["--hostlist", ""], {}, 2, ""),  # an empty value is no hostlist
    (["--hostlist", "n[3-1]"], {}, 2, ""),
    (["--torchrun-args", "4"], {}, 2, ""),  # outside a Slurm job
    (["--torchrun-args", "0"], {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "nid001"}, 2, ""),
    ([], srun_env(4, 0, 2, MASTER_PORT=40001),
     0, "export RANK=4\nexport WORLD_SIZE=7\nexport LOCAL_RANK=0\nexport LOCAL_WORLD_SIZE=2\n"),
    ([], {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "nid001", "MASTER_PORT": "4000"},
     0, "export MASTER_ADDR=nid001\nexport MASTER_PORT=4000\n"),  # a batch shell: only the rendezvous
])
def test_the_command_in_process(monkeypatch, capsys, argv, env, code, out):
    """hpc.distenv's main as `python -m hpc.distenv` runs it (the subprocess tests above and in
    test_bad_input.py see the same): its output, and one line with exit 2 on bad input."""
    monkeypatch.setattr(distenvcli.os, "environ", env)
    assert distenvcli.cli(argv) == code
    got = capsys.readouterr()
    assert got.out.startswith(out) if out else got.out == ""
    if code:
        assert got.err.startswith("hpc.distenv: error: ") and got.err.count("\n") == 1, got.err


def test_the_command_picks_the_batch_shells_port_and_gives_torchruns_arguments(monkeypatch, capsys):
    batch = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_NNODES": "2"}
    monkeypatch.setattr(distenvcli.os, "environ", batch)
    assert distenvcli.cli([]) == 0
    addr, port = capsys.readouterr().out.splitlines()
    assert addr == "export MASTER_ADDR=nid001" and 1 <= int(port.removeprefix("export MASTER_PORT=")) <= 65535
    assert distenvcli.cli(["--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["launcher"], said["master_addr"], said["master_port"], said["world_size"]) == (
        "slurm-batch", "nid001", None, 1)  # --json says what the variables say: no port picked
    assert distenvcli.cli(["--torchrun-args", "4", "--max-restarts", "0"]) == 0
    words = capsys.readouterr().out.split()
    assert words[:3] == ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d"]
    assert words[3].startswith("--rdzv-endpoint=nid001:") and words[4:6] == ["--rdzv-id=5", "--max-restarts=0"]
    assert distenvcli.cli(["--torchrun-args", "4"]) == 0
    assert "--max-restarts=3" in capsys.readouterr().out.split()  # torchrun's own default, ours too


@pytest.mark.parametrize("fields, bad", [
    ((3, 4, 1, 2, 1, 2, 29500), None),  # the last of each: rank 3 of 4, local 1 of 2, node 1 of 2
    ((4, 4, 0, 2, 0, 2, 29500), "rank 4 not in [0, world size 4)"),
    ((0, 4, 2, 2, 0, 2, 29500), "local rank 2 not in [0, local world size 2)"),
    ((0, 4, 0, 2, 2, 2, 29500), "node rank 2 not in [0, 2)"),
    ((0, 4, 0, 2, 0, 2, 65535), None), ((0, 4, 0, 2, 0, 2, 1), None),
    ((0, 4, 0, 2, 0, 2, 65536), "master port 65536 out of range"),
    ((0, 4, 0, 2, 0, 2, 0), "master port 0 out of range"),
])
def test_a_place_is_checked_at_each_edge(fields, bad):
    rank, world, local, local_world, node, nodes, port = fields
    make = lambda: distenv.DistEnv(rank, world, local, local_world, node, nodes, "h", port, "torchrun")  # noqa: E731
    if bad is None:
        make()
    else:
        with pytest.raises(DistEnvError, match=r"^torchrun: " + bad.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            make()


def test_torchruns_counts_are_whole_numbers_and_its_attempt_is_the_agents():
    d = from_environ({**TORCHRUN, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})  # no LOCAL_WORLD_SIZE
    assert (d.local_world_size, d.num_nodes, d.node_rank) == (2, 2, 1)  # LOCAL_RANK + 1 a node
    assert type(d.num_nodes) is int and type(d.node_rank) is int
    one = from_environ({**TORCHRUN, "LOCAL_WORLD_SIZE": "1", "RANK": "1"})  # one a node: two nodes
    assert (one.local_world_size, one.num_nodes, one.node_rank) == (1, 2, 1)
    agent = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert from_environ({**agent, "TORCHELASTIC_RESTART_COUNT": "2"}).elastic_attempt == 2
    assert from_environ(agent).elastic_attempt == 0
    assert from_environ({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2"}).elastic_attempt is None  # no agent store


def test_an_srun_task_reads_its_steps_counts_before_the_jobs():
    step = srun_env(1, 1, 0, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="nid003", SLURM_STEP_TASKS_PER_NODE="2",
                    SLURM_STEP_NUM_NODES="1", MASTER_ADDR="m0")
    d = from_environ(step)
    assert (d.rank, d.world_size, d.local_world_size, d.num_nodes, d.master_addr) == (1, 2, 2, 1, "m0")
    with pytest.raises(DistEnvError, match=r"^slurm step: SLURM_STEP_NUM_TASKS='x' is not an integer"):
        from_environ({**step, "SLURM_STEP_NUM_TASKS": "x"})
    with pytest.raises(DistEnvError, match=r"^slurm step: SLURM_NNODES=9"):
        from_environ({k: v for k, v in {**step, "SLURM_NNODES": "9"}.items() if k != "SLURM_STEP_NUM_NODES"})
    with pytest.raises(DistEnvError, match=r"^slurm step: SLURM_STEP_ID=0 marks an srun task but SLURM_PROCID"):
        from_environ({k: v for k, v in step.items() if k != "SLURM_PROCID"})
    with pytest.raises(DistEnvError, match=r"^slurm step: SLURM_STEP_TASKS_PER_NODE='2' lists 1 nodes, "
                                           r"SLURM_STEP_NODELIST has 2"):
        from_environ({k: v for k, v in {**step, "SLURM_STEP_NODELIST": "nid[003-004]"}.items()
                      if not k.endswith(("NUM_NODES", "NNODES"))})
    with pytest.raises(DistEnvError, match=r"^slurm step: SLURM_STEP_NUM_NODES=1 but SLURM_STEP_NODELIST="):
        from_environ({**step, "SLURM_STEP_NODELIST": "nid[003-004]"})


@pytest.mark.parametrize("text, parsed", [
    ("12x", (12, "x")), (" \t\n\v\f\r7", (7, "")), ("+5", (5, "")), ("-1", (2**64 - 1, "")),
    ("-0", (0, "")), ("x1", (None, "x1")), ("", (None, "")), ("99999999999999999999999", (2**64 - 1, "")),
    ("  ", (None, "  ")), ("+", (None, "+")),
])
def test_strtoul_as_c_reads_it(text, parsed):
    from hpc.placement.hostlist import _strtoul

    assert _strtoul(text) == parsed


def test_tasks_per_node_at_its_bounds():
    from hpc.placement.hostlist import MAX_COUNT

    assert len(expand_tasks_per_node(f"1(x{MAX_COUNT})")) == MAX_COUNT
    assert expand_tasks_per_node(f"1(x{MAX_COUNT - 1}),3")[-1] == 3
    long = "2(x3)," * 20 + "z"
    for expr, said in [
        (f"1(x{MAX_COUNT + 1})", f"repeat count {MAX_COUNT + 1} makes more than {MAX_COUNT} nodes"),
        (f"1,1(x{MAX_COUNT})", f"repeat count {MAX_COUNT} makes more than {MAX_COUNT} nodes"),
        ("1(x0)", "repeat count 0 must be >= 1"),
        ("-1", "expected counts like '2(x3),1'"),
        (long, "cannot parse 'z'"),
        (f"1(x{MAX_COUNT}),1(x1)", f"repeat count 1 makes more than {MAX_COUNT} nodes"),  # one past, by one
        ("2(x3)," * 20 + "1(x0)", "repeat count 0 must be >= 1"),  # the list quoted to 80 characters
        ("2(x3)," * 20 + f"1(x{MAX_COUNT})", f"repeat count {MAX_COUNT} makes more than {MAX_COUNT} nodes"),
        ("2(x3)," * 20 + "-1", "expected counts like '2(x3),1'"),
        ("1," + "z" * 50, f"cannot parse {'z' * 40!r}"),  # the part quoted to 40 characters
    ]:
        with pytest.raises(DistEnvError) as info:
            expand_tasks_per_node(expr)
        assert str(info.value) == f"SLURM_TASKS_PER_NODE={expr[:80]!r}: {said}", str(info.value)


@pytest.mark.parametrize("env, message", [
    ({**TORCHRUN, "RANK": "r"}, "torchrun/env: RANK='r' is not an integer"),  # read for the node's rank
    ({**TORCHRUN, "RANK": "r", "GROUP_RANK": "0"}, "torchrun/env: RANK='r' is not an integer"),  # read for the rank
    (srun_env(0, 0, 0, SLURM_STEP_NUM_NODES="x"), "slurm step: SLURM_STEP_NUM_NODES='x' is not an integer"),
    (srun_env(0, 0, 0, SLURM_NODEID="x"), "slurm step: SLURM_NODEID='x' is not an integer"),
    (srun_env(0, 0, 0, SLURM_LOCALID="x"), "slurm step: SLURM_LOCALID='x' is not an integer"),
    (srun_env(0, 0, 0, MASTER_PORT="p"), "slurm step: MASTER_PORT='p' is not an integer"),
    (srun_env(0, 0, 0, MASTER_PORT="0"), "slurm step: MASTER_PORT=0: must be in 1..1048576"),
    (srun_env(0, 0, 0, SLURM_NTASKS="0"), "slurm step: SLURM_NTASKS=0: must be in 1..1048576"),
    ({**SUBMITIT_LOCAL, "SUBMITIT_LOCAL_NTASKS": "0"}, "submitit local: SUBMITIT_LOCAL_NTASKS=0: must be in 1..1048576"),
])
def test_each_value_read_is_named_with_its_launcher(env, message):
    with pytest.raises(DistEnvError) as info:
        from_environ(env)
    assert str(info.value) == message


@pytest.mark.parametrize("env, place", [
    ({"RANK": "", "WORLD_SIZE": ""}, (0, 1, 0, 1, 0, 1, "127.0.0.1", None, "single")),  # set empty: not set
    ({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "", "SLURM_STEPID": ""},
     (0, 1, 0, 1, 0, 1, "127.0.0.1", None, "slurm-batch")),  # no step, no node list: this machine
    ({"MASTER_ADDR": "s", "MASTER_PORT": "1"}, (0, 1, 0, 1, 0, 1, "s", 1, "single")),  # port 1 is a port
    ({"SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0"},
     (0, 1, 0, 1, 0, 1, "127.0.0.1", None, "submitit-local")),  # a world of one
    ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "m", "MASTER_PORT": "9"},
     (0, 8, 0, 4, 0, 2, "m", 9, "torchrun")),  # 8 over 4 a node: 2 nodes, counted from rank 0 too
    ({"RANK": "0", "WORLD_SIZE": "7", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "9"},
     (0, 7, 0, 2, 0, 1, "m", 9, "torchrun")),  # uneven: the nodes seen so far (its own)
])
def test_edges_of_each_launchers_variables(env, place):
    test_each_launchers_variables_give_the_ranks_place(env, place)


def test_a_count_is_read_as_a_bounded_integer():
    from hpc.placement.hostlist import MAX_COUNT

    assert distenv.env_int({"K": str(MAX_COUNT)}, "K", "src") == MAX_COUNT
    assert distenv.env_int({"K": " 7 "}, "K", "src") == 7
    cases = {
        "": "src: K is not set",
        str(MAX_COUNT + 1): f"src: K={MAX_COUNT + 1}: must be in 0..{MAX_COUNT}",
        "9" * 31: f"src: K={'9' * 31}: must be in 0..{MAX_COUNT}",  # parsed, then out of range
        "9" * 32: f"src: K={'9' * 32!r} is not an integer",  # too long to parse: bounded time
        "x" * 50: f"src: K={'x' * 40!r} is not an integer",  # the value quoted to 40 characters
    }
    for value, message in cases.items():
        with pytest.raises(DistEnvError) as info:
            distenv.env_int({"K": value}, "K", "src")
        assert str(info.value) == message
    with pytest.raises(DistEnvError, match="^src: K is not set$"):
        distenv.env_int({}, "K", "src")


def test_a_task_without_a_port_is_told_where_to_get_one():
    with pytest.raises(DistEnvError) as info:
        export_lines(from_environ(srun_env(4, 0, 2)))
    assert str(info.value) == ('slurm: MASTER_PORT is not set: export it from the batch script first '
                               '(eval "$(python -m hpc.distenv)" there picks a free port of the first node)')


def test_torchruns_arguments_at_their_edges():
    from hpc.core.errors import StoreError

    with pytest.raises(DistEnvError) as info:
        distenv.slurm_torchrun_args({}, 4, 3)
    assert str(info.value) == "--torchrun-args: SLURM_JOB_ID is not set (run it inside a Slurm job)"
    for nproc, restarts in ((0, 0), (1, -1)):
        with pytest.raises(DistEnvError) as info:
            distenv.slurm_torchrun_args({"SLURM_JOB_ID": "1"}, nproc, restarts)
        assert str(info.value) == f"--torchrun-args {nproc} --max-restarts {restarts}: must be >= 1 and >= 0"
    one = distenv.slurm_torchrun_args({"SLURM_JOB_ID": "1"}, 1, 0, port=5)  # no node list: this machine
    assert one[:6] == ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:5",
                       "--rdzv-id=1", "--max-restarts=0"]
    assert one[6:] == (["--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"]
                       if torchrun.torchrun_forwards_signals() else [])
    three = distenv.slurm_torchrun_args({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-3]"}, 1, 0, port=5)
    assert three[0] == "--nnodes=3"  # counted from the node list where SLURM_NNODES is not set
    with pytest.raises(DistEnvError) as info:
        distenv.slurm_torchrun_args({"SLURM_JOB_ID": "1", "SLURM_NNODES": "x"}, 1, 0, port=5)
    assert str(info.value) == "slurm: SLURM_NNODES='x' is not an integer"
    # no port given: a free one of the first node, which must be this one (the batch shell runs there)
    with pytest.raises(StoreError, match="^MASTER_ADDR '192.0.2.1': not an address of this node"):
        distenv.slurm_torchrun_args({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "192.0.2.1"}, 1, 0)
