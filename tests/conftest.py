import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"


def slurm_up() -> str | None:
    """None when the local test cluster answers, else why not."""
    if not shutil.which("sinfo"):
        return "no Slurm client on this machine (tests/slurm/cluster.sh installs it when run as root)"
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"Slurm cluster not running (sinfo: {r.stderr.strip()[:120]}); start it with tests/slurm/cluster.sh"
    idle = [line for line in r.stdout.splitlines() if line.split()[-1].startswith(("idle", "mix", "alloc"))]
    if len(idle) < 2:
        return f"Slurm cluster has fewer than 2 usable nodes: {r.stdout.strip()!r}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = slurm_up()
    if reason:
        pytest.skip(reason)
    return True


def run_module(module: str, *args: str, env: dict | None = None, cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m module args...` as a user would; returns the completed process."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, one line on stderr naming every needle, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
