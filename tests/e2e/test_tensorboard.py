"""python -m analysis.tensorboard: the PyTorch Profiler tab works on today's traces, in a real
headless Chromium, with the training scalars alongside."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import (OWN_GPU_TRACE, REPO, SHARED_TRACES, TB_PLUGIN, TB_PREFIXES, TB_TOKENS, free_port,
                      headless_chromium, http_get, start_tensorboard, tb_base, tb_operator_row, tb_url)
from hpc.training import data
from trainrun import SMOKE, train

ARTIFACTS = Path(os.environ.get("HPC_ARTIFACTS", REPO / "artifacts"))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    data.synthesize(root / "data", n_train=300, n_test=100)
    train(2, ["--config", SMOKE, "--data-root", str(root / "data"), "--run-dir", str(root / "logs" / "smoke"),
              "--max-steps", "6", "--set", "train.log_every_steps=2"])
    if SHARED_TRACES.is_dir():  # a real GPU trace (PyTorch 2.x, cuda_runtime events)
        (root / "logs" / "nccl_data").mkdir()
        shutil.copy(SHARED_TRACES / "hta_single/nccl_data.json.gz", root / "logs" / "nccl_data" / "rank0.1.pt.trace.json.gz")
    (root / "logs" / "h100").mkdir()  # our own GPU trace: PyTorch 2.11, gpu_user_annotation events
    shutil.copy(OWN_GPU_TRACE, root / "logs" / "h100" / "rank0.1.pt.trace.json.gz")
    return root / "logs"


@pytest.fixture(scope="module")
def server(logdir):
    port = free_port()
    log = logdir.parent / "tensorboard.log"  # what the command printed, read by test_the_console_keeps_errors_only
    proc = start_tensorboard([sys.executable, "-m", "analysis.tensorboard", str(logdir), "--port", str(port)], port,
                             log=log)
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def api_json(port: int, route: str) -> dict:
    """The plugin's API (some routes answer gzip'd whatever was asked), as its owner reads it."""
    request = urllib.request.Request(f"{tb_base(port)}{TB_PLUGIN}/{route}")
    request.add_header("Cookie", f"hpc_tb_{port}={TB_TOKENS[port]}")
    with urllib.request.urlopen(request, timeout=60) as r:
        raw = r.read()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def curl(*args: str) -> tuple[int, str, str]:
    """(HTTP status, headers, body) of a request by curl, as another user of the node would make it."""
    out = subprocess.run(["curl", "-s", "-D", "-", "--max-time", "30", *args], capture_output=True)
    head, _, body = out.stdout.decode(errors="replace").partition("\r\n\r\n")  # bytes: the CRLFs kept
    return int(head.split()[1]), head, body


def test_only_its_owner_gets_in(server):
    """Issue 53: on a shared login node anyone can reach 127.0.0.1; only the printed URL's token (or the
    cookie it leaves) gets in. Without it, or with another, every path is refused and shows nothing of
    the runs."""
    paths = ["/", "/#pytorch_profiler", f"{TB_PLUGIN}/runs", f"{TB_PLUGIN}/index.html", "/data/plugin/scalars/tags",
             f"{TB_PLUGIN}/overview?run=h100&worker=rank0&span=1", "/data/runs"]
    for path in paths:
        for base in (f"http://127.0.0.1:{server}", tb_base(server)):  # at the root, and under its random path
            for extra in ([], ["-b", f"hpc_tb_{server}=not-the-token"], ["-G", "--data-urlencode", "token=guess"]):
                status, _, body = curl(*extra, f"{base}{path}")
                assert status == 403 and body.startswith("403: this TensorBoard is its owner's"), (path, body)
                assert "smoke" not in body and "h100" not in body and "rank0" not in body, (path, body)
    status, head, _ = curl(tb_url(server, "/"))  # the URL it gave: the token becomes this port's cookie...
    prefix = TB_PREFIXES[server]
    assert len(prefix) >= 16  # ... for its random path alone: a browser sends it to no other server of the host
    assert status == 302 and f"Set-Cookie: hpc_tb_{server}={TB_TOKENS[server]}; Path={prefix}/; HttpOnly" in head
    assert "token=" not in head.split("Location:", 1)[1].splitlines()[0]  # and leaves the address bar
    status, _, body = curl("-b", f"hpc_tb_{server}={TB_TOKENS[server]}", f"{tb_base(server)}{TB_PLUGIN}/runs")
    assert status == 200 and "smoke/traces" in body


@pytest.mark.browser
def test_the_cookie_reaches_no_other_server_of_the_host(server):
    """Issue 62: a browser sends a cookie of 127.0.0.1 to every port of it; another user's server on another
    port (which records what it is sent, as theirs would) must get nothing of the token after the owner
    opened the URL, wherever the attacker lures the browser (the root, TensorBoard's own paths)."""
    import http.server
    import threading

    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(f"{self.path} {self.headers.get('Cookie')}")
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>theirs</html>")

        def log_message(self, *args):
            pass

    theirs = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=theirs.serve_forever, daemon=True).start()
    with headless_chromium() as browser:
        browser.get(tb_url(server, "/"))  # the owner opens the URL: the cookie is set
        assert any(c["name"] == f"hpc_tb_{server}" for c in browser.get_cookies())
        for path in ("/", "/data/plugin/pytorch_profiler/runs", "/#pytorch_profiler"):
            browser.get(f"http://127.0.0.1:{theirs.server_port}{path}")
    theirs.shutdown()
    assert len(seen) >= 3 and not [line for line in seen if TB_TOKENS[server] in line], seen


