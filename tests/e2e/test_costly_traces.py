"""Traces built to stall or exhaust the analysis (issue 53): a 3 MB .gz that inflates to 3 GB in one
event's name, a gzip bomb of whitespace, events nested a million deep, and millions of tiny events in one
step. Each is refused in one line naming the file, exit 2, no traceback, under a 2 GiB address-space
limit (a reader that held one of them whole would die of it instead), within a hang guard. The bounds
are analysis/read/reader.py's: a value of 64 MiB, 16 MiB of whitespace in a row, a .gz inflating past 100x its
size once past 256 MiB. A real trace of other people's GPU run (the largest of ../shared/traces) still
reads under the same limit."""

import gzip
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SHARED_TRACES

LIMIT_BYTES = 2 << 30
MIB = 1 << 20


def member(data: bytes) -> bytes:
    """One gzip member: concatenated members are one gzip stream (RFC 1952), so a bomb is cheap to write."""
    return gzip.compress(data, compresslevel=9)


def bomb(path: Path, head: bytes, block: bytes, times: int, tail: bytes) -> Path:
    one = member(block)
    with open(path, "wb") as f:
        f.write(member(head))
        for _ in range(times):
            f.write(one)
        f.write(member(tail))
    return path


STEP = b'{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":1000000000}'
TINY = b'{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":5,"dur":1},'
HOSTILE = {  # name: (what makes it, what the one line says)
    "long_name.json.gz": (lambda p: bomb(p, b'{"traceEvents":[{"ph":"X","name":"', b"a" * MIB, 3000, b'"}]}'),
                          "longer than 64 MiB"),
    "blank.json.gz": (lambda p: bomb(p, b'{"traceEvents":[', b" " * MIB, 3000, b"]}"), "of whitespace in a row"),
    "deep.json": (lambda p: p.write_bytes(b'{"traceEvents":[' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"]}") and p,
                  "nested deeper"),
    "tiny_events.json.gz": (lambda p: bomb(p, b'{"traceEvents":[' + STEP + b",", TINY * (MIB // len(TINY)), 300,
                                           STEP + b"]}"), "a gzip bomb"),
}


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def analyse(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis", str(path)], capture_output=True, text=True, cwd=REPO,
                          timeout=300, preexec_fn=limited)  # a hang guard, not a speed target


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_costly_trace_is_refused_in_one_line(tmp_path, name):
    make, said = HOSTILE[name]
    path = make(tmp_path / name)
    assert path.stat().st_size < 8 * MIB  # the attack is small on disk
    proc = analyse(path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert name in lines[0] and said in lines[0], lines[0]


@pytest.mark.traces
def test_a_real_trace_reads_under_the_same_limit():
    largest = max(SHARED_TRACES.rglob("*.json.gz"), key=lambda p: p.stat().st_size)
    proc = analyse(largest)
    assert proc.returncode == 0, proc.stderr[-2000:]

