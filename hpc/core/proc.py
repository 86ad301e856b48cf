"""What /proc says of a process of this host: its state (running, sleeping, stopped...), its children, the
work it has done (CPU time and time waiting for a core, bytes moved to and from storage), when it
started, and (for this process) how long it has waited for a core. One definition for the runner's hang
watch (hpc/launch/rank/hang.py) and the training's account of a lost peer (hpc/training/distributed/
group.py). Linux only; None or nothing where /proc does not say.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T, t, Z...), None when it is gone."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces), state first; None if unread."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split() or None


def family(pid: int) -> list[int]:
    """The process and its children (a DataLoader's workers), from /proc's children lists of its threads."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return [pid, *kids]


def progress(pid: int) -> tuple[int, int]:
    """(CPU clock ticks, bytes read from or written to storage) so far by the process and its children. The
    ticks count the time their threads ran and the time they waited in a run queue for a core: a process
    that other processes starve of its cores (a loaded node) is working, not blocked; a blocked one does
    neither."""
    ticks = moved = 0
    hz = os.sysconf("SC_CLK_TCK")
    for member in family(pid):
        fields = proc_stat(member)
        if fields is not None and len(fields) > 12:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        ticks += queued_ns(member) * hz // 1_000_000_000
        with contextlib.suppress(OSError, ValueError):
            io = dict(line.split(": ") for line in Path(f"/proc/{member}/io").read_text().splitlines())
            moved += int(io.get("read_bytes", 0)) + int(io.get("write_bytes", 0))
    return ticks, moved


def queued_ns(pid: int) -> int:
    """Nanoseconds the process's threads have been runnable but not running, waiting for a core (the second
    field of each /proc/PID/task/TID/schedstat); 0 where /proc does not say."""
    queued = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                queued += int((task / "schedstat").read_text().split()[1])
    return queued


def process_started_unix(pid: int | None = None) -> float | None:
    """When the process started, in Unix seconds (Linux: its start in clock ticks after boot, field 22 of
    /proc/PID/stat, plus the boot time from /proc/stat); None where /proc does not say."""
    fields = proc_stat(pid or os.getpid())
    try:
        ticks = int(fields[19]) if fields else None  # field 22, the 20th after the command name
        if ticks is None:
            return None
        boot = next(
            int(w[1]) for w in map(str.split, Path("/proc/stat").read_text().splitlines()) if w[:1] == ["btime"]
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def identity(pid: int | None = None) -> str | None:
    """`PID:START` (START: its start in clock ticks after boot): the process, told apart from a later one
    given the same pid. None where /proc does not say."""
    pid = pid or os.getpid()
    fields = proc_stat(pid)
    return f"{pid}:{fields[19]}" if fields and len(fields) > 19 else None


def gone(who: str) -> bool:
    """Whether the process `identity` named has ended (its pid free, or another process's now, or a zombie
    its parent has not reaped). A value that names no process is not gone: nothing is watched."""
    pid, _, start = who.partition(":")
    if not (pid.isdigit() and start.isdigit()):
        return False
    fields = proc_stat(int(pid))
    return fields is None or fields[0] == "Z" or len(fields) <= 19 or fields[19] != start


def queued_s() -> float | None:
    """How long this process's main thread has been runnable but not running, waiting for a core (Linux's
    /proc/self/schedstat, its second field, ns): a rank that shares its cores with other processes gains
    it, one that sleeps or does more work does not. None where /proc does not say (about 10 us a read)."""
    try:
        with open("/proc/self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
