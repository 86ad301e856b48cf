"""The launcher half and the analysis run where torch cannot be imported (a login node, a laptop): every
command here runs as a process with a `torch` package on its path whose import fails."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from gputrace import write_sweep

SMOKE = str(REPO / "profiles" / "smoke.yaml")


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory):
    """A directory that shadows torch (and torchvision) with packages whose import raises."""
    root = tmp_path_factory.mktemp("no-torch")
    for name in ("torch", "torchvision"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} is made unimportable by the test')\n")
    return root


def run_without_torch(no_torch, *args, cwd=None):
    env = dict(os.environ, PYTHONPATH=f"{no_torch}{os.pathsep}{REPO}")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd or REPO,
                          timeout=120)


def test_the_shadow_really_blocks_torch(no_torch):
    proc = run_without_torch(no_torch, "-c", "import torch")
    assert proc.returncode == 1 and "made unimportable" in proc.stderr


@pytest.mark.parametrize("args", [
    ["-m", "hpc.submit", "--dry-run", "--account", "m1_g", "--nodes", "2", "--gpus", "4", "--config", SMOKE],
    ["-m", "hpc.study", "run", str(REPO / "profiles" / "study.yaml"), "--dry-run", "--account", "m1_g"],
    ["-m", "hpc.study", "run", str(REPO / "profiles" / "study.yaml"), "--account", "m1_g", "--dry-run"],
    ["-m", "hpc.config", "--profile", "perlmutter", "--config", SMOKE],
    ["-m", "hpc.distenv", "--hostlist", "nid[001-004]"],
    ["-m", "hpc.distenv", "--json"],
])
def test_launcher_commands_run_without_torch(no_torch, args, tmp_path):
    proc = run_without_torch(no_torch, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() and not list(tmp_path.iterdir())  # printed, nothing written


def test_study_status_and_analysis_run_without_torch(no_torch, tmp_path):
    sweep = tmp_path / "sweep"
    write_sweep(sweep)
    (sweep / "sweep.yaml").write_text("sweep:\n  name: s\n")
    status = run_without_torch(no_torch, "-m", "hpc.study", "status", str(sweep))
    assert status.returncode == 0 and "2 done" in status.stdout, status.stderr
    analysis = run_without_torch(no_torch, "-m", "analysis", str(sweep), "--report")
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    assert (sweep / "analysis" / "report.html").is_file()
