"""The toolkit as a user installs it: a built wheel, not the source tree. The profiles ship inside it
(package data), so `--profile perlmutter` works from any directory; the console scripts work too."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, installed into its own directory (no dependencies: the test's environment has them)."""
    tmp = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "wheel"), str(REPO)], check=True, capture_output=True, cwd=tmp)
    (wheel,) = (tmp / "wheel").glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp / "site"),
                    str(wheel)], check=True, capture_output=True)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return tmp / "site", elsewhere


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # The site directory comes first on sys.path, ahead of the editable install of the source tree.
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_installed_package_finds_profiles_by_name_from_another_directory(installed):
    site, elsewhere = installed
    where = run_installed(site, elsewhere, sys.executable, "-c", "import hpc.settings.config as c; print(c.__file__, c.PROFILES_DIR)")
    module_file, profiles_dir = where.stdout.split()
    assert module_file.startswith(str(site)) and profiles_dir == str(site / "hpc" / "profiles"), where.stdout
    proc = run_installed(site, elsewhere, sys.executable, "-m", "hpc.submit", "--profile", "perlmutter", "--dry-run",
                         "--account", "m1234_g", "--nodes", "2", "--gpus", "4", "--config", str(site / "hpc" / "profiles" / "smoke.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --constraint=gpu" in proc.stdout and "#SBATCH --nodes=2" in proc.stdout
    assert sorted(p.name for p in (site / "hpc" / "profiles").glob("*.yaml")) == sorted(
        p.name for p in (REPO / "profiles").glob("*.yaml"))


def test_console_scripts_are_installed_and_share_the_error_path(installed):
    site, elsewhere = installed
    scripts = {p.name for p in (site / "bin").iterdir()}
    assert {"hpc-train", "hpc-submit", "hpc-study", "hpc-config", "hpc-analysis", "hpc-tensorboard"} <= scripts, scripts
    proc = run_installed(site, elsewhere, str(site / "bin" / "hpc-config"), "--profile", "local", "--set",
                         "cluster.max_nodes=0")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hpc.config: error: --set cluster.max_nodes=0: cluster.max_nodes = 0: must be > 0"], proc.stderr
    ok = run_installed(site, elsewhere, str(site / "bin" / "hpc-config"), "--profile", "perlmutter")
    assert ok.returncode == 0 and "constraint: gpu" in ok.stdout, ok.stderr


def test_the_installed_toolkit_profiles_a_command_through_its_own_start_up_hook(installed, tmp_path):
    """The hook folder ships in the wheel (package data, not a package) and is the one put on PYTHONPATH."""
    site, elsewhere = installed
    assert (site / "hpc" / "training" / "hook" / "startup" / "sitecustomize.py").is_file()
    loop = ("import os, sys, torch; m = torch.nn.Linear(4, 4); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for _ in range(8):\n    o.zero_grad(); m(torch.randn(2, 4)).sum().backward(); o.step()\n"
            "print(sys.path[1], [p for p in os.environ['PYTHONPATH'].split(os.pathsep) if 'startup' in p])")
    run = tmp_path / "run"
    proc = run_installed(site, elsewhere, sys.executable, "-m", "hpc.rank", "--run-dir", str(run), "--", sys.executable,
                         "-c", loop)
    assert proc.returncode == 0, proc.stderr
    said = (run / "logs" / "rank0.out").read_text()
    assert str(site / "hpc" / "training" / "hook" / "startup") in said, said
    assert len(list((run / "traces").glob("rank0.*.pt.trace.json"))) == 1
