"""The suite's tiers, counted, so that none can vanish in silence (a pytest plugin, loaded by conftest.py).

A test belongs to `unit` or `e2e` by its folder, and also to each tier whose part it needs, by marker:
`slurm` (the local cluster), `browser` (Debian's chromium and its driver), `traces` (../shared/traces),
`gpu` (a CUDA GPU). The run ends with one line of how many tests of each tier ran.

Required (CI=true, as CI runs, whoever the user; or HPC_REQUIRE_TIERS=1, which tests/run.sh sets as root,
because root can provide every part but a GPU): a part missing for a selected tier stops the run at
once, saying which; a tier other than `gpu` whose selected tests all skipped fails the run; and so does
any single test outside the `gpu` tier that skipped, unless ALLOWED_SKIPS names it with its reason. What
happens before a test runs counts too: a test module skipped as it was collected (a module-level
`pytest.skip(allow_module_level=True)`, an `importorskip`) outside a `gpu` folder, and a test module below
the folders collected that gave no test at all (emptied, guarded away, or in a folder pytest did not
enter), each fail a required run. The run ends with what skipped and why. Not required, a missing part skips its tests, saying why (a laptop
without Slurm still runs the rest).

Under pytest-xdist (tests/run.sh runs the rest with `-n 2`) each worker collects the whole selection and
runs part of it: each counts its own, hands its counts to the controller at its end (`workeroutput`), and
the controller adds up what ran and judges the run on the sum, as one process would.
"""

from __future__ import annotations

import json
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
# The skips a required run allows outside the gpu tier, each with why it may happen on a machine that has
# every part: (a piece of the test's id, the reason). Short on purpose.
ALLOWED_SKIPS = (
    ("test_slurm_jobs.py::test_torchrun_launcher_checkpoints_on_the_warning_and_requeues",
     "a torch older than 2.9 has no torchrun --signals-to-handle (pytorch/pytorch#160690), so it cannot pass "
     "SIGUSR2 to its workers; decided from torch's version"),
)


def required() -> bool:
    return os.environ.get(REQUIRED) == "1" or os.environ.get("CI", "").lower() in ("true", "1")


def allowed(nodeid: str) -> str | None:
    """The written reason a required run lets this test skip, or None."""
    return next((why for part, why in ALLOWED_SKIPS if part in nodeid), None)


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
    # unit or e2e by its folder, the nearest of its parents so named (tests/unit/core/test_x.py is unit)
    own = [name for name in reversed(Path(str(item.path)).parts[:-1]) if name in ("unit", "e2e")][:1]
    return own + [name for name in NEEDS if item.get_closest_marker(name) is not None]


