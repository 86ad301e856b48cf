"""Every command's flags over generated values (Hypothesis), each checked against the README's promise:
exit 0 or 2, and on 2 exactly one stderr line that names the flag (the value's source), no traceback,
nothing on stdout, and nothing new on disk. Values: strings of any kind a shell can pass (no NUL; bytes
that are not UTF-8 arrive as surrogates), numbers written every way, and paths under /proc, /dev and
/sys, through files, symbolic-link loops, and names the file system refuses.

Each command starts from a base command line that works (or fails at a known, later check) and one
or two of its flags are replaced by generated values. The examples Hypothesis shrank failures to are
kept as regular cases in test_bad_input.py. CI runs a fixed sequence (tests/conftest.py)."""

import ast
import contextlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from commands import Outcome, assert_refused, call, tree
from test_properties_files import KEYS, examples

REPO = Path(__file__).resolve().parents[2]
SMOKE = str(REPO / "profiles" / "smoke.yaml")
STUDY = str(REPO / "profiles" / "study-smoke.yaml")

# --- values a user can type ---------------------------------------------------------------------------

ARGV_TEXT = st.one_of(
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40),
    st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape").replace("\x00", "")),
    st.sampled_from(["", " ", "-", "--", "-x", "--help", "a\nb", "\t", "'", '"', "$(id)", "`id`", "*", "~",
                     "x" * 300, "é" * 100, "..", ".", "/"]),
)
NUMBER_TEXT = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "+inf", "1e999", "-1e999", "0x10", "1_000", " 7", "7 ", "٣",
                     "-0", "+5", "00012", "1e3", "0.0", "-1", "0", "1", "2", "9" * 40, "1/10", "1/0", ""]),
)
PATH_TEMPLATES = ["{T}/new", "{T}/new/deeper", "{T}/" + "x" * 300, "{T}/" + "a/" * 2100 + "z", "{T}/file",
                  "{T}/file/below", "{T}/loop", "{T}/loop/below", "{T}/dir", "{T}/a b", "{T}/\udcff\udcfe",
                  "{T}/line\nbreak", "/proc/self/nope", "/proc/1/mem", "/proc", "/proc/self", "/dev/null",
                  "/dev/null/x", "/dev/full", "/sys/kernel", "/sys/x/y", "/", ".", "..", "~", "-", "",
                  "/nonexistent/a/b", "relative/path"]
PATHS = st.one_of(st.sampled_from(PATH_TEMPLATES), ARGV_TEXT.map(lambda t: "{T}/" + t))


def _stays_put(path: str) -> bool:
    """Whether a command that writes there writes inside the workspace, or is refused (no test writes
    elsewhere: `..` would be /tmp itself)."""
    inside = path.startswith("{T}/") or not path.startswith(("/", "~", "."))
    return (inside and ".." not in Path(path).parts) or path.startswith(("/proc", "/sys", "/dev"))


OUTPUT_PATHS = PATHS.filter(_stays_put)


@contextlib.contextmanager
def workspace():
    """A fresh working directory with a file, a directory and a symbolic-link loop to aim at."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "file").write_text("a file\n")
        (work / "dir").mkdir()
        (work / "loop").symlink_to(work / "loop")
        before = os.getcwd()
        os.chdir(work)
        try:
            yield work
        finally:
            os.chdir(before)


def _as_int(text: str) -> int | None:
    """What argparse's int() makes of the text (it takes ' 7', '+5', '1_000', Unicode digits), or None."""
    try:
        return int(text)
    except ValueError:
        return None


def fill(text: str, work: Path) -> str:
    return text.replace("{T}", str(work))