def test_runs_workers_and_scalars(server):
    runs = json.loads(http_get(server, f"{TB_PLUGIN}/runs"))["runs"]
    assert "smoke/traces" in runs
    assert json.loads(http_get(server, f"{TB_PLUGIN}/workers?run=smoke/traces&view=Overview")) == ["rank0", "rank1"]
    overview = json.loads(http_get(server, f"{TB_PLUGIN}/overview?run=smoke/traces&worker=rank0&span=1"))
    assert overview["steps"]["rows"]  # the step time breakdown has rows
    tags = json.loads(http_get(server, "/data/plugin/scalars/tags"))
    assert "train/loss" in tags["smoke/tensorboard"]


@pytest.mark.traces
def test_gpu_trace_gets_device_time_per_operator(server, logdir):
    row = tb_operator_row(server, "nccl_data", "aten::cudnn_convolution")
    assert row["device_self_duration"] > 0 and row["calls"] == 159


def test_own_h100_trace_has_steps_and_device_time(server):
    """torch 2.11 traces carry the GPU side of ProfilerStep#N ranges; unpatched, the plugin counts
    each step twice and its Overview fails (division by zero), so the run shows no worker."""
    assert json.loads(http_get(server, f"{TB_PLUGIN}/workers?run=h100&view=Overview")) == ["rank0"]
    overview = json.loads(http_get(server, f"{TB_PLUGIN}/overview?run=h100&worker=rank0&span=1"))
    assert [r[0] for r in overview["steps"]["rows"]] == ["2", "3"]
    row = tb_operator_row(server, "h100", "aten::cudnn_convolution")
    assert row["calls"] == 2 * 155 and row["device_self_duration"] > 0


@pytest.mark.traces
def test_the_unpatched_plugin_shows_zero_device_time(logdir):
    """Why the launcher exists: plain TensorBoard with torch-tb-profiler 0.4.3 reads 0 here. If this
    starts failing, upstream fixed the plugin and the patch can go."""
    port = free_port()
    proc = start_tensorboard([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port)], port)
    try:
        assert tb_operator_row(port, "nccl_data", "aten::cudnn_convolution")["device_self_duration"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.browser
def test_profiler_tab_in_headless_chromium(server):
    with headless_chromium() as browser:
        from selenium.webdriver.common.by import By

        choose = _open_profiler(browser, server)
        deadline = time.time() + 60
        assert "smoke/traces" in choose(0, "smoke/traces")
        assert choose(2, "rank0") == ["rank0", "rank1"]  # the Workers list shows every rank
        body = ""
        while time.time() < deadline:
            body = browser.find_element(By.TAG_NAME, "body").text
            if "Step Time Breakdown" in body and "Execution Summary" in body:
                break
            time.sleep(1)
        assert "Step Time Breakdown" in body and "Execution Summary" in body, body[:500]
        browser.switch_to.default_content()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "tensorboard-profiler-overview.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")


