"""Logging people can tune (hpc/core/logs.py): by default the commands say what they always said; a
level from `--log-level` or HPC_LOG_LEVEL (which a job's ranks inherit) turns it down or up, and at
debug every rank's own lines appear, named; a bad level is one line."""

import socket
import subprocess
import sys
from pathlib import Path

from conftest import assert_one_line_error
from trainrun import SMOKE, train

REPO = Path(__file__).resolve().parents[2]


def args(tmp_path: Path, name: str) -> list[str]:
    return ["--config", SMOKE, "--data-root", str(tmp_path / "data"), "--run-dir", str(tmp_path / name),
            "--max-steps", "4", "--no-profile", "--set", "train.log_every_steps=1"]


def test_by_default_rank_0_says_its_lines_and_the_others_only_where_they_run(tmp_path):
    (r0, out0, _), (r1, out1, _) = train(2, args(tmp_path, "default"))
    assert "step 4/4" in out0 and "training tiny" in out0
    # rank 1 says where it runs, once, and nothing else: its host as this machine names itself, no GPU here
    assert out1.strip().splitlines() == [line for line in out1.splitlines() if line.strip()], out1
    (only,) = out1.strip().splitlines()
    assert only.startswith(f"rank 1 on {socket.gethostname()}: cores ") and only.endswith(", no GPU"), out1


def test_warning_drops_the_progress_lines_and_debug_names_every_ranks_own(tmp_path):
    (_, quiet, _), = train(1, [*args(tmp_path, "quiet"), "--log-level", "warning"])
    assert "step " not in quiet and "training tiny" not in quiet
    assert (tmp_path / "quiet" / "summary.json").is_file()  # quieter, not less done
    (_, out0, _), (_, out1, _) = train(2, args(tmp_path, "loud"), extra_env={"HPC_LOG_LEVEL": "debug"})
    assert "[rank 1] training tiny" in out1 and "step 4/4" in out0 and "[rank 0]" not in out0


def test_a_bad_level_is_one_line_naming_where_it_came_from(tmp_path):
    flag = subprocess.run([sys.executable, "-m", "hpc.train", *args(tmp_path, "bad"), "--log-level", "loud"],
                          capture_output=True, text=True, cwd=REPO)
    assert_one_line_error(flag, "--log-level", "loud")
    env = subprocess.run([sys.executable, "-m", "hpc.config", "--config", SMOKE], capture_output=True, text=True,
                         cwd=REPO, env={**__import__("os").environ, "HPC_LOG_LEVEL": "chatty"})
    assert_one_line_error(env, "HPC_LOG_LEVEL", "chatty")
    assert not (tmp_path / "bad").exists()
