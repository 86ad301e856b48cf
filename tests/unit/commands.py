"""Running a command in-process as its console script does (its own `cli`, hence the one error path), and
the README's promise for bad input checked on the outcome. Shared by the hand-made battery
(test_bad_input.py) and the generated one (test_properties_commands.py)."""

import contextlib
import dataclasses
import hashlib
import importlib
import io
import os
from pathlib import Path

# The launcher variables a test process may have inherited; a case sets its own.
DIST_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "TORCHELASTIC_RUN_ID", "SUBMITIT_EXECUTOR", "HPC_MASTER_PORT", "HPC_FAULT_INJECT")


def entry(module: str):
    """The command's own entry function: what `python -m` and the console script call."""
    return importlib.import_module(f"{module}.__main__" if module in ("analysis", "hpc.bench") else module).cli


@contextlib.contextmanager
def environment(env: dict | None):
    """os.environ without inherited launcher variables, plus `env`; restored afterwards."""
    saved = dict(os.environ)
    try:
        for key in list(os.environ):
            if key in DIST_KEYS or key.startswith(("SLURM_", "SUBMITIT_")):
                del os.environ[key]
        os.environ.update(env or {})
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclasses.dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def call(module: str, argv: list[str], env: dict | None = None) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = entry(module)(argv)
    return Outcome(code, out.getvalue(), err.getvalue())


def tree(root: Path) -> dict[str, str]:
    """Every path under root with a digest of its content (directories as 'dir', links as their target),
    links not followed."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            if path.is_symlink():
                kind = "link:" + os.readlink(path)
            elif path.is_dir():
                kind = "dir"
            else:
                kind = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = kind
    return dict(sorted(found.items()))


def assert_refused(outcome: Outcome, module: str, *needles: str) -> None:
    """The README's promise for bad input: exit 2, one line on stderr starting `<module>: error: `, no
    traceback, nothing on stdout (checks come before output), each needle named in the line."""
    assert outcome.code == 2, (outcome.code, outcome.stdout[-2000:], outcome.stderr[-2000:])
    assert len(outcome.lines) == 1 and "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    line = outcome.lines[0]
    assert line.startswith(f"{module}: error: ") and len(line) <= 700, line[:800]
    for needle in needles:
        assert needle in line, (needle, line)
    assert outcome.stdout == "", outcome.stdout[-2000:]


def plan_of(runs_dir, argv):
    """The plan of a submission command line, as the commands make it: hpc.submit's, or with --sweep FILE
    hpc.study run's (the one way to submit a sweep; its FILE comes first there). Nothing is written."""
    from hpc.launch.submission.plan import make_plan
    from hpc.launch.submission.points import split_command
    from hpc.launch.submission.submit import STUDY_RUN, parse_options

    own, words = split_command(list(argv))
    prog = "python -m hpc.submit"
    if "--sweep" in own:
        at = own.index("--sweep")
        own, prog = [own[at + 1], *own[:at], *own[at + 2:]], STUDY_RUN
    return make_plan(parse_options(["--runs-dir", str(runs_dir), *own], prog), words)
