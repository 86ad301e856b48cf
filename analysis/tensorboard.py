"""TensorBoard with a working PyTorch Profiler tab: `python -m analysis.tensorboard LOGDIR [--port P]`.

torch-tb-profiler 0.4.3 (its last release; unmaintained upstream) maps trace categories through
`torch_tb_profiler.profiler.trace.EventTypeMap`, which knows the 2021 `Runtime` category but not
PyTorch 2.x's `cuda_runtime` / `cuda_driver`. Kernels are tied to operators through those runtime
events, so per-operator device times read 0. This module adds the two categories to the map when it
is imported, before TensorBoard loads the plugin. The plugin parses traces in *spawned* processes,
and a spawned process re-imports the parent's main module, so running this module as
`python -m analysis.tensorboard` patches those processes too. Nothing in site-packages is edited.

LOGDIR may be a run directory (traces/ and tensorboard/ scalars side by side), a sweep directory or
any folder of them: TensorBoard shows the training scalars and the profiler traces together.
For traces too large for TensorBoard, open them in Perfetto (https://ui.perfetto.dev, "Open trace
file"; it reads .json and .json.gz) or chrome://tracing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PATCHED_CATEGORIES = {"cuda_runtime": "Runtime", "cuda_driver": "Runtime"}


def patch_tb_profiler() -> bool:
    """Teach torch-tb-profiler today's category names. Returns False when the plugin is absent."""
    try:
        from torch_tb_profiler.profiler import trace
    except ImportError:
        return False
    for category, kind in PATCHED_CATEGORIES.items():
        trace.EventTypeMap.setdefault(category, getattr(trace.EventTypes, kind.upper()))
    return True


# At import, so that the plugin's spawned loader processes (which import this module) get it too.
PLUGIN_PATCHED = patch_tb_profiler()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tensorboard",
                                     description="Start TensorBoard with the PyTorch Profiler plugin fixed for "
                                     "PyTorch 2.x traces, plus the training scalars.")
    parser.add_argument("logdir", help="a run directory, a sweep directory, or a folder of them")
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    args = parser.parse_args(argv)
    logdir = Path(args.logdir)
    if not logdir.is_dir():
        print(f"analysis.tensorboard: error: {logdir}: not a directory", file=sys.stderr)
        return 2
    if not PLUGIN_PATCHED:
        print("analysis.tensorboard: error: torch-tb-profiler is not installed (pip install torch-tb-profiler)",
              file=sys.stderr)
        return 2
    from tensorboard import program

    tb = program.TensorBoard()
    tb.configure(argv=[sys.argv[0], "--logdir", str(logdir), "--port", str(args.port), "--host", args.host,
                       "--reload_interval", "5"])
    print(f"TensorBoard on http://{args.host}:{args.port}/#pytorch_profiler (logdir {logdir}); Ctrl-C stops it",
          flush=True)
    return tb.main()


if __name__ == "__main__":
    sys.exit(main())
