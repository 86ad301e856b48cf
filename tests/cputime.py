"""CPU time per test, for finding where the suite's cores go (a pytest plugin, loaded by conftest.py).

`--durations` says how long each test took; on two shared cores that is mostly how long it waited. With
HPC_TEST_CPU_LOG naming a file, each test appends one JSON line there: its id, its wall seconds, and the
CPU seconds of the test process and of the children it waited for (subprocess.run, Popen.wait: a rank,
hpc.submit, the analysis), from getrusage; when it ended and in which worker (a timeline of the run).
xdist's workers append to the same file. Jobs that run under Slurm's daemons are not a test's children:
for them each line also has the busy core-seconds of the whole machine during the test (/proc/stat), the
true cost where one test runs at a time (the Slurm tier alone).
`python tests/cputime.py FILE [machine]` prints the tests and modules that took the most CPU (or machine)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

VARIABLE = "HPC_TEST_CPU_LOG"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def machine_busy() -> float:
    """Core-seconds every CPU of the machine spent not idle since boot (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get(VARIABLE)
    if not path:
        yield
        return
    own, children, machine, wall = *_cpu(), machine_busy(), time.monotonic()
    yield
    own_after, children_after = _cpu()
    line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 2), "cpu_s": round(own_after - own, 2),
            "children_cpu_s": round(children_after - children, 2),
            "machine_busy_s": round(machine_busy() - machine, 2), "ended": round(time.time(), 1),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a") as f:  # one short write: lines from two workers do not interleave
        f.write(json.dumps(line) + "\n")


def main(path: str, key: str = "cpu") -> None:
    rows = [json.loads(line) for line in open(path)]
    if key == "machine":
        total = lambda r: r.get("machine_busy_s", 0.0)  # noqa: E731
    else:
        total = lambda r: r["cpu_s"] + r["children_cpu_s"]  # noqa: E731
    wall = sum(r["wall_s"] for r in rows) / 60
    spent = sum(map(total, rows)) / 60
    print(f"{len(rows)} tests, {spent:.1f} {key} minutes, {wall:.1f} wall minutes (summed over workers)")
    for r in sorted(rows, key=total, reverse=True)[:30]:
        print(f"{total(r):8.1f} s {key} {r['wall_s']:8.1f} s wall  {r['test'][:110]}")
    modules = Counter()
    for r in rows:
        modules[r["test"].split("::")[0]] += total(r)
    print("by module:")
    for module, cpu in modules.most_common(25):
        print(f"{cpu:8.1f} s {key}  {module}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
