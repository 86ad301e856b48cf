"""The suite's tiers, counted, so that none can vanish in silence (a pytest plugin, loaded by conftest.py).

A test belongs to `unit` or `e2e` by its folder, and also to each tier whose part it needs, by marker:
`slurm` (the local cluster), `browser` (Debian's chromium and its driver), `traces` (../shared/traces),
`gpu` (a CUDA GPU). The run ends with one line of how many tests of each tier ran.

With HPC_REQUIRE_TIERS=1 (tests/run.sh sets it when it runs as root, as CI does, because root can provide
every part but a GPU): a part missing for a selected tier stops the run at once, saying which, and a
tier other than `gpu` whose selected tests all skipped fails the run. Without it, a missing part skips
its tests, saying why (a laptop without Slurm still runs the rest).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"
NEEDS = ("slurm", "browser", "traces", "gpu")  # the tiers that need a part this machine may lack
REQUIRED = "HPC_REQUIRE_TIERS"


def required() -> bool:
    return os.environ.get(REQUIRED) == "1"


def traces_missing() -> str | None:
    return None if SHARED_TRACES.is_dir() else f"real traces not found at {SHARED_TRACES} (shared/ beside the checkout)"


def browser_missing() -> str | None:
    absent = [name for name in ("chromium", "chromedriver") if not shutil.which(name)]
    if absent:
        return f"{' and '.join(absent)} not installed (tests/run.sh installs Debian's chromium and chromium-driver as root)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e .[test])"
    return None


def tiers_of(item: pytest.Item) -> list[str]:
    folder = Path(str(item.path)).parent.name
    own = [folder] if folder in ("unit", "e2e") else []
    return own + [name for name in NEEDS if item.get_closest_marker(name) is not None]


class Tiers:
    """Counts, per tier, the selected tests and those that ran (passed or failed, not skipped)."""

    def __init__(self, slurm_missing: Callable[[], str | None]):
        self.missing = {"slurm": slurm_missing, "browser": browser_missing, "traces": traces_missing}
        self.of: dict[str, list[str]] = {}
        self.selected: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()

    @pytest.hookimpl(trylast=True)  # after -k and -m have deselected
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            self.of[item.nodeid] = tiers_of(item)
            self.selected.update(self.of[item.nodeid])
        for tier, why in self.missing.items():
            reason = why() if self.selected[tier] else None
            if reason and required():
                pytest.exit(f"tests: the {tier} tier cannot run: {reason} ({REQUIRED}=1)", returncode=1)
            if reason and tier == "traces":  # the others skip where they reach their part
                for item in items:
                    if "traces" in self.of[item.nodeid]:
                        item.add_marker(pytest.mark.skip(reason=reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if (report.when == "call" and not report.skipped) or (report.when == "setup" and report.failed):
            self.ran.update(self.of.get(report.nodeid, []))

    def vanished(self) -> list[str]:
        return [t for t in self.selected if t != "gpu" and self.selected[t] and not self.ran[t]]

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if required() and self.vanished() and session.exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        counts = ", ".join(f"{t} {self.ran[t]} of {self.selected[t]}" for t in ("unit", "e2e", *NEEDS)
                           if self.selected[t])
        terminalreporter.write_line(f"tiers (tests ran of selected): {counts}")
        for tier in self.vanished():
            terminalreporter.write_line(f"tests: every {tier} test skipped"
                                        + (f"; that fails the run ({REQUIRED}=1)" if required() else ""))
