"""Perlmutter's practices as the profile states them (issue 29), each a pure function tested on literal
values: accounts and their rule, the shared QOS and what a point can be charged, where a rank sits,
the fabric's environment for multi-node jobs only, the container prefix, extra sbatch options, the
NCCL network check on NCCL's own INFO lines, and the batch shell's stops and requeue."""

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from hpc.core.ending import RankEnd, RankExit
from hpc.core.errors import ConfigError, DistEnvError, UsageError
from hpc.launch.submission.site import (
    accounts,
    charge_lines,
    container_prefix,
    job_env,
    node_share,
)
from hpc.placement.affinity import cores_text, gpu_index
from hpc.settings.config import load_cluster
from hpc.training.distributed.netcheck import (
    debug_env,
    network_of,
    verdict,
    wants_check,
)
from recordedruns import recorded_run


@pytest.fixture(scope="module")
def pm():
    return load_cluster("perlmutter")


def test_gpu_jobs_are_charged_to_the_gpu_allocation_and_the_analysis_to_the_cpu_one(pm):
    assert accounts(pm, "m1234_g", None) == ("m1234_g", "m1234")
    assert accounts(pm, "m1234_g", "m9999") == ("m1234_g", "m9999")
    with pytest.raises(UsageError, match=r"--account 'm1234': profile 'perlmutter' charges GPU jobs to a GPU "
                                         r"allocation, whose account ends with '_g'.*did you mean m1234_g\?"):
        accounts(pm, "m1234", None)
    with pytest.raises(UsageError, match=r"--analysis-account 'm1234_g': the analysis job runs on a CPU node"):
        accounts(pm, "m1234_g", "m1234_g")
    assert accounts(load_cluster("local"), "anything", None) == ("anything", "anything")  # no rule, no change


def test_partial_nodes_are_shared_and_charged_by_their_share(pm):
    assert [node_share(pm, 1, g) for g in (1, 2, 4)] == [0.25, 0.5, 1.0] and node_share(pm, 2, 4) == 2.0
    # the study: 12 points at each of 1, 2, 4 GPUs, 60 min each at most
    lines = charge_lines(pm, [("shared", 12, 1, 1, 60), ("shared", 12, 1, 2, 60), ("regular", 12, 1, 4, 60)])
    assert lines == ["# qos shared: 24 point(s), at most 9 node-hours at the time limit",
                     "# qos regular: 12 point(s), at most 12 node-hours at the time limit"]


def test_the_fabric_settings_are_for_jobs_that_span_nodes_and_the_gpu_order_for_whole_nodes(pm):
    one = job_env(pm, 1, 4)
    assert one == {"OMP_NUM_THREADS": "8", "HPC_GPU_ORDER": "3,2,1,0"}
    two = job_env(pm, 2, 4)
    assert two["NCCL_NET"] == "AWS Libfabric" and two["FI_CXI_DISABLE_HOST_REGISTER"] == "1"
    assert two["HPC_NCCL_FABRIC"] == "stop" and two["NCCL_SOCKET_IFNAME"] == "hsn"
    assert "HPC_GPU_ORDER" not in job_env(pm, 1, 2)  # a partial node sees only its own GPUs


