"""TensorBoard with a working PyTorch Profiler tab: `python -m analysis.tensorboard LOGDIR [--port P]`.

torch-tb-profiler 0.4.3 (its last release; unmaintained upstream) maps trace categories through
`torch_tb_profiler.profiler.trace.EventTypeMap`, which knows the 2021 `Runtime` category but not
PyTorch 2.x's `cuda_runtime` / `cuda_driver`. Kernels are tied to operators through those runtime
events, so per-operator device times read 0. This module adds the two categories to the map when it
is imported, before TensorBoard loads the plugin. It also drops `gpu_user_annotation` (the GPU side
of record_function ranges, written since PyTorch 2.x): the plugin reads those as user annotations, so
each ProfilerStep#N counts twice, the duplicates overlap, and the Overview of a GPU trace fails with
a division by zero (seen on our own H100 traces, torch 2.11); the plugin rebuilds steps' device
ranges from kernels anyway. The plugin parses traces in *spawned* processes,
and a spawned process re-imports the parent's main module, so running this module as
`python -m analysis.tensorboard` patches those processes too. Nothing in site-packages is edited.

Offline (compute nodes, air-gapped sites): the Trace tab's page loads the Web Components polyfill
(webcomponents.js 0.7.24) from a CDN, and without it the timeline stays blank; the same file, from the
npm registry, ships in analysis/static/ (its licence beside it) and is served in its place. Google
Charts, which the Overview, Operator, Kernel, Memory and Distributed views draw with, are drawn by
Chart.js (also from npm, with its licence) through a stand-in for the calls the plugin makes
(static/offline_charts.js): pies, stacked bars, lines and timelines, the tables as tables. The console
keeps errors only: the plugin's per-operator "Tensor Cores eligible" lines and TensorBoard's repeated
Content-Security-Policy notice go (TORCH_PROFILER_LOG_LEVEL, if set, is kept).

LOGDIR may be a run directory (traces/ and tensorboard/ scalars side by side), a sweep directory or
any folder of them: TensorBoard shows the training scalars and the profiler traces together.

On a shared login node (docs/security.md): the server answers only under a random path, behind the token
gate (analysis/tbgate.py), whose cookie is scoped to that path, so a browser never sends it to another
user's server on another port of the host; the URL with the token goes to a terminal (or to a file of the
owner's alone: --url-file), never to a log; the port must be free on IPv4 and IPv6 loopback alike; and no
info file is written in /tmp/.tensorboard-info (world-writable: a link planted there for a future pid was
followed by TensorBoard's own writer).
For traces too large for TensorBoard, open them in Perfetto (https://ui.perfetto.dev, "Open trace
file"; it reads .json and .json.gz) or chrome://tracing.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

from analysis.tbgate import TokenGate, new_token
from hpc.core.cli import Parser, check_output_file, inspect_path, run
from hpc.core.errors import UsageError
from hpc.core.files import write_atomic

PATCHED_CATEGORIES = {"cuda_runtime": "Runtime", "cuda_driver": "Runtime"}
IGNORED_CATEGORIES = ("gpu_user_annotation",)
GCHARTS_TAG = '<script src="https://www.gstatic.com/charts/loader.js"></script>'
# Loaded only if Google's chart loader did not arrive (a browser without internet): Chart.js (npm's
# chart.js 4.6.1, MIT, its licence beside it), then the stand-in that draws Google's charts with it.
CHARTJS = "chart.umd.min.js"
OFFLINE_FALLBACK = (
    "<script>window.google && window.google.charts || "
    f'document.write(\'<script src="{CHARTJS}"><\\/script><script src="offline_charts.js"><\\/script>\')</script>'
)
STATIC = Path(__file__).resolve().parent / "static"
POLYFILL_CDN = "https://cdnjs.cloudflare.com/ajax/libs/webcomponentsjs/0.7.24/webcomponents.min.js"
POLYFILL = "webcomponents.min.js"  # served beside trace_embedding.html, so the relative src finds it
# Read by the plugin's logger in this process and in the loaders it spawns (which inherit it).
os.environ.setdefault("TORCH_PROFILER_LOG_LEVEL", "ERROR")


class _QuietNotices(logging.Filter):
    """TensorBoard warns on every page of a plugin without a CSP default-src (17 times a session)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("In 3.0, this warning will become an error")


def _static_route(name: str, content_type: str, text: str | None = None) -> Any:
    import werkzeug

    @werkzeug.Request.application  # plugin routes are WSGI apps
    def route(request):
        body = text if text is not None else (STATIC / name).read_text(encoding="utf-8")
        return werkzeug.Response(body, content_type=content_type)

    return route


def patch_tb_profiler() -> bool:
    """Teach torch-tb-profiler today's category names, and give its page an offline fallback for
    Google Charts. Returns False when the plugin is absent."""
    try:
        import werkzeug  # noqa: F401  (the routes below are its WSGI apps)
        from torch_tb_profiler import plugin
        from torch_tb_profiler.profiler import trace
    except ImportError:
        return False
    for category, kind in PATCHED_CATEGORIES.items():
        trace.EventTypeMap.setdefault(category, getattr(trace.EventTypes, kind.upper()))
    for category in IGNORED_CATEGORIES:
        trace.EventTypeMap.pop(category, None)

    cls = plugin.TorchProfilerPlugin
    if getattr(cls, "_hpc_patched", False):
        return True
    original_apps = cls.get_plugin_apps
    pages = Path(plugin.__file__).resolve().parent / "static"
    index = (pages / "index.html").read_text(encoding="utf-8").replace(GCHARTS_TAG, GCHARTS_TAG + OFFLINE_FALLBACK, 1)
    embedding = (pages / "trace_embedding.html").read_text(encoding="utf-8").replace(POLYFILL_CDN, POLYFILL, 1)

    def get_plugin_apps(self):
        apps = original_apps(self)
        apps["/index.html"] = _static_route("index.html", "text/html; charset=utf-8", index)
        apps["/offline_charts.js"] = _static_route("offline_charts.js", "application/javascript")
        apps[f"/{CHARTJS}"] = _static_route(CHARTJS, "application/javascript")
        apps["/trace_embedding.html"] = _static_route("trace_embedding.html", "text/html; charset=utf-8", embedding)
        apps[f"/{POLYFILL}"] = _static_route(POLYFILL, "application/javascript")
        return apps

    cls.get_plugin_apps = get_plugin_apps
    cls._hpc_patched = True
    logging.getLogger("tensorboard").addFilter(_QuietNotices())
    return True


