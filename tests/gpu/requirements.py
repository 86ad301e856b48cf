"""Which of the project's declared dependencies this Python lacks: the GPU proof command installs those
(and only those) from wheels, so the list lives in one place, pyproject.toml's [project] dependencies.

    python tests/gpu/requirements.py [--pyproject FILE]

prints one requirement per line (as declared: `msgspec>=0.18`) for each package that is not
installed, or installed at a version the requirement does not allow. Standard library only, plus
`packaging` where it is importable (pip vendors it), for the version check.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def declared(pyproject: Path) -> list[str]:
    """[project] dependencies of a pyproject.toml, as written."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return declared_from_text(pyproject.read_text())
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def declared_from_text(text: str) -> list[str]:
    """The same read as text, where tomllib is missing: the block is ours, one quoted requirement a line."""
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M)
    return re.findall(r'^\s*"([^"]+)"', block.group(1), re.M) if block else []


def _allows(requirement: str, version: str) -> bool:
    """Whether `version` satisfies `requirement`'s specifier (True where no packaging is importable)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement
        except ImportError:
            return True
    return Requirement(requirement).specifier.contains(version, prereleases=True)


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(requirements: list[str], version_of: Callable[[str], str | None] = installed_version) -> list[str]:
    """The requirements not met by what is installed (absent, or at a version they do not allow)."""
    out = []
    for requirement in requirements:
        name = _NAME.match(requirement)
        if name is None:
            raise ValueError(f"cannot read the requirement {requirement!r}")
        version = version_of(name.group(1))
        if version is None or not _allows(requirement, version):
            out.append(requirement)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    args = parser.parse_args(argv)
    for requirement in missing(declared(args.pyproject)):
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