class Tiers:
    """Counts, per tier, the selected tests and those that ran (passed or failed, not skipped)."""

    def __init__(self, slurm_missing: Callable[[], str | None]):
        self.missing = {"slurm": slurm_missing, "browser": browser_missing, "traces": traces_missing}
        self.of: dict[str, list[str]] = {}
        self.selected: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}  # test id -> the reason it gave
        self.modules_skipped: dict[str, str] = {}  # a module skipped as it was collected -> the reason
        self.with_items: set[Path] = set()  # modules that gave a test (before -m and -k deselect)
        self.empty: list[str] = []  # test modules below the collected folders that gave none
        self.errored: set[str] = set()  # modules that failed to import
        self.config: pytest.Config | None = None

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.with_items.add(Path(str(item.path)).resolve())

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and report.nodeid.endswith(".py"):  # a whole module, skipped before any test
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.modules_skipped[report.nodeid] = str(reason).removeprefix("Skipped: ")
        if report.failed and report.nodeid.endswith(".py"):  # an import error: pytest reports it itself
            self.errored.add(report.nodeid)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Every test_*.py below a folder the run collected gave a test, was skipped (said), or failed to
        import (an error pytest reports); one that gave nothing would vanish in silence."""
        folders = [Path(str(arg).split("::")[0]).resolve() for arg in session.config.args]
        root = Path(str(session.config.rootpath))
        told = {(root / n).resolve() for n in [*self.modules_skipped, *self.errored]}
        for folder in (f for f in folders if f.is_dir()):
            for module in sorted(folder.rglob("test_*.py")):
                if "__pycache__" not in module.parts and module.resolve() not in self.with_items | told:
                    self.empty.append(str(module.relative_to(session.config.rootpath)))

    @pytest.hookimpl(trylast=True)  # after -k and -m have deselected
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            self.of[item.nodeid] = tiers_of(item)
            self.selected.update(self.of[item.nodeid])
        for tier, why in self.missing.items():
            reason = why() if self.selected[tier] else None
            if reason and required():
                pytest.exit(f"tests: the {tier} tier cannot run: {reason} (required: CI or {REQUIRED}=1)", returncode=1)
            if reason and tier == "traces":  # the others skip where they reach their part
                for item in items:
                    if "traces" in self.of[item.nodeid]:
                        item.add_marker(pytest.mark.skip(reason=reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.controller:  # its workers count their own tests (see the module doc)
            return
        if (report.when == "call" and not report.skipped) or (report.when == "setup" and report.failed):
            self.ran.update(self.of.get(report.nodeid, []))
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped[report.nodeid] = str(reason).removeprefix("Skipped: ")

    def vanished(self) -> list[str]:
        return [t for t in self.selected if t != "gpu" and self.selected[t] and not self.ran[t]]

    def unallowed(self) -> list[str]:
        """Tests outside the gpu tier that skipped with no written reason to (see ALLOWED_SKIPS), and modules
        skipped as they were collected outside a gpu folder."""
        tests = [n for n in self.skipped if "gpu" not in self.of.get(n, []) and allowed(n) is None]
        modules = [n for n in self.modules_skipped if "gpu" not in Path(n).parts and allowed(n) is None]
        return tests + modules

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config

    @property
    def controller(self) -> bool:
        """xdist's controller: the process that runs no test (its workers do)."""
        return self.config is not None and self.config.pluginmanager.hasplugin("dsession")

    @property
    def worker(self) -> bool:
        return self.config is not None and hasattr(self.config, "workerinput")

    def counts(self) -> dict[str, object]:
        """What this process counted, as a worker hands it on (JSON: xdist's channel carries plain values)."""
        return {"of": self.of, "selected": dict(self.selected), "ran": dict(self.ran), "skipped": self.skipped,
                "modules_skipped": self.modules_skipped, "empty": self.empty}

    def add(self, counts: dict) -> None:
        """A worker's counts: each worker selected the whole run, so what was selected is taken once; what ran
        and what skipped add up."""
        self.of.update(counts["of"])
        self.selected = Counter(counts["selected"])
        self.ran.update(counts["ran"])
        self.skipped.update(counts["skipped"])
        self.modules_skipped.update(counts["modules_skipped"])
        self.empty = sorted(set(self.empty) | set(counts["empty"]))

    def pytest_testnodedown(self, node: object, error: object) -> None:  # the controller: a worker ended
        output = getattr(node, "workeroutput", {})
        if "tiers" in output:
            self.add(json.loads(output["tiers"]))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.worker:
            session.config.workeroutput["tiers"] = json.dumps(self.counts())  # type: ignore[attr-defined]
            return
        if required() and (self.vanished() or self.unallowed() or self.empty) and session.exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        counts = ", ".join(f"{t} {self.ran[t]} of {self.selected[t]}" for t in ("unit", "e2e", *NEEDS)
                           if self.selected[t])
        terminalreporter.write_line(f"tiers (tests ran of selected): {counts}")
        for tier in self.vanished():
            fails = "; that fails the run (required: CI or HPC_REQUIRE_TIERS=1)" if required() else ""
            terminalreporter.write_line(f"tests: every {tier} test skipped{fails}")
        unallowed = set(self.unallowed()) if required() else set()
        fails = " (fails the run)" if required() else ""
        for module in self.empty:
            terminalreporter.write_line(f"tests: {module} gave no test{fails}")
        for nodeid, reason in sorted({**self.skipped, **self.modules_skipped}.items()):
            said = "not allowed: fails the run" if nodeid in unallowed else "allowed" if allowed(nodeid) else "skipped"
            terminalreporter.write_line(f"skipped ({said}): {nodeid}: {reason}")
