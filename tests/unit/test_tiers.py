"""The suite's own guard (tests/tiers.py): in CI a tier that cannot run, or whose tests all skip, fails the
run and says which. Checked on small suites run by a real pytest in a subprocess, whose tests pass or
skip by construction."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from tiers import Tiers

def pytest_configure(config):
    for name in ("slurm", "browser", "traces", "gpu"):
        config.addinivalue_line("markers", name + ": a tier")
    config.pluginmanager.register(Tiers(lambda: {{why!r}}), "tiers")
"""

SUITE = """
import pytest

def test_plain():
    {plain_body}

@pytest.mark.slurm
def test_on_the_cluster():
    {slurm_body}

@pytest.mark.gpu
def test_on_a_gpu():
    pytest.skip("no CUDA GPU")
"""


def run_suite(tmp_path: Path, *, required: bool, slurm_missing: str | None = None,
              slurm_body: str = "assert True", plain_body: str = "assert True",
              env: dict | None = None, workers: int = 0) -> subprocess.CompletedProcess:
    folder = tmp_path / "e2e"
    folder.mkdir(exist_ok=True)  # a test may have put a module of its own there first
    (tmp_path / "conftest.py").write_text(CONFTEST.format(why=slurm_missing))
    (folder / "test_suite.py").write_text(textwrap.dedent(SUITE.format(slurm_body=slurm_body, plain_body=plain_body)))
    env = {"PATH": "/usr/bin:/bin", "HPC_REQUIRE_TIERS": "1" if required else "0", **(env or {})}
    spread = ["-n", str(workers)] if workers else []  # pytest-xdist, as tests/run.sh runs the rest
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *spread, str(folder)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_every_tier_ran_but_the_gpu_one_passes_and_says_the_counts(tmp_path):
    r = run_suite(tmp_path, required=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tiers (tests ran of selected): e2e 2 of 3, slurm 1 of 1, gpu 0 of 1" in r.stdout


@pytest.mark.parametrize("required, code", [(True, 1), (False, 0)])
def test_a_tier_whose_tests_all_skip_fails_the_run_only_when_required(tmp_path, required, code):
    r = run_suite(tmp_path, required=required, slurm_body="pytest.skip('no cluster today')")
    assert r.returncode == code, r.stdout + r.stderr
    assert "tests: every slurm test skipped" in r.stdout
    assert ("that fails the run" in r.stdout) is required
    assert "e2e/test_suite.py::test_on_the_cluster: no cluster today" in r.stdout  # what skipped, and why
    assert "slurm 0 of 1" in r.stdout


def test_a_missing_part_stops_a_required_run_at_once_naming_it(tmp_path):
    r = run_suite(tmp_path, required=True, slurm_missing="Slurm cluster not running (sinfo: refused)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tests: the slurm tier cannot run: Slurm cluster not running (sinfo: refused)" in r.stdout + r.stderr
    assert " passed" not in r.stdout  # stopped before any test ran


def test_a_failing_test_counts_as_run(tmp_path):
    r = run_suite(tmp_path, required=True, slurm_body="assert False, 'broken'")
    assert r.returncode == 1
    assert "slurm 1 of 1" in r.stdout and "every slurm test skipped" not in r.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"CI": "1"}], ids=["CI=true", "CI=1"])
def test_ci_requires_every_tier_whoever_runs_it(tmp_path, env):
    """Issue 53: CI=true, not root, decides: a missing part fails the run as HPC_REQUIRE_TIERS=1 does."""
    r = run_suite(tmp_path, required=False, slurm_missing="no Slurm client on this machine", env=env)
    assert r.returncode == 1 and "tests: the slurm tier cannot run: no Slurm client" in r.stdout + r.stderr


@pytest.mark.parametrize("required, code", [(True, 1), (False, 0)])
def test_one_skipped_test_fails_a_required_run_even_when_its_tier_ran(tmp_path, required, code):
    """Issue 53: a tier that ran is not enough: a single skip outside the gpu tier, unless ALLOWED_SKIPS
    names it, fails a required run; the closing lines say what skipped and why."""
    r = run_suite(tmp_path, required=required, plain_body="pytest.skip('an oracle is not installed')")
    assert r.returncode == code, r.stdout + r.stderr
    said = "not allowed: fails the run" if required else "skipped"
    assert f"skipped ({said}): e2e/test_suite.py::test_plain: an oracle is not installed" in r.stdout
    assert "skipped (skipped): e2e/test_suite.py::test_on_a_gpu: no CUDA GPU" in r.stdout  # the gpu tier may


