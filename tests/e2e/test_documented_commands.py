"""Every command a user copies from the documentation runs as written (issue 43): the README's, the
analysis README's and docs/'s shell blocks, the profiles' "Run it:" lines, the sbatch scripts' headers and the
commands' own --help texts. Submissions run as dry runs (no cluster needed) unless they say --local, in a
directory holding the `train.py` and `sweep.yaml` the README's "Your own script" names; sbatch lines are
checked by Slurm itself (`sbatch --test-only`) on the local cluster. What cannot run here is listed with
the reason and the test that runs it instead, and a new command in the docs must be one or the other."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow
PY = sys.executable
# Commands that cannot run as written here: what they need, and where the same is run instead.
NOT_HERE = {
    "python3 -m venv": "installs (the quickstart: tests/e2e/test_first_hour.py)",
    "bash tests/run.sh": "the whole suite (CI runs it)",
    "module load": "Perlmutter's module system",
    "pip install": "installs (tests/e2e/test_install.py installs the wheel)",
    "python -m hpc.data download": "needs the internet (tests/e2e/test_data.py: its refusal offline)",
    "python -m analysis.tensorboard": "a server (tests/e2e/test_tensorboard.py)",
    "salloc": "an interactive allocation (tests/e2e/test_sbatch_habits_slurm.py runs hpc.submit inside one)",
    "scancel": "Slurm's own, on a job (tests/e2e/test_stops_slurm.py sends the same)",
    "python -m hpc.job cancel": "a Slurm job to cancel (tests/e2e/test_stops_slurm.py cancels one so)",
    "python -m hpc.submit --resume": "submits a job (tests/e2e/test_stops_slurm.py resumes a run with it)",
    # the README's first run, which tests/e2e/test_first_hour.py runs and checks line by line: not twice (the
    # --help's copy adds --wait, which a local run, always followed, does not need)
    "python -m hpc.submit --local --gpus 2 --config profiles/quickstart.yaml": "the quickstart (test_first_hour.py)",
}
PLACEHOLDER = re.compile(r"<[^>]+>|\brun[AB]\b|\bsome\.pt\.trace|sweep-eager|sweep-graph")  # a user's own paths


def blocks(text: str, fence: str = "```bash") -> list[str]:
    out, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = line.strip() == fence
            continue
        if inside:
            out.append(line)
    return out


def commands(lines: list[str]) -> list[str]:
    """Shell lines joined across `\\` and without their trailing `# comment`."""
    found, pending = [], ""
    for line in lines:
        line = re.split(r"\s{2,}#\s", line)[0].rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            found.append(pending.strip())
            pending = ""
    return found


def documented() -> list[tuple[str, str]]:
    """(where, command) for every documented command."""
    out = [("README.md", c) for c in commands(blocks((REPO / "README.md").read_text()))]
    for page in [REPO / "analysis" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        out += [(str(page.relative_to(REPO)), c) for c in commands(blocks(page.read_text()))]
    for profile in sorted((REPO / "profiles").glob("*.yaml")):
        out += [(profile.name, m) for m in re.findall(r"# Run it: (.+)", profile.read_text())]
    for script in sorted((REPO / "jobs").glob("*.sbatch")):
        out += [(script.name, m.split("  #")[0].strip()) for m in re.findall(r"^#   (.*sbatch .+)$", script.read_text(), re.M)]
    for module in ("submit", "study"):
        doc = (REPO / "hpc" / "launch" / ("submission" if module == "submit" else "") / f"{module}.py").read_text().split('"""')[1]
        out += [(f"hpc.{module} --help", c) for c in commands([l.strip() for l in doc.splitlines()
                                                               if l.strip().startswith("python -m")])]
    return out


DOCUMENTED = documented()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Where a user would stand: their train.py (a DDP script) and the README's sweep.yaml beside it."""
    work = tmp_path_factory.mktemp("user")
    shutil.copy(REPO / "tests" / "scripts" / "torchrun_ddp.py", work / "train.py")
    yaml_block = textwrap.dedent("\n".join(blocks((REPO / "README.md").read_text(), "```yaml")))
    (work / "sweep.yaml").write_text(yaml_block.strip() + "\n")
    for name in ("profiles", "jobs"):
        (work / name).symlink_to(REPO / name)
    (work / "scratch").mkdir()
    return work


def runnable(command: str) -> tuple[list[str], dict[str, str]] | None:
    """The command as it will run here (argv, extra environment), or None when it cannot (NOT_HERE)."""
    if any(command.startswith(prefix) for prefix in NOT_HERE) or PLACEHOLDER.search(command):
        return None
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return words, env


def test_every_documented_command_is_run_or_says_why_not():
    """Each is run as written, run on this machine's own paths (a placeholder for a run: below), or not run
    here for a reason (NOT_HERE, a sweep of minutes); fewer than half are not run at all."""
    assert len(DOCUMENTED) > 30
    skipped = [c for _, c in DOCUMENTED if runnable(c) is None]
    for command in skipped:
        assert any(command.startswith(p) for p in NOT_HERE) or PLACEHOLDER.search(command), command
    not_run = [c for c in skipped if any(c.startswith(p) for p in NOT_HERE) or any(s in c for s in SWEEP_PATHS)]
    assert len(not_run) < len(DOCUMENTED) / 2, not_run


