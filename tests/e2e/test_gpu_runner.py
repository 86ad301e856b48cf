"""The GPU proof command's dependencies (tests/gpu/run.sh), checked on the CPU: it installs what
pyproject.toml declares and the GPU machine lacks, from wheels, and stops with exit 2 before any phase
when one has no wheel; and every package the code imports is declared, so that list is the whole list."""

import ast
import importlib.metadata
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "gpu"))
import requirements  # noqa: E402

# Imported only to work with a declared package's own API or internals, and installed with it.
COMES_WITH = {"PIL": "torchvision", "werkzeug": "tensorboard"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_declared_reads_pyproject_with_and_without_tomllib():
    listed = requirements.declared(REPO / "pyproject.toml")
    assert "msgspec>=0.18" in listed and "isal>=1.6" in listed and any(r.startswith("submitit") for r in listed)
    assert requirements.declared_from_text((REPO / "pyproject.toml").read_text()) == listed


def test_missing_names_what_is_absent_or_too_old():
    versions = {"msgspec": "0.17.0", "isal": "1.7.0", "torch": "2.11.0"}
    assert requirements.missing(["msgspec>=0.18", "isal>=1.6", "torch>=2.4", "submitit>=1.5"], versions.get) == [
        "msgspec>=0.18", "submitit>=1.5"]


def third_party_imports() -> set[str]:
    """Top-level names of the non-standard modules that hpc/ and analysis/ import, at any level."""
    found = set()
    for pkg in ("hpc", "analysis"):
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("hpc", "analysis", "__future__")}


# A user's script's own packages: the start-up hook imports them only once the script has (inside a function,
# checked below), to serve that script; the toolkit never needs them installed.
USERS_OWN = {"accelerate": REPO / "hpc" / "training" / "hook" / "scriptaccelerate.py"}


def test_a_users_own_package_is_imported_only_inside_functions():
    for module, path in USERS_OWN.items():
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert module not in names, f"{path.name} imports {module} at its top"
        assert module in third_party_imports()  # the scan sees it, inside a function


def test_every_imported_package_is_declared():
    declared = {_normal(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements.declared(REPO / "pyproject.toml")}
    by_module = importlib.metadata.packages_distributions()
    uncovered = {}
    for module in sorted(third_party_imports() - set(USERS_OWN)):
        dists = {_normal(d) for d in by_module.get(module, [module])}
        if not dists & declared and COMES_WITH.get(module) not in declared:
            uncovered[module] = sorted(dists)
    assert not uncovered, f"imported but not in pyproject.toml's dependencies: {uncovered}"
    assert {"msgspec", "isal", "numpy", "yaml", "submitit"} <= third_party_imports()  # the scan sees them


def test_a_dependency_without_a_wheel_stops_before_any_phase(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = [\n    "hpc-no-such-package>=1",\n]\n')
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HPC_PYPROJECT": str(pyproject),
           "HPC_WHEELS": str(tmp_path / "no-wheels"), "HPC_GPU_SITE": str(tmp_path / "site")}
    proc = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "run.sh"), str(out)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "missing hpc-no-such-package>=1 and no wheels for them" in proc.stderr
    assert not out.exists()  # no phase ran, nothing was written


@pytest.mark.parametrize("pyproject", ["pyproject.toml"])
def test_with_everything_installed_nothing_is_missing(pyproject):
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "requirements.py"), "--pyproject",
                           str(REPO / pyproject)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