def check(module: str, argv: list[str], work: Path, sources: tuple[str, ...], env: dict | None = None,
          writes_ok: bool = False) -> Outcome:
    """Run the command; assert the promise. `sources`: where the generated values came from (the flags,
    keys and variables given; for a positional path, its name and the path): a refusal's line must name
    one of them."""
    before = tree(work)
    outcome = call(module, argv, env)
    assert outcome.code in (0, 2), (argv, outcome.code, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr, (argv, outcome.stderr[-3000:])
    said = [c for c in outcome.stdout + outcome.stderr if unicodedata.category(c) == "Cc" and c not in "\t\n\r"]
    assert not said, (argv, said)  # no terminal control reaches the terminal (issue 62)
    if outcome.code == 2:
        assert_refused(outcome, module)
        assert tree(work) == before, (argv, outcome.lines)
        names(outcome, sources)
    elif not writes_ok:
        assert tree(work) == before, argv
    return outcome


def as_shown(text: str) -> str:
    """`text` as a terminal is shown it: each control character (Unicode's Cc: C0, DEL, C1) but tab, line
    feed and carriage return written out as \\xNN."""
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\t\n\r" else c for c in text)


def names(outcome: Outcome, sources: tuple[str, ...]) -> None:
    """The refusal's line, after `module: error: `, names one of the sources: as given, as Python quotes
    it, or with its runs of white space made one space (hpc/core/cli.py keeps the line one line)."""
    said = outcome.lines[0].split(": error: ", 1)[1]
    forms = {form for s in sources if s.strip()
             for form in (s, repr(s)[1:-1], " ".join(s.split()), as_shown(" ".join(s.split())))}
    shown = {form[:30] for form in forms}  # a long value is shortened in the line; its start is kept
    assert any(form in said for form in shown), (sorted(shown), said)


# --- hpc.config and the config layer behind every command ---------------------------------------------

SET_KEYS = st.sampled_from([f"{section}.{key}" for section, keys in KEYS.items() for key in keys] + ["train.nokey"])


@given(key=SET_KEYS, value=st.one_of(ARGV_TEXT, NUMBER_TEXT))
@examples(120)
def test_config_set_any_key_any_value(key, value):
    with workspace() as work:
        argv = ["--config", SMOKE, "--set", f"{key}={value}"]
        if key.startswith(("cluster.", "sweep.")):
            argv += ["--profile", "local"] if key.startswith("cluster.") else ["--sweep", STUDY]
        check("hpc.config", argv, work, ("--set", key))


@given(flag=st.sampled_from(["--config", "--profile", "--sweep"]), path=PATHS)
@examples(60)
def test_config_file_flags_any_path(flag, path):
    with workspace() as work:
        check("hpc.config", [flag, fill(path, work)], work, (flag, fill(path, work)))


# --- hpc.submit and hpc.study: job flags and the forwarded training flags --------------------------------

JOB_NUMBERS = ["--nodes", "--gpus", "--time", "--max-parallel"]
JOB_TEXT = ["--account", "--qos", "--partition", "--name"]
TRAINING_NUMBERS = {"--batch-size": "train.batch_size", "--epochs": "train.epochs", "--max-steps": "train.max_steps",
                    "--seed": "train.seed", "--grad-accum-steps": "train.grad_accum_steps", "--lr": "train.lr",
                    "--data-fraction": "data.fraction"}
TRAINING_TEXT = {"--arch": "model.arch", "--stem": "model.stem", "--device": "train.device",
                 "--loader": "data.loader", "--batch-scope": "train.batch_scope", "--data-root": "data.root"}


@st.composite
def submit_flags(draw) -> list[tuple[str, str]]:
    """One or two (flag, value) pairs for hpc.submit."""
    def one():
        kind = draw(st.integers(0, 5))
        if kind == 0:
            return draw(st.sampled_from(JOB_NUMBERS)), draw(NUMBER_TEXT)
        if kind == 1:
            return draw(st.sampled_from(JOB_TEXT)), draw(ARGV_TEXT)
        if kind == 2:
            return draw(st.sampled_from(sorted(TRAINING_NUMBERS))), draw(NUMBER_TEXT)
        if kind == 3:
            return draw(st.sampled_from(sorted(TRAINING_TEXT))), draw(ARGV_TEXT)
        if kind == 4:
            return "--export", draw(st.sampled_from(["HPC_FAULT_INJECT", "OMP_NUM_THREADS", "1X", "A-B", ""])) \
                + draw(st.sampled_from(["=", ""])) + draw(ARGV_TEXT)
        return draw(st.sampled_from(["--runs-dir", "--profile"])), draw(PATHS)
    return [one() for _ in range(draw(st.integers(1, 2)))]


def _sources(flags: list[tuple[str, str]]) -> tuple[str, ...]:
    keys = {**TRAINING_NUMBERS, **TRAINING_TEXT}
    return tuple(s for flag, _ in flags for s in (flag, keys.get(flag, flag)))


@given(flags=submit_flags())
@examples(150)
def test_submit_dry_run_any_flags(flags):
    with workspace() as work:
        argv = ["--dry-run", "--account", "m1_g", "--config", SMOKE, "--runs-dir", f"{work}/runs"]
        for flag, value in flags:
            argv += [f"{flag}={fill(value, work)}"]
        check("hpc.submit", argv, work, _sources(flags))


@given(flags=submit_flags())
@examples(30)
def test_study_dry_run_any_flags(flags):
    with workspace() as work:
        argv = ["run", STUDY, "--account", "m1_g", "--dry-run", "--runs-dir", f"{work}/runs"]
        for flag, value in flags:
            argv += [f"{flag}={fill(value, work)}"]
        check("hpc.study", argv, work, _sources(flags))


@given(path=PATHS)
@examples(40)
def test_study_status_any_path(path):
    with workspace() as work:
        check("hpc.study", ["status", fill(path, work)], work, ("sweep_dir", fill(path, work)))


# --- hpc.distenv, hpc.data, hpc.bench ------------------------------------------------------------------

def slurm_hostnames(expr: str) -> list[str]:
    """The oracle: Slurm's own expansion (`scontrol show hostnames`, which answers where the test cluster's
    slurm.conf is); without it, the expression's comma-separated parts, for one without brackets only."""
    if shutil.which("scontrol"):
        r = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True)
        if r.returncode == 0:
            return r.stdout.decode("utf-8", "surrogateescape").split("\n")[:-1]
    assume("[" not in expr and "]" not in expr)
    return [part for part in expr.split(",") if part]


