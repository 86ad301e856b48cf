"""The project's habits, as CI checks them: ruff's lint and format and mypy's types clean on hpc/ and
analysis/, with the settings in pyproject.toml (the pre-commit hooks run the same commands)."""

import shutil
import subprocess
import sys

import pytest

from conftest import REPO


def tool(name: str) -> list[str]:
    """The tool from this Python's environment (installed by the `test` extra)."""
    found = shutil.which(name, path=str(REPO / ".venv" / "bin")) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' (it is a test dependency)")
    return [found]


@pytest.mark.parametrize("command", [["ruff", "check", "hpc", "analysis"],
                                     ["ruff", "format", "--check", "hpc", "analysis"]])
def test_ruff_is_clean(command):
    proc = subprocess.run(tool(command[0]) + command[1:], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_is_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_pre_commit_runs_the_same_checks():
    config = (REPO / ".pre-commit-config.yaml").read_text()
    for hook in ("ruff check", "ruff format --check", "mypy"):
        assert hook in config, hook
