"""Where the ranks of one start of a run meet: the run's store, known to its ranks alone (docs/security.md).

torch's TCPStore has no authentication: anyone on the node who reaches its port can list its keys
(`list_keys` answers any client), read and write them. Its port used to be computed from the job id (in
`squeue` and in every rank's argv), so another user could also take it first, or host a store of their
own there. So a run's store is set up here, for every task (the toolkit's training and a user's script
alike), by the per-rank runners before any task starts:

- the port is the kernel's pick (bind to port 0) at the node's own address (MASTER_ADDR's: loopback for a
  run on one machine), bound and listening in rank 0's runner before any task starts and handed to rank
  0's task as that socket (HPC_STORE_FD, where the task hosts its TCPStore: `master_listen_fd`): nothing
  another user can compute, no moment at which another user could take it;
- a secret of 32 random bytes, drawn by rank 0's runner;
- both reach the other ranks' runners in RUN/ranks/meeting.json (written for the owner alone, in a run
  directory that is the owner's: hpc/core/owner.py), with the start they belong to (`group`), and each
  rank's task in its environment (MASTER_PORT, HPC_STORE_SECRET; a process's environment is its owner's);
- the store's every key is named and every value sealed with keys drawn from the secret
  (hpc/training/distributed/runstore.py): a user without it sees names that say nothing and values it can neither
  read nor forge, and a value it writes is refused, in one line, by the rank that reads it.

Under `cluster.launcher: torchrun`, torchrun picks the port (its own free-port pick) and its agents' own
rendezvous store has no secret; the ranks' store is sealed all the same. No torch import.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import hmac
import json
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpc.core.errors import StoreError
from hpc.core.files import read_json, write_atomic

SECRET_VARIABLE = "HPC_STORE_SECRET"  # the run's secret, hex: in each rank's environment
LISTEN_FD_VARIABLE = "HPC_STORE_FD"  # rank 0's task: the listening socket its store serves on
POLL_S = 0.2
MEET_TIMEOUT_S = 300  # the others wait this long for rank 0's runner (the nodes of a step start within seconds)


@dataclasses.dataclass(frozen=True)
class Meeting:
    """One start's store: which start (`group`), its address, and the secret its ranks share."""

    group: str
    host: str
    port: int
    secret: str

    def env(self) -> dict[str, str]:
        """A rank's task's variables: torch's MASTER_ADDR and MASTER_PORT, and the secret."""
        return {"MASTER_ADDR": self.host, "MASTER_PORT": str(self.port), SECRET_VARIABLE: self.secret}


def new_secret() -> str:
    return secrets.token_hex(32)


def derive(secret: str, purpose: bytes) -> bytes:
    """A key for one use (naming keys, sealing values), drawn from the run's secret (HMAC-SHA256)."""
    return hmac.new(bytes.fromhex(secret), purpose, hashlib.sha256).digest()


def secret_from(env: Mapping[str, str]) -> str | None:
    """The run's secret from a rank's environment, or None; one that is not 64 hex digits is refused."""
    value = env.get(SECRET_VARIABLE)
    if not value:
        return None
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise StoreError(f"{SECRET_VARIABLE}: not a secret of this toolkit's (64 hex digits)")
    return value


def listen(host: str, port: int = 0) -> socket.socket:
    """A socket bound at `host`'s address (port 0: the kernel's pick among free ports) and listening; a
    port already taken is one line (StoreError: exit 1, never requeued)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as e:
        raise StoreError(f"MASTER_ADDR {host!r}: not an address of this node ({e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:  # resolved, but to an address no interface of this node has
            raise StoreError(f"MASTER_ADDR {host!r}: not an address of this node ({e.strerror})") from None
        raise StoreError(
            f"the run's store could not listen at {host}:{port} ({e.strerror or e}): another process holds it"
        ) from None
    return sock


def free_port(host: str) -> int:
    """A port free at `host`'s address now (the kernel's pick), for a process that binds it soon after:
    torchrun's agents' rendezvous, a batch shell's export. Not held: the ranks' own store is (`listen`)."""
    with listen(host) as sock:
        return int(sock.getsockname()[1])


def publish(path: Path, meeting: Meeting) -> None:
    """Rank 0's runner (torchrun's first agent): the meeting at `path` (RUN/ranks/meeting.json),
    for the owner alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(dataclasses.asdict(meeting)), mode=0o600)


def read_meeting(path: Path, group: str) -> Meeting | None:
    """The meeting of start `group` at `path`, once it is published."""
    record = read_json(path) if path.exists() else None
    if not isinstance(record, dict) or record.get("group") != group:
        return None
    try:
        meeting = Meeting(**record)
    except TypeError:
        return None
    ok = isinstance(meeting.port, int) and 0 < meeting.port < 65536 and isinstance(meeting.host, str)
    return meeting if ok and isinstance(meeting.secret, str) else None


def await_meeting(
    path: Path, group: str, timeout_s: float, give_up: Callable[[], str | None]
) -> tuple[Meeting | None, str]:
    """Another rank's runner: rank 0's meeting of `group` at `path`, polled every POLL_S for at most
    timeout_s; (None, why) when it did not come or `give_up()` says why to stop waiting (a stop signal, a
    failed peer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        meeting = read_meeting(path, group)
        if meeting is not None:
            return meeting, ""
        why = give_up()
        if why:
            return None, why
        if time.monotonic() > deadline:
            return None, (
                f"rank 0 did not publish where the run meets ({path}) within {timeout_s:g} s: it never started, "
                "or not on a file system this node sees"
            )
        time.sleep(POLL_S)
