"""Perlmutter's practices as the profile states them (issue 29), each a pure function tested on literal
values: accounts and their rule, the shared QOS and what a point can be charged, where a rank sits,
the fabric's environment for multi-node jobs only, the container prefix, extra sbatch options, the
NCCL network check on NCCL's own INFO lines, and the batch shell's requeue lines."""

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
from hpc.launch.requeue import KEEP_TEARDOWN, teardown_lines
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


def slurm_stand_ins(bin_dir, srun=None):
    """scontrol (`show job` says Slurm's restart count, RESTARTS; `requeue` is logged, refused with FAIL), sacct
    (the job's state, STATE, as slurmdbd says it: "CANCELLED by 0"), and a stand-in srun where given."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\nif [ "$1" = show ]; then echo "JobId=7 Restarts=${RESTARTS:-0} JobState=RUNNING"; exit 0; fi\n'
        'echo "$@" >> "$LOG"\n[ -z "$FAIL" ] || { echo "scontrol: error: down" >&2; exit 1; }\n')
    (bin_dir / "sacct").write_text('#!/bin/sh\necho "7|${STATE:-RUNNING}"\n')
    if srun is not None:
        (bin_dir / "srun").write_text(srun)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)


def teardown(folder):
    return "\n".join(teardown_lines(folder, shlex.quote(sys.executable), 3))


def test_the_batch_shell_requeues_a_job_whose_run_stopped(tmp_path):
    """The teardown lines run in bash the one requeue executor (python -m hpc.launch.requeue) with stand-in
    Slurm clients: a stopped run is requeued once, a finished one never; a job a person cancelled is never
    requeued; one requeued since this start (Lightning's own) not again; a refusal is one line with
    scontrol's words; the batch shell ends with the step's own exit code."""
    slurm_stand_ins(tmp_path / "bin")
    paths = stopped_run(tmp_path / "7")
    script = teardown(tmp_path / "%j")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "LOG": str(tmp_path / "calls")}
    ok = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert "hpc.submit: job 7 requeued from the batch shell" in ok.stdout.splitlines(), ok.stdout + ok.stderr
    assert (tmp_path / "calls").read_text() == "requeue 7\n"
    assert json.loads(paths.summary.read_text())["outcome"] == "stopped"  # the run's end, written after the step
    subprocess.run(["bash", "-c", script], env={**env, "STATE": "CANCELLED by 0"}, capture_output=True, text=True)
    assert (tmp_path / "calls").read_text() == "requeue 7\n"  # cancelled: not requeued
    again = subprocess.run(["bash", "-c", script], env={**env, "RESTARTS": "1"}, capture_output=True, text=True)
    assert (tmp_path / "calls").read_text() == "requeue 7\n"  # requeued since this start: not again
    assert "hpc.submit: job 7 was requeued already since this start (by its task: Lightning requeues its job on " \
           "SIGUSR1): not again" in again.stdout.splitlines()
    failed = subprocess.run(["bash", "-c", script], env={**env, "FAIL": "1"}, capture_output=True, text=True)
    assert failed.stderr.strip() == (f"hpc.submit: job 7 could not requeue itself (scontrol: scontrol: error: down); "
                                     f"its checkpoint stays in {tmp_path / '7'}: resubmit the same command to resume it")
    stopped_run(tmp_path / "8", kind=RankEnd.OK, exit_code=0)
    subprocess.run(["bash", "-c", script], env={**env, "SLURM_JOB_ID": "8"}, capture_output=True, text=True)
    assert (tmp_path / "calls").read_text() == "requeue 7\nrequeue 7\n"  # the refused one; nothing for a done run
    # the batch shell ends with the step's own exit code: Slurm records a failed step's job as FAILED
    for step, code in (("true", 0), ("exit_with() { return 5; }; exit_with", 5)):
        assert subprocess.run(["bash", "-c", f"{step}\n{script}"], env={**env, "SLURM_JOB_ID": "8"}).returncode == code


def test_a_requeue_command_that_cannot_run_is_one_line(tmp_path):
    """No interpreter where the submitter's was (a venv removed since): one line, and the step's code."""
    slurm_stand_ins(tmp_path / "bin")
    stopped_run(tmp_path / "7")
    script = "\n".join(teardown_lines(tmp_path / "%j", str(tmp_path / "gone" / "python"), 3))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "LOG": str(tmp_path / "calls")}
    out = subprocess.run(["bash", "-c", f"false\n{script}"], env=env, capture_output=True, text=True)
    said = [line for line in out.stderr.splitlines() if line.startswith("hpc.submit:")]
    assert said == ["hpc.submit: job 7: its requeue command could not run (exit 127): not requeued; resubmit the "
                    "point to resume it"] and out.returncode == 1, out.stderr
    assert not (tmp_path / "calls").exists()


@pytest.mark.parametrize("records", [True, False])
def test_the_batch_shell_outlives_a_sigterm_to_requeue_after_its_step(tmp_path, records):
    """A preemption signals the batch shell too: with the line before the step, bash waits for its step
    (a stand-in srun that ends 1 s after the signal) and then runs the teardown, which requeues the job:
    from the ranks' records (they saved and stopped), or without any (srun killed its tasks: 143) because
    the shell says it got SIGTERM. Without the line bash dies of it (the check)."""
    end = "exit 0" if records else "exit 143"
    slurm_stand_ins(tmp_path / "bin", f'#!/bin/sh\ntrap \'sleep 1; {end}\' TERM\ntouch "$LOG.step"\n'
                                      'while :; do sleep 0.1; done\n')
    stopped_run(tmp_path / "7", ranks=2 if records else 0)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "LOG": str(tmp_path / "calls")}
    for kept in (True, False):
        (tmp_path / "calls").unlink(missing_ok=True)
        script = "\n".join([*([KEEP_TEARDOWN] if kept else []), "srun", teardown(tmp_path / "%j")])
        step = tmp_path / "calls.step"
        step.unlink(missing_ok=True)
        shell = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not step.exists():  # the step is running (its trap set)
                assert time.monotonic() < deadline and shell.poll() is None
                time.sleep(0.05)
            os.killpg(shell.pid, signal.SIGTERM)  # Slurm signals every process of the job: bash and srun
            out, err = shell.communicate(timeout=60)
        finally:  # nothing of the test outlives it, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
        requeued = (tmp_path / "calls").exists() and (tmp_path / "calls").read_text() == "requeue 7\n"
        assert requeued is kept, (kept, out, err)
        if kept:
            assert "got SIGTERM: its step ends first" in err and "requeued from the batch shell" in out


@pytest.mark.parametrize("folder, run_dir", [
    ("runs/%j", "runs/7"), ("runs/fixed", "runs/fixed"), ("a b/%j/x/%j", "a b/7/x/7"),
])
def test_the_batch_shell_finds_the_run_in_any_shape_of_folder(tmp_path, folder, run_dir):
    """submitit fills every %j of its folder with the job's id; a folder without one is the run's own."""
    slurm_stand_ins(tmp_path / "bin")
    stopped_run(tmp_path / run_dir)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "LOG": str(tmp_path / "calls")}
    assert subprocess.run(["bash", "-c", teardown(tmp_path / folder)], env=env, capture_output=True,
                          text=True).returncode == 0
    assert (tmp_path / "calls").read_text() == "requeue 7\n"
