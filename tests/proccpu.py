"""CPU time by kind of process, over a command and everything the machine runs meanwhile (Slurm's jobs
included, which are no test's children): `python tests/proccpu.py -- python -m pytest -m slurm ...`.

tests/cputime.py says which tests cost the most; this says what in them does (a training rank, torchrun's
agent, submitit's wrapper, the analysis, a user's script). It reads /proc/PID/stat every second, so a
process that lives under a second is missed, and a process's last second is not counted: the total is
printed beside the machine's busy core-seconds (/proc/stat) to show what was missed. Not part of CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from cputime import machine_busy

from hpc.core.proc import proc_stat

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen: dict[tuple[str, str], list], first: bool) -> None:
    """Every process's CPU seconds so far into seen[(pid, start time)] = [command, cpu, cpu when first seen]."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or (fields := proc_stat(int(pid))) is None or len(fields) <= 19:
            continue  # gone between the listing and the read
        cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
        key = (pid, fields[19])  # the start time tells a reused pid apart
        if key in seen:
            seen[key][1] = cpu
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            command = command or Path(f"/proc/{pid}/comm").read_text().strip()  # a kernel thread: its name
        except OSError:
            continue
        seen[key] = [command, cpu, cpu if first else 0.0]


def kind(command: str) -> str:
    if "hpc.train" in command:
        return "hpc.train rank"
    if found := re.search(r" -m (\S+)", command):
        return f"python -m {found[1]}"
    if found := re.search(r"(\S+\.py)\b", command):
        return f"script {found[1].rsplit('/', 1)[-1]}"
    return command.split()[0].rsplit("/", 1)[-1] if command.split() else "?"


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: python tests/proccpu.py -- COMMAND...", file=sys.stderr)
        return 2
    seen: dict[tuple[str, str], list] = {}
    busy = machine_busy()
    proc = subprocess.Popen(argv[1:])
    sample(seen, first=True)
    while proc.poll() is None:
        time.sleep(1.0)
        sample(seen, first=False)
    busy = machine_busy() - busy
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for command, cpu, before in seen.values():
        if cpu - before > 0:
            by_kind[kind(command)][0] += 1
            by_kind[kind(command)][1] += cpu - before
    counted = sum(cpu for _, cpu in by_kind.values())
    print(f"{counted:.0f} core-s counted of the machine's {busy:.0f} busy; by kind (processes, each on average):")
    for name, (n, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][1])[:30]:
        print(f"{cpu:9.1f} s {int(n):6d} {cpu / n:7.2f} s  {name[:90]}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