def test_an_allowed_skip_is_said_with_its_reason_and_passes(tmp_path):
    import tiers

    nodeid, why = tiers.ALLOWED_SKIPS[0]
    assert tiers.allowed(f"tests/e2e/{nodeid}") == why and tiers.allowed("tests/e2e/test_x.py::test_y") is None
    assert len(tiers.ALLOWED_SKIPS) <= 5 and all(len(reason) > 20 for _, reason in tiers.ALLOWED_SKIPS)


SKIPPED_AT_COLLECTION = {
    "module-level skip": "import pytest\npytest.skip('no oracle here', allow_module_level=True)\n\ndef test_x():\n    pass\n",
    "importorskip": "import pytest\npytest.importorskip('a_module_nobody_installed')\n\ndef test_x():\n    pass\n",
}


@pytest.mark.parametrize("how", sorted(SKIPPED_AT_COLLECTION))
@pytest.mark.parametrize("required, code", [(True, 1), (False, 0)])
def test_a_module_skipped_as_it_is_collected_fails_a_required_run(tmp_path, how, required, code):
    """Issue 74: a skip at collection never reaches a test's report; the guard sees the module's own."""
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_hidden.py").write_text(SKIPPED_AT_COLLECTION[how])
    r = run_suite(tmp_path, required=required)
    assert r.returncode == code, r.stdout + r.stderr
    said = "not allowed: fails the run" if required else "skipped"
    assert f"skipped ({said}): e2e/test_hidden.py" in r.stdout, r.stdout


def test_a_module_skipped_in_a_gpu_folder_may_skip(tmp_path):
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "gpu").mkdir()
    (tmp_path / "e2e" / "gpu" / "test_gpu_only.py").write_text(SKIPPED_AT_COLLECTION["module-level skip"])
    r = run_suite(tmp_path, required=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("body", ["", "def helper():\n    return 1\n", "import pytest\nif False:\n    def test_x():\n"
                                                                         "        pass\n"])
def test_a_test_module_that_gives_no_test_fails_a_required_run(tmp_path, body):
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_emptied.py").write_text(body)
    r = run_suite(tmp_path, required=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tests: e2e/test_emptied.py gave no test (fails the run)" in r.stdout


def test_a_folder_pytest_does_not_enter_is_seen(tmp_path):
    """A folder left out by norecursedirs (as a build folder is) whose test modules would never run."""
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "build").mkdir()
    (tmp_path / "e2e" / "build" / "test_left_out.py").write_text("def test_x():\n    pass\n")
    r = run_suite(tmp_path, required=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tests: e2e/build/test_left_out.py gave no test (fails the run)" in r.stdout


def test_under_xdist_the_workers_counts_add_up_and_the_guard_holds(tmp_path):
    """tests/run.sh runs the rest on two xdist workers: the controller judges the run on the workers' summed
    counts, as one process would (a worker alone saw part of the run): the counts line, a tier whose tests all
    skipped, a skip outside the gpu tier and a module that gave no test each fail it."""
    r = run_suite(tmp_path, required=True, workers=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tiers (tests ran of selected): e2e 2 of 3, slurm 1 of 1, gpu 0 of 1" in r.stdout
    r = run_suite(tmp_path, required=True, workers=2, slurm_body="pytest.skip('no cluster today')")
    assert r.returncode == 1 and "tests: every slurm test skipped; that fails the run" in r.stdout, r.stdout
    r = run_suite(tmp_path, required=True, workers=2, plain_body="pytest.skip('an oracle is not installed')")
    assert r.returncode == 1 and "skipped (not allowed: fails the run): e2e/test_suite.py::test_plain" in r.stdout
    (tmp_path / "e2e" / "test_emptied.py").write_text("def helper():\n    return 1\n")
    r = run_suite(tmp_path, required=True, workers=2)
    assert r.returncode == 1 and "tests: e2e/test_emptied.py gave no test (fails the run)" in r.stdout, r.stdout
