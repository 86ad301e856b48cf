"""hpc/launch/rank/runner.py: one rank's task run from start to its exit record, in this process. The
oracle is the child itself: the exit code and signal the operating system reports for a command the test
wrote, and the lines it printed, read back from the record, the rank's logs and summary.json."""

import json
import os
import subprocess
import sys

import pytest

from hpc.launch.rank.runner import run_rank
from hpc.settings.rankcommand import user_command

ONE_RANK = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "TORCHELASTIC_RUN_ID": "unit"}


def env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC", "HPC_", "MASTER_"))
            and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")}
    return {**keep, **ONE_RANK}


def run(tmp_path, code: str) -> tuple[dict, dict, subprocess.CompletedProcess]:
    """The runner's record of `code`, its summary, and the same code run plainly (the oracle)."""
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    record = run_rank(user_command([sys.executable, "-c", code], str(tmp_path), None, 5), tmp_path / "run", env()).as_dict()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    return record, summary, plain


def test_a_command_that_ends_well_is_done_and_its_output_kept(tmp_path):
    record, summary, plain = run(tmp_path, "print('hello from the task'); import sys; print('warn', file=sys.stderr)")
    assert plain.returncode == 0
    assert (record["kind"], record["exit_code"], record["signal"]) == ("ok", 0, None)
    assert (tmp_path / "run" / "logs" / "rank0.out").read_text() == plain.stdout
    assert (tmp_path / "run" / "logs" / "rank0.err").read_text() == plain.stderr
    assert summary["outcome"] == "done" and [r["kind"] for r in summary["ranks"]] == ["ok"]


def test_a_failing_command_is_failed_with_its_own_last_line(tmp_path):
    record, summary, plain = run(tmp_path, "import sys; print('first', file=sys.stderr); "
                                           "print('the real reason', file=sys.stderr); sys.exit(7)")
    assert plain.returncode == 7 and record["exit_code"] == 7 and record["kind"] == "failed"
    assert record["message"] == f"exit 7: {plain.stderr.splitlines()[-1]}"
    assert summary["outcome"] == "failed"


def test_exit_3_is_a_command_that_saved_and_stopped(tmp_path):
    record, _, plain = run(tmp_path, "raise SystemExit(3)")
    assert plain.returncode == 3 and (record["kind"], record["exit_code"]) == ("stopped", 3)
    assert record["message"] == "saved and stopped (exit 3)"


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV", "SIGUSR1", "SIGTERM"])
def test_a_command_killed_by_a_signal_is_failed_and_the_signal_named(tmp_path, sig):
    """Issue 87: a plain script ended by a signal from outside (scancel --signal=USR1; it does not handle it) is
    named as ended by the signal, not by the last thing it printed (there: a profiler warning); its own crash
    (SIGSEGV) keeps its last words, which say more."""
    record, _, plain = run(tmp_path, "import os, signal, sys; print('UserWarning: Memory block of unknown size', "
                                     f"file=sys.stderr, flush=True); os.kill(os.getpid(), signal.{sig})")
    assert plain.returncode == -getattr(__import__("signal"), sig)
    assert (record["kind"], record["exit_code"], record["signal"]) == ("failed", None, sig)
    assert record["message"].startswith(f"signal {sig}: ")
    assert ("Memory block" in record["message"]) is (sig == "SIGSEGV"), record["message"]


def test_a_command_that_cannot_start_is_exit_127_and_said(tmp_path):
    missing = tmp_path / "not-a-program"
    record = run_rank(user_command([str(missing)], str(tmp_path), None, 5), tmp_path / "run", env()).as_dict()
    assert (record["kind"], record["exit_code"]) == ("failed", 127) and str(missing) in record["message"]


@pytest.mark.parametrize("executor, code", [("local", 1), ("slurm", 144), (None, 144)])
def test_a_local_tasks_144_is_not_submitits_word_for_start_again(tmp_path, monkeypatch, executor, code):
    """A local run's task process becomes `python -m hpc.rank` (hpc/launch/submission/job.py), whose exit code
    submitit's local controller reads: 144 there means "start every task again". A command's own 144 exits 1
    in a local task, and stays 144 elsewhere; the number is submitit's own."""
    import submitit.local.local as local

    from hpc.launch.rank import rankcli

    assert rankcli.SUBMITIT_LOCAL_REQUEUE == local.LOCAL_REQUEUE_RETURN_CODE
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in {**env(), **({"SUBMITIT_EXECUTOR": executor} if executor else {})}.items():
        monkeypatch.setenv(key, value)
    argv = ["--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c", "raise SystemExit(144)"]
    assert rankcli.main(argv) == code
