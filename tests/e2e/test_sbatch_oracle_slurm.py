"""sbatch itself as the oracle of sbatch's options (issue 90). Hypothesis writes option lists as users type
them (time formats, short and long flags, flags whose value comes only after `=`, memory sizes with every
suffix, dependencies, --export lists); each list goes to `hpc.submit --dry-run` and to plain `sbatch`, both
jobs submitted held (`--hold`) to the local cluster and read back with `scontrol show job`. What each option
governs must read the same there, or hpc.submit refuses in one line, exit 2, naming the option. The examples
it once found failing stay as explicit cases (EXAMPLES)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = dict(os.environ, PATH=f"{Path(PY).parent}:{os.environ['PATH']}", HPC_SEEN_HERE="here")
BASE = ["-A", "m1234_g", "-q", "regular", "-C", "gpu"]  # what both jobs are charged and where they may run

# What each option governs in `scontrol show job -o`, by its long name
GOVERNS = {"time": "TimeLimit", "job-name": "JobName", "dependency": "Dependency", "mem": "MinMemoryNode",
           "exclusive": "OverSubscribe", "nice": "Nice", "nodes": "NumNodes", "comment": "Comment",
           "mail-type": "MailType", "begin": "StartTime", "requeue": "Requeue", "hold": "Priority"}

TIMES = st.sampled_from(["30", "0:30", "1:00:00", "90", "1-0", "1-12", "1-12:30", "1-12:30:15", "2:00:00", "45:30"])
MEMS = st.builds(lambda n, unit: f"{n}{unit}", st.integers(1, 64),
                 st.sampled_from(["", "K", "M", "G", "k", "m", "g", "KB", "MB", "GB", "mb", "gb"]))
NAMES = st.text(alphabet="abcxyz_-0189.", min_size=1, max_size=12)


def option(long, short, value_strategy, attached_only=False):
    """An option as users type it: --long=V, --long V, or -s V (where it has a short form)."""
    forms = [st.builds(lambda v: [f"--{long}={v}"], value_strategy)]
    if not attached_only:
        forms.append(st.builds(lambda v: [f"--{long}", v], value_strategy))
        if short:
            forms.append(st.builds(lambda v: [f"-{short}", v], value_strategy))
    return st.one_of(forms)


def options():
    """A list of sbatch options ({blocker}: the held job a dependency names)."""
    bare = st.sampled_from([["--exclusive"], ["--nice"], ["--requeue"], ["--hold"]])
    return st.lists(st.one_of(
        option("time", "t", TIMES),
        option("job-name", "J", NAMES),
        option("mem", None, MEMS),
        option("nodes", "N", st.sampled_from(["1", "2"])),
        option("dependency", "d", st.sampled_from(["afterok:{blocker}", "afterany:{blocker}", "singleton",
                                                   "afternotok:{blocker}"])),
        option("nice", None, st.integers(0, 100).map(str), attached_only=True),
        option("exclusive", None, st.sampled_from(["user", "mcs"]), attached_only=True),
        option("comment", None, NAMES),
        option("mail-type", None, st.sampled_from(["END", "FAIL", "BEGIN,END", "NONE"])),
        option("export", None, st.sampled_from(["ALL", "ALL,FOO=1", "ALL,HPC_SEEN_HERE", "ALL,A=x=y", "NONE",
                                                "NONE,FOO=1", 'ALL,FOO="a,b"', "HPC_SEEN_HERE"])),
        bare,
    ), min_size=1, max_size=4, unique_by=lambda words: words[0].split("=")[0]).map(lambda given: sum(given, []))


@pytest.fixture(scope="module")
def blocker(slurm_cluster):
    """A held job for the dependencies to name; cancelled after the module."""
    r = subprocess.run(["sbatch", "--parsable", "--hold", *BASE, "-n", "1", "-t", "5", "-o", "/dev/null", "--wrap",
                        "true"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    yield job
    subprocess.run(["scancel", job], capture_output=True)


def shown_job(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def plain_sbatch(words: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--parsable", "--hold", *BASE, "-o", "/dev/null", *words, "--wrap", "true"],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV)


def toolkit_sbatch(words: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess | None]:
    """hpc.submit's dry run of the options, then its script submitted held as sbatch would take it."""
    dry = subprocess.run([PY, "-m", "hpc.submit", "--dry-run", *BASE, "--gpus", "1", "--runs-dir", str(tmp_path),
                          *words, "--", "true"], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    if dry.returncode != 0:
        return dry, None
    script = tmp_path / "job.sh"
    script.write_text(dry.stdout[dry.stdout.index("#!/bin/bash"):])
    return dry, subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True,
                               cwd=tmp_path, env=ENV)


def long_names(words: list[str]) -> list[str]:
    shorts = {"t": "time", "J": "job-name", "N": "nodes", "d": "dependency"}
    return [shorts.get(w[1:], w[1:]) if not w.startswith("--") else w[2:].split("=")[0]
            for w in words if w.startswith("-")]


def same_job_or_refused(words: list[str], blocker: str, tmp_path: Path) -> None:
    """The oracle: plain sbatch and hpc.submit's script, both held, read the same for what each option governs;
    or hpc.submit refused the list in one line naming an option of it."""
    words = [w.replace("{blocker}", blocker) for w in words]
    plain = plain_sbatch(words, tmp_path)
    dry, ours = toolkit_sbatch(words, tmp_path)
    jobs = [p.stdout.strip().split(";")[0] for p in (plain, ours) if p is not None and p.returncode == 0]
    try:
        if ours is None:  # refused: one line, exit 2, naming an option given
            lines = dry.stderr.strip().splitlines()
            assert dry.returncode == 2 and len(lines) == 1, (words, dry.stderr)
            assert any(w.split("=")[0].lstrip("-") in lines[0] for w in words if w.startswith("-")), (words, lines)
            return
        assert ours.returncode == 0, (words, ours.stderr, dry.stdout)
        assert plain.returncode == 0, (words, plain.stderr)  # hpc.submit took it: so must sbatch
        theirs, mine = shown_job(jobs[0]), shown_job(jobs[1])
        for name in long_names(words):
            field = GOVERNS.get(name)
            if field is not None:
                assert mine.get(field) == theirs.get(field), (words, field, mine.get(field), theirs.get(field))
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(words=options())
def test_sbatchs_options_make_the_same_job_or_are_refused_in_one_line(blocker, tmp_path_factory, words):
    same_job_or_refused(words, blocker, tmp_path_factory.mktemp("oracle"))


# Lists the generator once found failing, and the issue's own, kept as cases ({blocker}: the held job's id)
EXAMPLES = [
    ["--exclusive", "-t", "30"],  # a value after = only: the next word is an option of its own
    ["--mem", "200GB"],  # sbatch reads it as 200G
    ["--nice", "-J", "x"],
    ["-d", "afterok:{blocker}", "--time=1-12"],
    ["--export=ALL,FOO=1", "--mail-type=BEGIN,END"],
    ['--export=ALL,FOO="a,b"'],  # sbatch keeps the quotes in the value: refused, naming --export
    ["--export", "NONE", "-J", "x"],
]


@pytest.mark.parametrize("words", EXAMPLES, ids=" ".join)
def test_the_lists_once_found_failing_make_the_same_job(blocker, tmp_path, words):
    same_job_or_refused(words, blocker, tmp_path)
