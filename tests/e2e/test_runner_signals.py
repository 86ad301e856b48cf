"""Every signal a job can get, at the per-rank runner (issue 52). `python -m hpc.rank --run-dir RUN -- SCRIPT`
here, as a batch script or torchrun starts a rank, and `hpc.submit --local`; the signals sent as Slurm or a
person would. The script (tests/scripts/bypass_sigterm.py, no torch) stops as Lightning's loop does:
SIGTERM bypassed, the loop ended early, exit 0 unfinished; it prints each signal that reaches it, and
"finished" only when it ran to its end: the oracle for "done". The same on Slurm:
tests/e2e/test_runner_signals_slurm.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.core.rundir import RunPaths
from hpc.core.summary import write_run_summary

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "bypass_sigterm.py"
PY = sys.executable
ENV = dict(os.environ, PATH=f"{Path(PY).parent}:{os.environ['PATH']}")
ENV.pop("HPC_RUN_DIR", None)


def wait_for(path: Path, needle: str, timeout_s: float = 60) -> str:
    """The file's text once it holds `needle` (the script's own progress, not a clock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never in {path}: {path.read_text() if path.exists() else '(none)'}")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def script_pids(out: str) -> list[int]:
    return [int(p) for p in re.findall(r"started, pid (\d+)", out)]


def start_rank(run: Path, *script_args: str) -> subprocess.Popen:
    proc = subprocess.Popen([PY, "-m", "hpc.rank", "--run-dir", str(run), "--", PY, str(SCRIPT), *script_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=run.parent)
    wait_for(run / "logs" / "rank0.out", "started")
    return proc


def test_every_signal_leaves_the_runner_alive_and_an_unfinished_exit_0_is_stopped(tmp_path):
    run = tmp_path / "run"
    proc = start_rank(run)
    out = run / "logs" / "rank0.out"
    for sig in (signal.SIGUSR1, signal.SIGQUIT):  # not stops: passed on as they came, the runner lives on
        proc.send_signal(sig)
        wait_for(out, f"got {sig.name}")
        assert proc.poll() is None
    proc.send_signal(signal.SIGHUP)  # a closed terminal: a stop, passed on as SIGTERM
    stdout, stderr = proc.communicate(timeout=60)
    said = out.read_text()
    assert "got SIGTERM: Bypassing SIGTERM" in said and "stopping early" in said and "finished" not in said
    assert proc.returncode == 3, stderr  # stopped: the requeue code, as a saved stop
    record = json.loads((run / "ranks" / "rank0.exit.json").read_text())
    assert (record["kind"], record["exit_code"]) == ("stopped", 0)
    assert record["signals_passed_on"] == ["SIGUSR1", "SIGQUIT"]
    assert record["message"].startswith("exit 0 after SIGHUP, not known to have finished: recorded as stopped")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "stopped"
    lines = [line for line in stderr.splitlines() if "not known to have finished" in line]
    assert len(lines) == 1 and lines[0].startswith("hpc: the command exited 0 after SIGHUP"), stderr
    assert f"hpc.rank: {run}: stopped" in stdout
    assert not any(alive(pid) for pid in script_pids(said))


def test_an_exit_0_after_a_stop_is_done_where_the_task_said_it_finished(tmp_path):
    """The control: a task whose facts say `complete` (as the toolkit's training writes them) is done after a
    stop; here a script that writes that file itself on SIGTERM, then exits 0."""
    run = tmp_path / "run"
    finisher = tmp_path / "finisher.py"
    finisher.write_text(
        "import json, os, signal, sys, time\n"
        "def done(signum, frame):\n"
        f"    open({str(run / 'ranks' / 'rank0.facts.json')!r}, 'w').write(json.dumps({{'rank': 0, 'complete': True}}))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, done)\n"
        "print('started, pid', os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([PY, "-m", "hpc.rank", "--run-dir", str(run), "--", PY, str(finisher)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    wait_for(run / "logs" / "rank0.out", "started")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert json.loads((run / "ranks" / "rank0.exit.json").read_text())["kind"] == "ok"
    assert json.loads((run / "summary.json").read_text())["outcome"] == "done"


def test_the_command_dies_with_its_runner_however_the_runner_dies(tmp_path):
    run = tmp_path / "run"
    proc = start_rank(run)
    (pid,) = script_pids((run / "logs" / "rank0.out").read_text())
    proc.kill()  # SIGKILL: no handler of the runner's runs
    proc.wait(timeout=30)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"the command (pid {pid}) outlived its runner"
    # its record still says running; once the job's step has ended (the batch shell's summary, hpc.submit's)
    # the rank is lost, and the run preempted, not running
    assert json.loads((run / "ranks" / "rank0.exit.json").read_text())["kind"] == "running"
    summary = write_run_summary(RunPaths(run), ended=True)
    assert summary.outcome == "preempted" and summary.ranks[0].kind == "lost"
    assert "its runner ended without recording" in summary.ranks[0].message


@pytest.mark.slow
def test_a_closed_terminal_stops_a_local_run_and_nothing_is_left(tmp_path):
    """hpc.submit --local, two ranks, SIGHUP to it (its terminal closed): each rank's script is told to stop
    (SIGTERM), exits 0 unfinished, and the run is stopped, not done; no script is left running."""
    proc = subprocess.Popen([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--runs-dir", str(tmp_path), "--",
                             PY, str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=ENV)
    deadline = time.monotonic() + 120
    while len(outs := list(tmp_path.glob("*/*/logs/rank*.out"))) < 2 or not all("started" in o.read_text()
                                                                                  for o in outs):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    stdout, stderr = proc.communicate(timeout=120)
    (run,) = {o.parent.parent for o in outs}
    said = [o.read_text() for o in sorted(outs)]
    assert all("Bypassing SIGTERM" in s and "finished" not in s for s in said), said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "stopped", stdout + stderr
    assert [(r["kind"], r["exit_code"]) for r in summary["ranks"]] == [("stopped", 0)] * 2
    assert stderr.count("hpc: stopped (SIGHUP): the command was told to stop (SIGTERM)") == 1, stderr
    assert not any(alive(pid) for s in said for pid in script_pids(s))


# The runner's door run as `python -m hpc.rank` does, with SIGUSR2 sent to itself the moment its launcher
# module starts to import: a signal during the runner's imports, on time every time.
SIGNAL_IN_IMPORT = """import importlib.abc, os, runpy, signal, sys
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "hpc.launch.rank.rankcli":
            os.kill(os.getpid(), signal.SIGUSR2)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["hpc.rank", *sys.argv[1:]]
runpy.run_module("hpc.rank", run_name="__main__", alter_sys=True)
"""


def test_a_stop_signal_in_the_runners_start_up_is_a_clean_stop_not_its_death(tmp_path):
    """A time limit's warning (SIGUSR2) that lands while the runner is still importing (seconds on a loaded
    node): once its death (exit -12, no rank started; seen in CI as a Slurm job's exit 140); now caught from
    its door's first line, the command is started and stopped and the run recorded. The oracle is the
    process's own exit."""
    run = tmp_path / "run"
    proc = subprocess.run([PY, "-c", SIGNAL_IN_IMPORT, "--run-dir", str(run), "--no-profile", "--", PY, "-c",
                           "import time; time.sleep(30)"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode != -signal.SIGUSR2, proc.stderr
    assert f"hpc.rank: {run}: preempted" in proc.stdout, proc.stdout + proc.stderr
    record = json.loads(RunPaths(run).rank_exit(0).read_text())
    assert "after SIGUSR2" in record["message"] and record["ended_ns"], record
