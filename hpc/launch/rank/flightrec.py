"""NCCL's Flight Recorder for a user's script, with no change to it: the per-rank runner gives the task
torch's variables for it (unless the environment set them already), so that torch records each rank's
last collectives (TORCH_FR_BUFFER_SIZE entries; before torch 2.8 TORCH_NCCL_TRACE_BUFFER_SIZE), dumps
them on its own watchdog's timeout, and dumps them on request: torch reads a named pipe
(TORCH_NCCL_DEBUG_INFO_PIPE_FILE + rank + ".pipe") and a write there makes it dump to
TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank. The runner's hang watch
(hpc/launch/rank/hang.py) writes there when it finds its rank silent: the dump names the collective each rank
entered last and the one it never did (torch's analyzer: `python -m torch.distributed.flight_recorder.fr_trace`).
Only a NCCL process group (a GPU) records; with gloo nothing is made and nothing is asked. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from hpc.core.rundir import RunPaths
from hpc.placement.torchrun import torch_version

TRACE_ENTRIES = 2000  # torch's tutorial's value: a few steps' collectives, a few MB at most
# The buffer's size: torch 2.8 named it TORCH_FR_BUFFER_SIZE, and warns on every rank at the old name; an
# older torch reads the old name alone.
BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def buffer_variable(version: tuple[int, int] | None) -> str:
    """The buffer size's name for this torch (the old one when its version cannot be read: it works)."""
    return BUFFER_NAMES[0] if version is not None and version >= (2, 8) else BUFFER_NAMES[1]


def recorder_env(paths: RunPaths, env: Mapping[str, str]) -> dict[str, str]:
    """The recorder's variables for a rank, none that `env` sets already (the buffer under either name)."""
    set_already = any(env.get(name) for name in BUFFER_NAMES)
    buffer = {} if set_already else {buffer_variable(torch_version()): str(TRACE_ENTRIES)}
    wanted = {
        **buffer,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(paths.flight_recorder_prefix),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(paths.flight_recorder_pipe_prefix),
    }
    return {k: v for k, v in wanted.items() if k not in env}


def ask_for_dump(pipe: Path) -> bool:
    """Ask torch's watchdog for a dump through its pipe; False where there is none (no NCCL group, or
    nobody reading it: the open fails at once, never blocks)."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.write(fd, b"1")
    os.close(fd)
    return True