# At import, so that the plugin's spawned loader processes (which import this module) get it too.
PLUGIN_PATCHED = patch_tb_profiler()


LOOPBACKS = ("127.0.0.1", "::1")


def check_listen(host: str, port: int) -> None:
    """Before TensorBoard starts (its own failure is tens of lines from child processes): the port is
    a port, the host an address here, and nothing listens there yet; on loopback, on IPv6's too (a
    browser asked for localhost may go to another user's server on [::1])."""
    import socket

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: must be 0..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host {host!r}: not an address ({e})") from None
    family, _, _, _, address = infos[0]
    _bind_or_refuse(socket.socket(family, socket.SOCK_STREAM), address, f"--host {host!r} --port {port}")
    if address[0] in LOOPBACKS and port:
        other = LOOPBACKS[1 - LOOPBACKS.index(address[0])]
        family = socket.AF_INET6 if ":" in other else socket.AF_INET
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here: nothing can listen there either
            return
        _bind_or_refuse(probe, (other, port), f"--port {port} (on {other}, the other loopback)", absent_ok=True)


def _bind_or_refuse(sock: Any, address: Any, what: str, absent_ok: bool = False) -> None:
    import socket

    with sock:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if absent_ok and e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                return  # that loopback does not exist here
            raise UsageError(f"{what}: cannot listen there ({e.strerror or e})") from None


def gated_server(app: Any, flags: Any, token: str, port: int, prefix: str) -> Any:
    """TensorBoard's server with the token gate in front, and without its own "serving at" line, which
    would print the random path to stderr (a log)."""
    from tensorboard import program

    server = program.WerkzeugServer(TokenGate(app, token, port, prefix), flags)
    server.print_serving_message = lambda: None
    return server


def tell_url(url: str, url_file: str | None) -> str:
    """Where the URL with its token goes: --url-file (the owner's alone), else the terminal (stdout when
    it is one, else the controlling terminal), never a log file or pipe. Returns where it went, in words;
    UsageError when there is nowhere to show it."""
    if url_file:
        write_atomic(url_file, url + "\n", mode=0o600)
        return f"in {url_file}"
    if sys.stdout.isatty():
        return "below"
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"{url}\n")
        return "on your terminal"
    except OSError:
        raise UsageError(
            "no terminal to show the URL on (its token opens the server, and stdout is a file or a pipe): give "
            "--url-file PATH (written for you alone)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m analysis.tensorboard",
        description="Start TensorBoard with the PyTorch Profiler plugin fixed for "
        "PyTorch 2.x traces, plus the training scalars.",
        needs_args=True,
    )
    parser.add_argument("logdir", help="a run directory, a sweep directory, or a folder of them")
    parser.add_argument("--port", type=int, default=6006, help="port to serve on (default 6006)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument(
        "--url-file",
        metavar="PATH",
        help="write the URL (its token opens the server) to this file, readable by you alone, instead of to "
        "the terminal",
    )
    args = parser.parse_args(argv)
    logdir = Path(args.logdir)
    status = inspect_path(logdir, "logdir")
    if status is None or not stat.S_ISDIR(status.st_mode):
        raise UsageError(f"{args.logdir}: not a directory")
    if not PLUGIN_PATCHED:
        raise UsageError("torch-tb-profiler is not installed (pip install torch-tb-profiler)")
    check_output_file(args.url_file, "--url-file")
    check_listen(args.host, args.port)
    from tensorboard import program

    token, prefix = new_token(), "/" + secrets.token_urlsafe(12)  # the prefix scopes the token's cookie
    tb = program.TensorBoard(server_class=lambda app, flags: gated_server(app, flags, token, args.port, prefix))
    # No info file: TensorBoard writes one per server into /tmp/.tensorboard-info (made 0777, not sticky, by
    # whoever came first), following a link planted at its name; only `tensorboard --list` reads them.
    tb._register_info = lambda server: None
    tb.configure(
        argv=[
            sys.argv[0],
            "--logdir",
            str(logdir),
            "--port",
            str(args.port),
            "--host",
            args.host,
            "--path_prefix",
            prefix,
            "--reload_interval",
            "5",
            "--load_fast",
            "false",  # the Python loader: no "experimental fast data loading" notice, same scalars here
        ]
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}{prefix}/?token={token}#pytorch_profiler"
    where = tell_url(url, args.url_file)
    print_started(host, args.port, logdir, where, url if where == "below" else None)
    return tb.main()


def print_started(host: str, port: int, logdir: Path, where: str, url: str | None) -> None:
    print(
        f"TensorBoard on {host}:{port} (logdir {logdir}); the URL that opens it is {where} (its token is yours: "
        "only it gets in); Ctrl-C stops it",
        flush=True,
    )
    if url is not None:
        print(url, flush=True)


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m analysis.tensorboard`, or its console script): errors as one line, exit 2."""
    return run("analysis.tensorboard", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
