import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from tiers import REPO, SHARED_TRACES, Tiers, browser_missing  # noqa: F401  (tests import SHARED_TRACES from here)

# Property-based tests (tests/unit/test_properties_*.py): CI runs a fixed, derandomized sequence of
# examples within its time budget; `HYPOTHESIS_PROFILE=long HPC_FUZZ_SCALE=20` runs fresh random ones,
# twenty times as many, by hand (tests/README.md).
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("long", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# What this machine lacks and a test stands in for (tests/standins: graph-standin's step), importable
# here and in every process a test starts; no user's run has it on its path.
STANDINS = REPO / "tests" / "standins"
sys.path.insert(0, str(STANDINS))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH", "")) if p)
# One thread a rank in every process the suite starts (its 2 cores are shared by two workers and the Slurm
# tier), as most tests already ask; the test of the thread rule itself (test_submit_local.py) drops it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# graph mode on this CPU: the one seam (hpc/training/graph/graphmode.py HPC_GRAPH_CAPTURE) names the stand-in
GRAPH_STANDIN = {"HPC_GRAPH_CAPTURE": "graphstandin:CAPTURE"}

GPU_RESULTS = REPO / "results" / "gpu"  # what tests/gpu/run.sh measured on an H100, committed
OWN_GPU_TRACE = GPU_RESULTS / "resnet152_rank0.pt.trace.json.gz"  # this toolkit's own ResNet152 trace
TB_PLUGIN = "/data/plugin/pytorch_profiler"  # torch-tb-profiler's HTTP API


def slurm_up() -> str | None:
    """None when the local test cluster answers, else why not."""
    if not shutil.which("sinfo"):
        return "no Slurm client on this machine (tests/slurm/cluster.sh installs it when run as root)"
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"Slurm cluster not running (sinfo: {r.stderr.strip()[:120]}); start it with tests/slurm/cluster.sh"
    idle = [line for line in r.stdout.splitlines() if line.split()[-1].startswith(("idle", "mix", "alloc"))]
    if len(idle) < 2:
        return f"Slurm cluster has fewer than 2 usable nodes: {r.stdout.strip()!r}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Tiers(slurm_up), "tiers")
    config.pluginmanager.import_plugin("cputime")


# Run last in their run: tests that keep both cores busy for minutes on end (32 ranks on 2 cores), so that
# the Slurm tier's tail, after the rest has ended beside it, computes rather than waits (tests/run.sh).
# Measured (tests/cputime.py over a clean-clone run): the other Slurm tests wait on the cluster for up to
# half their time, which the rest's tests fill while both run.
RUN_LAST = ("tests/e2e/test_many_ranks.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0] in RUN_LAST)  # stable: the order is kept otherwise


@pytest.fixture(autouse=True)
def command_logging():
    """Code called in-process logs as a command does (hpc/core/logs.py: INFO on stdout, warnings on
    stderr), not into pytest's own log capture, so tests read what a user would see."""
    from hpc.core.logs import configure

    configure()


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = slurm_up()
    if reason:
        pytest.skip(reason)
    return True


def run_module(module: str, *args: str, env: dict | None = None, cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m module args...` as a user would; returns the completed process."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, one line on stderr naming every needle, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def processes() -> dict[int, str]:
    """Every live process of this machine: pid -> command line (arguments joined by spaces)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    return found


_PORTS = itertools.count()


def free_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range: a port the kernel picks (bind to 0)
    may be handed to another socket's outgoing connection between this check and the server's bind; one
    below the range is never handed out by the kernel, so only an explicit bind can take it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    span = low - 20000  # 20000 and up, below the range (32768 by default)
    if span < 1000:  # a range set unusually low: the kernel's pick, as before
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    start = (os.getpid() * 97 + next(_PORTS) * 13) % span
    for offset in range(span):
        port = 20000 + (start + offset) % span
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


TB_TOKENS: dict[int, str] = {}  # port -> the token of analysis.tensorboard's URL (start_tensorboard reads it)
TB_PREFIXES: dict[int, str] = {}  # port -> the random path it serves under ('/Xy..'), from the same URL


def tb_base(port: int) -> str:
    """http://127.0.0.1:PORT and the server's path prefix, where it has one."""
    return f"http://127.0.0.1:{port}{TB_PREFIXES.get(port, '')}"


def tb_url(port: int, path: str = "/") -> str:
    """The URL analysis.tensorboard gave, for another path: its token in the query."""
    sep = "&" if "?" in path else "?"
    return tb_base(port) + path + (f"{sep}token={TB_TOKENS[port]}" if port in TB_TOKENS else "")


def http_get(port: int, path: str, timeout: float = 30) -> str:
    """GET a path of a server here; of one started by start_tensorboard, with its owner's cookie (what a
    browser holds once it opened the URL it gave)."""
    request = urllib.request.Request(tb_base(port) + path)
    if port in TB_TOKENS:
        request.add_header("Cookie", f"hpc_tb_{port}={TB_TOKENS[port]}")
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return r.read().decode()


def wait_until(condition, what: str, timeout_s: float = 180, every_s: float = 0.2):
    """condition()'s first true value, asked every `every_s`; an AssertionError saying what was awaited when
    none comes within timeout_s. A wait on a condition that can fail, never a clock."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(every_s)


def found(root: Path, pattern: str) -> list[Path]:
    """root.rglob(pattern), walked again where the tree changed under the walk: a running job makes and
    removes a folder (the run directory's writability probe, .hpc-probe-*) that a walk may list, then
    not find."""
    for _ in range(100):
        try:
            return list(root.rglob(pattern))
        except FileNotFoundError:
            continue
    raise AssertionError(f"{root} kept changing under a walk for {pattern}")


def has_lines(path: Path, lines: int) -> bool:
    return path.exists() and len(path.read_text().splitlines()) >= lines


def start_tensorboard(cmd: list[str], port: int, timeout_s: float = 90, log: Path | None = None) -> subprocess.Popen:
    """Start a TensorBoard command, its output into `log` (else a pipe); return once the profiler plugin
    lists its runs. analysis.tensorboard is given --url-file (its URL goes to a terminal or that file, never
    to its output): the URL's path prefix and token are kept for http_get and tb_url."""
    if "analysis.tensorboard" in cmd:
        url_file = Path(tempfile.mkdtemp(prefix="tb-url-")) / "url"
        cmd = [*cmd, "--url-file", str(url_file)]
    sink = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 (the process holds it)
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    deadline = time.time() + timeout_s
    if "analysis.tensorboard" in cmd:
        url = wait_until(lambda: url_file.exists() and url_file.read_text() or proc.poll() is not None and "(exited)",
                         "TensorBoard's URL file", timeout_s)
        found = re.fullmatch(r"http://127\.0\.0\.1:\d+(/[\w-]+)/\?token=([\w-]+)#pytorch_profiler\n", url)
        assert found, url + (log.read_text() if log is not None else "")
        TB_PREFIXES[port], TB_TOKENS[port] = found.groups()
    while time.time() < deadline:
        try:
            runs = json.loads(http_get(port, f"{TB_PLUGIN}/runs"))
            if not runs.get("loading") and runs.get("runs"):
                return proc
        except OSError:
            pass
        if proc.poll() is not None:
            raise AssertionError(log.read_text() if log is not None else proc.stdout.read())
        time.sleep(1)
    proc.kill()
    raise AssertionError("TensorBoard did not come up")


@contextlib.contextmanager
def headless_chromium(width: int = 1400, height: int = 1000, offline: bool = False):
    """Debian's chromium driven by selenium, headless; skips (saying why) where absent. offline: every host
    name but 127.0.0.1 fails to resolve, as on a compute node (this machine has no internet anyway; the
    rule makes the test not depend on that)."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--window-size={width},{height}", "--allow-file-access-from-files",
                *(["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"] if offline else [])]:
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        yield browser
    finally:
        browser.quit()


def tb_operator_row(port: int, run: str, name: str, worker: str = "rank0") -> dict:
    """One operator's row of the plugin's Operator view (calls, device self time, ...)."""
    table = json.loads(http_get(port, f"{TB_PLUGIN}/operation/table?run={run}&worker={worker}&span=1&group_by=Operation"))
    rows = table["data"] if isinstance(table["data"], list) else table["data"]["rows"]
    return next(r for r in rows if r["name"] == name)


@pytest.fixture(scope="session")
def straight_smoke_2x4(data_root, tmp_path_factory):
    """The weights smoke.yaml ends with after 4 epochs on 2 ranks, nothing stopped: the oracle of the tests
    that stop, resume, requeue or lose a node of that same training, here and on Slurm (one run for all of
    them in a pytest process, where each ran an uninterrupted run or job of its own beside the faulted one).
    Neither the launcher nor the nodes enter the arithmetic: one thread a rank, gloo's sum of two is exact,
    and test_many_ranks holds srun's and torchrun's jobs to the same weights bit for bit. Checkpoints,
    profiling and slowed steps do not either."""
    from trainrun import SMOKE, start_ranks, wait_all, weights

    run_dir = tmp_path_factory.mktemp("straight-smoke-2x4") / "run"
    ranks = wait_all(start_ranks(2, ["--config", SMOKE, "--data-root", str(data_root), "--run-dir", str(run_dir),
                                     "--epochs", "4", "--no-profile"]))
    assert [code for code, _, _ in ranks] == [0, 0], ranks
    return weights(run_dir)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """A synthetic CIFAR-100 in the real files' format (1000 training, 250 test images), shared by every
    test that trains; tests that need another size write their own."""
    from hpc.training import data

    root = tmp_path_factory.mktemp("data")
    data.synthesize(root, n_train=1000, n_test=250, seed=0)
    return root