@given(expr=ARGV_TEXT | st.text(alphabet="nid[]-,0123456789 ", max_size=30))
@examples(80)
def test_distenv_hostlist_any_text(expr):
    with workspace() as work:
        outcome = check("hpc.distenv", ["--hostlist", expr], work, ("--hostlist",))
        if outcome.code == 0:  # the hosts Slurm's own parser expands it to, one per line
            expected = [as_shown(host) for host in slurm_hostnames(expr)]
            assert outcome.stdout.split("\n")[:-1] == expected, (expr, outcome.stdout)


@given(nproc=NUMBER_TEXT, restarts=NUMBER_TEXT, env=st.dictionaries(
    st.sampled_from(["SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES"]), ARGV_TEXT | NUMBER_TEXT))
@examples(60)
def test_distenv_torchrun_args_any_values(nproc, restarts, env):
    with workspace() as work:
        env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "nid[001-002]", **env}
        check("hpc.distenv", ["--torchrun-args", nproc, "--max-restarts", restarts], work,
              ("--torchrun-args", "--max-restarts", *env), env=env)


@given(env=st.dictionaries(st.sampled_from(["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS",
                                            "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                                            "SLURM_TASKS_PER_NODE", "SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_NTASKS"]),
                           NUMBER_TEXT | ARGV_TEXT, max_size=6))
@examples(100)
def test_distenv_any_environment(env):
    env = {k: v for k, v in env.items() if "\x00" not in v}
    with workspace() as work:
        check("hpc.distenv", ["--json"], work, tuple(env), env=env)


@given(root=PATHS)
@examples(50)
def test_data_check_any_root(root):
    with workspace() as work:
        outcome = check("hpc.data", ["check", "--root", fill(root, work)], work, ("--root", "data root"))
        assert outcome.code == 2  # no data set lies at any of these paths


@given(root=OUTPUT_PATHS, train=st.sampled_from(["100", "150"]) | NUMBER_TEXT, test=st.sampled_from(["1", "5"]) | NUMBER_TEXT)
@examples(50)
def test_data_synth_any_root_and_sizes(root, train, test):
    with workspace() as work:
        argv = ["synth", "--root", fill(root, work), "--train", train, "--test", test]
        if _as_int(train) is not None and _as_int(test) is not None and max(_as_int(train), _as_int(test)) > 200:
            argv[4] = "100000000000"  # a valid size here would write a real set: keep to refusals
        check("hpc.data", argv, work, ("--root", "--train", "--test", "data root"), writes_ok=True)


@given(flag=st.sampled_from(["--steps", "--warmup", "--batch", "--memory-grid", "--scaling-step-ms", "--out", "--arch",
                             "--stem"]), value=NUMBER_TEXT | ARGV_TEXT | PATHS)
@examples(50)
def test_bench_any_flag(flag, value):
    """The benchmark itself never starts: --only names no configuration, the last check before it."""
    with workspace() as work:
        argv = ["--arch", "tiny", "--only", "none-such", f"{flag}={fill(value, work)}"]
        outcome = check("hpc.bench", argv, work, (flag, "--only"))
        if outcome.code == 0:
            assert flag == "--scaling-step-ms" and "nan" not in outcome.stdout.lower()


# --- analysis, analysis.tensorboard, analysis.bench.speed -------------------------------------------------------

GOOD_TRACE = '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}'


@given(path=OUTPUT_PATHS, fmt=st.sampled_from(["table", "csv", "json", "md", "xml", ""]),
       out=st.none() | OUTPUT_PATHS, plots=st.booleans())
@examples(40)
def test_analysis_any_path_and_output(path, fmt, out, plots):
    with workspace() as work:
        (work / "dir" / "rank0.pt.trace.json").write_text(GOOD_TRACE)
        argv = [fill(path, work), "--format", fmt] + (["--out", fill(out, work)] if out is not None else [])
        argv += ["--plots"] if plots else []
        check("analysis", argv, work, ("--out", "--plots", "--format", "path", fill(path, work)), writes_ok=True)


@given(logdir=PATHS, port=NUMBER_TEXT)
@examples(50)
def test_tensorboard_any_logdir_and_port(logdir, port):
    """Never a server: the host is an address no machine here has (TEST-NET-1)."""
    with workspace() as work:
        argv = [fill(logdir, work), "--port", port, "--host", "192.0.2.1"]
        outcome = check("analysis.tensorboard", argv, work, ("--port", "--host", "logdir", fill(logdir, work)))
        assert outcome.code == 2


@given(json_out=PATHS, repeat=NUMBER_TEXT)
@examples(40)
def test_analysis_bench_any_output(json_out, repeat):
    with workspace() as work:
        (work / "t.json").write_text(GOOD_TRACE)
        argv = [str(work / "t.json"), "--repeat", repeat, "--json", fill(json_out, work)]
        if (_as_int(repeat) or 0) >= 1:
            argv[2] = "0"  # a valid count would run the other tools for real: keep to refusals
        outcome = check("analysis.bench.speed", argv, work, ("--repeat", "--json"))
        assert outcome.code == 2


# --- hpc.train: the run directory and the fault hook ---------------------------------------------------------

@pytest.fixture(scope="module")
def train_base(data_root):
    """hpc.train up to a late, known refusal: the model's classes do not match the data's (after the run
    directory is made and the data loaded), so no example trains."""
    return ["--config", SMOKE, "--data-root", str(data_root), "--no-profile", "--set", "model.num_classes=10"]


@given(run_dir=PATHS, fault=st.none() | ARGV_TEXT | st.sampled_from(["oom-at-step:1", "fail-at-step:2@batch=8",
                                                                      "kill-during-checkpoint", "oom-at-step:x"]))
@examples(40)
def test_train_any_run_dir_and_fault_hook(train_base, run_dir, fault):
    with workspace() as work:
        env = {"HPC_FAULT_INJECT": fault} if fault is not None else {}
        sources = ("--run-dir", "HPC_FAULT_INJECT", "model.num_classes")
        outcome = check("hpc.train", [*train_base, "--run-dir", fill(run_dir, work)], work, sources, env=env)
        assert outcome.code == 2


# --- every numeric flag of every command: one rule -----------------------------------------------------------

def _numeric(text: str, kind: type) -> bool:
    """Whether argparse's conversion of `text` gives a finite number within int64 (the one rule)."""
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        return False
    return math.isfinite(value) and (kind is float or abs(value) <= 2**63 - 1)


BASES = {
    "hpc.submit": ["--dry-run", "--account", "m1_g", "--config", SMOKE, "--runs-dir", "{T}/runs"],
    "hpc.distenv": ["--hostlist", "n1"],
    "hpc.data": ["synth", "--root", "/proc/none"],  # every size lands on the refused root, or on its own check
    "hpc.bench": ["--arch", "tiny", "--only", "none-such"],
    "analysis.bench.speed": ["{T}/file", "--json", "/proc/none.json"],
    "analysis.tensorboard": ["{T}/dir", "--host", "192.0.2.1"],
    "analysis": ["compare", "{T}/a", "{T}/b"],
    "hpc.rank": ["--outcome", "--run-dir", "{T}/none"],
}
BASE_SOURCES = {  # what a base's own, later refusal names (a valid number reaches it)
    "hpc.data": ("--root", "data root"), "hpc.bench": ("--only",), "analysis.bench.speed": ("--json",),
    "analysis.tensorboard": ("--host",), "analysis": ("{T}/a",), "hpc.rank": ("--run-dir",),
}
NUMERIC_FLAGS = [  # (command, flag, type): every flag of type int or float, as the completeness test checks
    *[("hpc.submit", f, int) for f in ("--nodes", "--gpus", "--max-parallel", "--batch-size", "--epochs",
                                      "--max-steps", "--grad-accum-steps", "--seed")],
    ("hpc.submit", "--lr", float),
    ("hpc.distenv", "--torchrun-args", int), ("hpc.distenv", "--max-restarts", int),
    ("hpc.data", "--train", int), ("hpc.data", "--test", int), ("hpc.data", "--seed", int),
    ("hpc.bench", "--steps", int), ("hpc.bench", "--warmup", int), ("hpc.bench", "--scaling-step-ms", float),
    ("analysis.bench.speed", "--repeat", int), ("analysis.tensorboard", "--port", int), ("analysis", "--rank", int),
    ("hpc.rank", "--stop-grace-s", int),
]


@given(case=st.sampled_from(NUMERIC_FLAGS), value=NUMBER_TEXT)
@examples(150)
def test_every_numeric_flag_takes_finite_numbers_only(case, value):
    module, flag, kind = case
    with workspace() as work:
        argv = [fill(a, work) for a in BASES[module]]
        argv = argv[:1] + [f"{flag}={value}"] + argv[1:] if module == "hpc.data" else argv + [f"{flag}={value}"]
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"} if module == "hpc.distenv" else None
        base = tuple(fill(a, work) for a in BASE_SOURCES.get(module, ()))
        outcome = check(module, argv, work, (flag, *base), env=env)
        if not _numeric(value, kind):
            assert outcome.code == 2 and flag in outcome.lines[0], (value, outcome.lines)
        if outcome.code == 0:
            assert not re.search(r"\b(nan|inf)\b", outcome.stdout.lower()), outcome.stdout[-500:]


def test_the_numeric_flags_table_is_complete():
    """Every add_argument(..., type=int|float) in the commands is in NUMERIC_FLAGS."""
    declared = set()
    for path in list((REPO / "hpc").rglob("*.py")) + list((REPO / "analysis").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                kinds = [k.value.id for k in node.keywords if k.arg == "type" and isinstance(k.value, ast.Name)]
                flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
                if kinds and kinds[0] in ("int", "float"):
                    declared.update(flags)
    from hpc.settings.flags import FLAGS

    declared |= {"--" + name.replace("_", "-") for name, (_, kind, _) in FLAGS.items() if kind in (int, float)}
    assert declared == {flag for _, flag, _ in NUMERIC_FLAGS}