def test_a_rank_takes_the_gpu_next_to_its_cores():
    env = {"HPC_GPU_ORDER": "3,2,1,0"}
    assert [gpu_index(env, r, 4) for r in range(4)] == [3, 2, 1, 0]
    assert [gpu_index(env, r, 1) for r in range(1)] == [0]  # a shared job's one visible GPU
    assert [gpu_index({}, r, 4) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(DistEnvError, match="HPC_GPU_ORDER='3,x'"):
        gpu_index({"HPC_GPU_ORDER": "3,x"}, 0, 4)
    assert cores_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11" and cores_text([5]) == "5"


def test_the_container_prefix_is_shifter_with_nersc_modules_or_podman_hpc(pm):
    assert container_prefix(pm) == []  # no image: module load pytorch
    with_image = load_cluster("perlmutter", [("cluster.image", "nersc/pytorch:24.08.01", "t")])
    assert container_prefix(with_image) == ["shifter", "--image=nersc/pytorch:24.08.01", "--module=gpu,nccl-plugin"]
    podman = load_cluster("perlmutter", [("cluster.image", "x:1", "t"), ("cluster.container", "podman-hpc", "t")])
    assert container_prefix(podman)[:2] == ["podman-hpc", "run"] and container_prefix(podman)[-1] == "x:1"


def test_the_profiles_sbatch_options_are_checked_like_every_option():
    with pytest.raises(ConfigError, match="sbatch_options.*time-min.*the toolkit's own"):
        load_cluster("perlmutter", [("cluster.sbatch_options", {"time-min": "5"}, "t")])


# NCCL's INIT/NET lines as NCCL 2.18-2.21 write them (format from NCCL's own sources: host:pid:tid [device]
# NCCL INFO ...); made here, not captured on Perlmutter, since no GPU node runs these tests.
FABRIC_LINES = """nid001433:811:811 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to hsn
nid001433:811:811 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.6.0
nid001433:811:811 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid001433:811:811 [0] NCCL INFO Using network AWS Libfabric
nid001433:811:811 [0] NCCL INFO comm 0x55a8 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0
"""
SOCKET_LINES = """nid001433:811:811 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
nid001433:811:811 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.249.16.39<0> [1]hsn1:10.249.16.40<0>
nid001433:811:811 [0] NCCL INFO Using network Socket
"""


def test_the_network_nccl_chose_is_read_from_its_own_lines():
    assert network_of(FABRIC_LINES.splitlines()) == "AWS Libfabric"
    assert network_of(SOCKET_LINES.splitlines()) == "Socket"
    assert network_of(["nothing here"]) is None


def test_sockets_across_nodes_stop_or_warn_as_the_profile_says():
    assert verdict("AWS Libfabric", "stop", 2) is None and verdict("Socket", "stop", 1) is None
    assert verdict("Socket", "off", 2) is None and verdict(None, "stop", 2) is None
    kind, line = verdict("Socket", "stop", 2)
    assert kind == "stop" and "NCCL uses TCP sockets between the 2 nodes" in line and "nccl-plugin" in line
    assert verdict("Socket", "warn", 4)[0] == "warn"
    assert wants_check({"HPC_NCCL_FABRIC": "stop"}, 2) and not wants_check({"HPC_NCCL_FABRIC": "stop"}, 1)
    assert debug_env({"NCCL_DEBUG": "WARN"}, __import__("pathlib").Path("/x"), 0) == {}  # the user's own kept


def stopped_run(run_dir, kind=RankEnd.STOPPED, exit_code=3, ranks=2):
    """A run directory as a stopped job's step leaves it: task.json (a user's command: requeue code 3) and
    each rank's exit record."""
    return recorded_run(run_dir, [RankExit(rank=rank, kind=kind, attempt="7.0.0", world_size=ranks, started_ns=10,
                                           ended_ns=20 + rank, exit_code=exit_code, hostname="nid001")
                                  for rank in range(ranks)])


def slurm_stand_ins(bin_dir, srun):
    """scontrol (`show job` says Slurm's restart count, RESTARTS, and the job's state, JOBSTATE; `requeue` is
    logged, refused with FAIL), scancel (logged), sacct (the job's state, STATE, as slurmdbd says it:
    "CANCELLED by 0"), and a stand-in srun: the batch shell's one step."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\nif [ "$1" = show ]; then echo "JobId=7 JobState=${JOBSTATE:-RUNNING} Reason=None Restarts='
        '${RESTARTS:-0}"; exit 0; fi\necho "scontrol $*" >> "$LOG"\n'
        '[ -z "$FAIL" ] || { echo "scontrol: error: down" >&2; exit 1; }\n')
    (bin_dir / "scancel").write_text('#!/bin/sh\necho "scancel $*" >> "$LOG"\n')
    (bin_dir / "sacct").write_text('#!/bin/sh\necho "7|${STATE:-RUNNING}"\n')
    (bin_dir / "srun").write_text(srun)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)


# A stand-in srun for the batch shell's step: it sends its batch shell (its parent) SIGNAL as Slurm would
# (USR2: the job's warning, --signal=B:USR2@N; TERM: a person's scancel), waits until the warning's SIGTERM
# has been passed on to the tasks (scancel --signal=TERM, logged) or a second, then ends as its tasks did.
STEP = """#!/bin/sh
[ -z "$SIGNAL" ] || kill -s "$SIGNAL" $PPID
for i in 1 2 3 4 5 6 7 8 9 10; do grep -q "^scancel" "$LOG" 2>/dev/null && break; sleep 0.1; done
exit ${STEP_EXIT:-0}
"""


def batch_shell(tmp_path, run, **env):
    """`python -m hpc.batch` as a batch script runs it, on a stopped run's directory, with the stand-ins."""
    shell = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "LOG": str(tmp_path / "calls"),
             "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "HOME": str(tmp_path), **env}
    out = subprocess.run([sys.executable, "-m", "hpc.batch", "--profile", "local", "--run-dir", str(run), "--",
                          "true"], env=shell, capture_output=True, text=True, timeout=120)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    (tmp_path / "calls").unlink(missing_ok=True)
    return out, calls


def test_the_batch_shell_tells_the_warning_to_the_tasks_and_requeues_the_run_that_saved(tmp_path):
    """The job's warning (SIGUSR2 to the batch shell) is passed on to the tasks as the SIGTERM scripts save on,
    and the run that saved is requeued; its job still ends 3 (not done), so an afterok job waits. A refused
    requeue is one line with scontrol's words and the command that resumes the run."""
    slurm_stand_ins(tmp_path / "bin", STEP)
    run = tmp_path / "7"
    paths = stopped_run(run)
    out, calls = batch_shell(tmp_path, run, SIGNAL="USR2")
    assert calls == ["scancel --signal=TERM 7", "scontrol requeue 7"], out.stdout + out.stderr
    assert out.returncode == 3 and "hpc.batch: job 7 requeued from the batch shell" in out.stdout
    assert json.loads(paths.summary.read_text())["outcome"] == "stopped"
    run = tmp_path / "7b"
    stopped_run(run)
    out, calls = batch_shell(tmp_path, run, SIGNAL="USR2", FAIL="1")
    assert calls == ["scancel --signal=TERM 7", "scontrol requeue 7"] and out.returncode == 3
    assert (f"hpc.batch: job 7 could not requeue itself (scontrol: scontrol: error: down); its checkpoint stays; "
            f"resume with: python -m hpc.submit --resume {run}") in out.stderr, out.stderr
    run = tmp_path / "7c"
    stopped_run(run)
    out, calls = batch_shell(tmp_path, run, SIGNAL="USR2", RESTARTS="1")  # requeued since this start (Lightning's)
    assert calls == ["scancel --signal=TERM 7"] and out.returncode == 3
    assert "job 7 was requeued already since this start" in out.stdout


@pytest.mark.parametrize("signal_name, env, said", [
    ("TERM", {}, "job 7 was ended by Slurm (scancel, its time limit or a preemption): not requeued"),
    ("", {}, "job 7 was stopped by a person (scancel --signal: no warning reached its batch shell): not requeued"),
    ("USR2", {"JOBSTATE": "COMPLETING"}, "is being ended by Slurm (JobState COMPLETING"),  # scancel in its teardown
    ("USR2", {"STATE": "CANCELLED by 0"}, "was cancelled (scancel): a person's stop is not requeued"),
])
def test_a_persons_stop_is_never_requeued(tmp_path, signal_name, env, said):
    """A bare SIGTERM to the batch shell (a person's scancel: Slurm ends the job), a stop the tasks alone saw
    (scancel --signal=TERM), and a warning whose job a person cancelled meanwhile: never requeued, the job
    ends 3, and the line names the command that resumes the run. A scancel's run reads cancelled."""
    slurm_stand_ins(tmp_path / "bin", STEP)
    run = tmp_path / "7"
    paths = stopped_run(run)
    out, calls = batch_shell(tmp_path, run, SIGNAL=signal_name, **env)
    assert not [c for c in calls if c.startswith("scontrol requeue")] and out.returncode == 3, out.stdout + out.stderr
    lines = out.stdout + out.stderr
    assert said in lines and f"resume with: python -m hpc.submit --resume {run}" in lines, lines
    assert json.loads(paths.summary.read_text())["outcome"] == ("cancelled" if signal_name == "TERM" else "stopped")


def test_the_batch_shell_ends_its_job_0_only_for_a_run_that_finished(tmp_path):
    """A finished run's job ends 0 whatever srun said; a run that did not finish ends non-zero even where
    every task exited 0 (a script that stopped unfinished after the warning: requeued, and said so): afterok
    holds."""
    slurm_stand_ins(tmp_path / "bin", STEP)
    done = tmp_path / "8"
    stopped_run(done, kind=RankEnd.OK, exit_code=0)
    assert batch_shell(tmp_path, done, STEP_EXIT="0")[0].returncode == 0
    unfinished = tmp_path / "9"
    stopped_run(unfinished, exit_code=0)
    out, calls = batch_shell(tmp_path, unfinished, SIGNAL="USR2", STEP_EXIT="0")
    assert out.returncode == 3 and calls == ["scancel --signal=TERM 7", "scontrol requeue 7"], out.stdout + out.stderr
    assert "else it starts again from its first step; a script says it saved by exiting 3" in out.stderr


def test_a_preemption_is_left_to_slurm_which_requeues_it(tmp_path):
    """A preemption's grace time: only the tasks get SIGTERM, as after a person's `scancel --signal=TERM`,
    but scontrol says PreemptTime (seen on the test cluster). The batch shell then neither decides nor
    requeues: it waits for Slurm's end of the job (here the stand-in scontrol sends it at once), which
    requeued it (Restarts 1): not recorded as a cancel, not requeued a second time."""
    slurm_stand_ins(tmp_path / "bin", STEP)
    (tmp_path / "bin" / "scontrol").write_text(
        '#!/bin/sh\nif [ "$1" = show ]; then n=$(cat "$LOG.n" 2>/dev/null || echo 0); echo $((n + 1)) > "$LOG.n"\n'
        '  if [ "$n" = 0 ]; then echo "JobId=7 JobState=RUNNING Reason=None Restarts=0 PreemptTime=2026-12-06T20:37:08"; '
        'kill -s TERM $PPID\n  else echo "JobId=7 JobState=COMPLETING Reason=None Restarts=1 PreemptTime=None"; fi; exit 0; fi\n'
        'echo "scontrol $*" >> "$LOG"\n')
    run = tmp_path / "7"
    paths = stopped_run(run)
    out, calls = batch_shell(tmp_path, run)
    lines = out.stdout + out.stderr
    assert not [c for c in calls if c.startswith("scontrol requeue")] and out.returncode == 3, lines
    assert "job 7 is being preempted (Slurm's PreemptTime is set)" in lines, lines
    assert "job 7 was requeued already since this start" in lines, lines
    assert json.loads(paths.summary.read_text())["outcome"] == "stopped"  # not cancelled: Slurm requeued it
