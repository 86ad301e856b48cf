"""The toolkit's start-up hook for your own command (the per-rank runner, hpc/launch/rank/runner.py, puts
this folder first on PYTHONPATH of a command's rank, with HPC_RUN_DIR set): Python imports
`sitecustomize` at start-up, so the script is profiled and watched with no change to it
(hpc/training/hook/scripthooks.py).
It never stops the script: any failure here is one line on stderr. A sitecustomize the environment had
before (a site's, a venv's) is run after it, as if this one were not there. Python started with -S or
-I does not load it.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _arm() -> None:
    try:
        from hpc.training.hook import scripthooks

        scripthooks.arm()
    except Exception as e:  # the user's run matters more than its profile
        sys.stderr.write(f"hpc: the start-up hook was not installed ({type(e).__name__}: {e})\n")


def _chain() -> None:
    """Run the sitecustomize this one hides, if there is one further down the path."""
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}\n")


if os.environ.get("HPC_RUN_DIR"):
    _arm()
_chain()