@pytest.mark.parametrize("where, command", [(w, c) for w, c in DOCUMENTED if runnable(c) and not c.startswith("sbatch")
                                            and "sbatch " not in c.split(" -- ")[0]],
                         ids=lambda x: x[:80])
def test_a_documented_command_runs_as_written(workdir, where, command):
    words, env = runnable(command)
    if words[:3] in (["python", "-m", "hpc.submit"], ["python", "-m", "hpc.study"]) and "--local" not in words:
        words = [*words, "--dry-run"] if "--" not in words else [*words[:words.index("--")], "--dry-run",
                                                                   *words[words.index("--"):]]
    if words[:3] in (["python", "-m", "hpc.submit"], ["python", "-m", "hpc.study"]):
        at = words.index("--") if "--" in words else len(words)
        words = [*words[:at], "--runs-dir", str(workdir / "runs"), *words[at:]]
    words = [PY if w == "python" else w for w in words]
    full_env = {**os.environ, "SCRATCH": str(workdir / "scratch"), "OMP_NUM_THREADS": "1",
                "PATH": f"{Path(PY).parent}:{os.environ['PATH']}", **env}
    r = subprocess.run(words, capture_output=True, text=True, cwd=workdir, env=full_env, timeout=300)
    assert r.returncode == 0, f"{where}: {command}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"


@pytest.mark.slurm
@pytest.mark.parametrize("where, command", [(w, c) for w, c in DOCUMENTED if runnable(c) and
                                            "sbatch" in c.split(" -- ")[0].split()[:2] + [c.split()[0]]],
                         ids=lambda x: x[:80])
def test_a_documented_sbatch_line_is_accepted_by_slurm(slurm_cluster, workdir, where, command):
    words, env = runnable(command)
    at = words.index("sbatch")
    words = [*words[: at + 1], "--test-only", *words[at + 1:]]
    words = [w for w in words if w != "..."]
    full_env = {**os.environ, "SCRATCH": str(workdir / "scratch"), **env}
    r = subprocess.run(words, capture_output=True, text=True, cwd=workdir, env=full_env, timeout=60)
    assert r.returncode == 0 and "to start at" in r.stderr, f"{where}: {command}\n{r.stderr[-1500:]}"


# A user's own paths in the docs, and what stands in for each here: the runs the documented --local
# commands above make (run again here if this test runs alone). Sweeps are not made here (a study is
# minutes): tests/e2e/test_study.py runs status, resubmit and the report on real sweeps, test_compare.py
# compares sweep points, and test_report.py two sweeps of one grid.
SWEEP_PATHS = ("sweep-<time>", "sweep-eager")


def made_run(workdir: Path, name: str) -> Path:
    """The newest run the documented --local command for `name` made (train: your own script, resnet18:
    the quickstart's profile), making it when there is none yet."""
    found = sorted((workdir / "runs" / name).glob("[0-9]*"), key=lambda p: p.stat().st_mtime)
    if not found:
        # the quickstart's profile on an eighth of its data for one epoch: a ResNet-18 run with its traces in
        # a tenth of the time (the whole quickstart runs as written in tests/e2e/test_first_hour.py)
        shorter = ["--set", "data.synth_train=512", "--set", "data.synth_test=128", "--set", "train.epochs=1"]
        argv = {"train": ["--gpus", "2", "--", PY, "train.py", "--epochs", "3"],
                "resnet18": ["--gpus", "2", "--config", "profiles/quickstart.yaml", *shorter]}[name]
        r = subprocess.run([PY, "-m", "hpc.submit", "--local", "--runs-dir", str(workdir / "runs"), *argv],
                           capture_output=True, text=True, cwd=workdir, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return made_run(workdir, name)
    return found[-1]


@pytest.mark.parametrize("where, command", [(w, c) for w, c in DOCUMENTED if PLACEHOLDER.search(c) and
                                            not any(c.startswith(p) for p in NOT_HERE) and
                                            not any(s in c for s in SWEEP_PATHS)], ids=lambda x: x[:80])
def test_a_documented_command_on_your_own_paths_runs(workdir, where, command):
    train, resnet18 = made_run(workdir, "train"), made_run(workdir, "resnet18")
    trace = next((resnet18 / "traces").glob("rank0.*"))
    for placeholder, real in (("runs/train/<job id>", train), ("runs/resnet18/<job id>", resnet18),
                              ("some.pt.trace.json.gz", trace), ("runA", resnet18), ("runB", train)):
        command = command.replace(placeholder, str(real))
    assert not PLACEHOLDER.search(command), command
    words = [PY if w == "python" else w for w in shlex.split(command)]
    r = subprocess.run(words, capture_output=True, text=True, cwd=workdir, timeout=300)
    assert r.returncode == 0, f"{where}: {command}\n{r.stderr[-1500:]}"