def until(browser, condition, what: str, timeout_s: float = 60):
    """condition()'s first true value, asked every 0.2 s (a page redrawn meanwhile is asked again); an
    AssertionError naming `what` when there is none within timeout_s."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, timeout_s, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    try:
        return wait.until(lambda _: condition())
    except TimeoutException:
        raise AssertionError(f"{what}: not within {timeout_s} s") from None


def _open_profiler(browser, port: int):
    """The plugin's page in its iframe, and its select(index, label) -> the labels it offered. Each pick
    waits on the page: for the options to be listed, then for the selector to show the label picked."""
    from selenium.webdriver.common.by import By

    browser.get(tb_url(port, "/") + "#pytorch_profiler")  # the URL the command printed
    browser.switch_to.frame(until(browser, lambda: browser.find_elements(By.TAG_NAME, "iframe"), "the plugin's iframe")[0])

    def selectors():
        found = browser.find_elements(By.CSS_SELECTOR, "[aria-haspopup=listbox]")
        return found if len(found) >= 3 else None  # runs, views, workers

    until(browser, selectors, "the plugin's three selectors")

    def choose(index: int, label: str) -> list[str]:
        selectors()[index].click()
        options = until(browser, lambda: [o for o in browser.find_elements(By.CSS_SELECTOR, "[role=option]")
                                          if o.text == label] and browser.find_elements(By.CSS_SELECTOR, "[role=option]"),
                        f"option {label!r} of selector {index}")
        labels = [o.text for o in options]
        next(o for o in options if o.text == label).click()
        until(browser, lambda: not browser.find_elements(By.CSS_SELECTOR, "[role=option]")
              and selectors()[index].text == label, f"selector {index} showing {label!r}")
        return labels

    return choose


# Counted in the trace view's own model: slices on every thread it drew.
COUNT_SLICES = """const v = document.getElementById('trace-viewer');
if (!v || !v.model) { return -1; }
let n = 0; for (const t of v.model.getAllThreads()) { n += t.sliceGroup.slices.length; } return n;"""


# Every chart the plugin page drew, as Chart.js holds it (the offline stand-in draws with it).
CHARTS = """if (!window.Chart) { return null; }
return Object.values(Chart.instances).map(c => ({type: c.config.type, labels: (c.data.labels || []).map(String),
  drawn: c.data.datasets.map((d, i) => c.getDatasetMeta(i).data.length),
  stacked: !!(c.options.scales && c.options.scales.x && c.options.scales.x.stacked)}));"""


def charts_drawn(browser, timeout_s: float = 60) -> list[dict]:
    """The charts of the view on the page, once they are all drawn: each a canvas Chart.js drew in the
    stand-in's box (a table would be no canvas), as many canvases as Chart.js holds charts (a view's
    charts come one by one, and the view left behind takes its own away), the same on two asks in a row."""
    from selenium.webdriver.common.by import By

    last: list = []

    def settled():
        found = browser.execute_script(CHARTS) or []
        canvases = len(browser.find_elements(By.CSS_SELECTOR, "div.offline-chart > canvas"))
        done = found if found and len(found) == canvases and found == last else None
        last[:] = found
        return done

    return until(browser, settled, "the view's charts, drawn as canvases", timeout_s)


@pytest.mark.browser
def test_the_charts_draw_without_a_network(server):
    """Offline, Google Charts cannot load: the Overview's execution summary and step-time breakdown, the
    Operator and Kernel pies and the memory curves are drawn by the vendored Chart.js, each a chart and
    not a table (charts_drawn waits for exactly that). The Overview's are held to the plugin's own numbers
    (its overview API)."""
    overview = json.loads(http_get(server, f"{TB_PLUGIN}/overview?run=h100&worker=rank0&span=1"))
    categories = [c["name"] for c in overview["performance"][0]["children"]]
    series = [c["name"] for c in overview["steps"]["columns"][1:] if c["type"] == "number" and not c.get("role")]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with headless_chromium(offline=True) as browser:
        choose = _open_profiler(browser, server)
        choose(0, "h100")
        seen = {}
        for view in ("Overview", "Operator", "GPU Kernel", "Memory"):
            choose(1, view)
            seen[view] = charts_drawn(browser)
            browser.save_screenshot(str(ARTIFACTS / f"tensorboard-offline-{view.split()[-1].lower()}.png"))
    pie, steps = seen["Overview"]
    assert pie["type"] == "doughnut" and pie["labels"] == categories and pie["drawn"] == [len(categories)]
    assert steps["type"] == "bar" and steps["stacked"] and len(steps["drawn"]) == len(series)
    assert steps["labels"] == [str(r[0]) for r in overview["steps"]["rows"]]
    assert all(n == len(overview["steps"]["rows"]) for n in steps["drawn"])
    # the pies and the curve against the plugin's own API: each pie's slices are the largest of one of its
    # tables (the page draws the top few), a slice each; the curve a point per row, allocated and reserved
    query = "run=h100&worker=rank0&span=1"
    tables = [[name for name, _ in sorted(table["rows"], key=lambda row: -row[1])] for table in
              (*api_json(server, f"operation?{query}&group_by=Operation").values(),
               *api_json(server, f"kernel?{query}&group_by=Kernel").values(),
               *api_json(server, f"kernel/tc_pie?{query}").values())]
    for view in ("Operator", "GPU Kernel"):
        assert seen[view], view
        for chart in seen[view]:
            named = [label for label in chart["labels"] if label.lower() != "other"]
            assert chart["type"] == "doughnut" and chart["drawn"] == [len(chart["labels"])] and len(named) > 1
            assert any(set(table[: len(named)]) == set(named) for table in tables), (view, chart["labels"])
    memory = api_json(server, f"memory_curve?{query}")
    (curve,) = seen["Memory"]
    rows = memory["rows"][memory["metadata"]["default_device"]]
    assert curve["type"] == "line" and curve["drawn"] == [len(rows), len(rows)], (curve, len(rows))


@pytest.mark.browser
@pytest.mark.parametrize("run", ["smoke/traces", "h100"])
def test_the_trace_tab_draws_without_a_network(server, run):
    """torch-tb-profiler's trace view asks a CDN for the Web Components polyfill; offline its timeline
    stays blank (plain TensorBoard: no viewer at all). Served from analysis/static, it draws: a CPU run of
    this toolkit and the committed H100 trace, in a browser that can resolve no host but this one."""
    from selenium.webdriver.common.by import By

    with headless_chromium(offline=True) as browser:
        choose = _open_profiler(browser, server)
        choose(0, run)
        assert "Trace" in choose(1, "Trace")
        deadline, slices = time.time() + 90, -1
        while time.time() < deadline and slices <= 0:
            for frame in browser.find_elements(By.TAG_NAME, "iframe"):
                browser.switch_to.frame(frame)
                slices = max(slices, browser.execute_script(COUNT_SLICES))
                browser.switch_to.parent_frame()
            time.sleep(1)
        assert slices > (50_000 if run == "h100" else 1_000), slices  # every operator and kernel of the window
        browser.switch_to.default_content()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / f"tensorboard-trace-{run.split('/')[0]}.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000


def test_the_console_keeps_errors_only(server, logdir):
    """The plugin's per-operator "Tensor Cores eligible" warnings (40 for the H100 trace), TensorBoard's
    CSP notice on every page, and its fast-loader note are gone; the address line stays. Read from the
    module's server (its output in a file; stderr is line-buffered), after the pages that would print them."""
    for _ in range(3):
        http_get(server, f"{TB_PLUGIN}/index.html")
    http_get(server, f"{TB_PLUGIN}/overview?run=h100&worker=rank0&span=1")
    http_get(server, f"{TB_PLUGIN}/operation/table?run=h100&worker=rank0&span=1&group_by=Operation")
    out = (logdir.parent / "tensorboard.log").read_text()
    assert out.startswith(f"TensorBoard on 127.0.0.1:{server} (logdir {logdir}); the URL that opens it is in "), out[:300]
    assert TB_TOKENS[server] not in out and TB_PREFIXES[server] not in out  # the URL never reaches a log
    for noise in ("Tensor Cores eligible", "In 3.0, this warning", "fast data loading", "INFO:pytorch_profiler"):
        assert noise not in out, out[-2000:]