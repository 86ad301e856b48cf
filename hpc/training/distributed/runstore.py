"""The run's store as its ranks alone can use it (hpc/core/meet.py says why and how it is set up): the
one place a rank's TCPStore is made, for the toolkit's training (hpc/training/distributed/rendezvous.py) and for a
user's script (its `init_process_group`, through the start-up hook: `patch_rendezvous`).

- `run_store(...)`: rank 0 hosts the store on the listening socket its runner handed it (HPC_STORE_FD,
  bound at the node's address: TCPStore's `master_listen_fd`), the others connect; sealed with the run's
  secret (HPC_STORE_SECRET) where there is one.
- `SealedStore`: a torch Store over another whose every key is named by HMAC-SHA256 and every value
  sealed by AES-GCM (the `cryptography` package's, with the key's name bound in), both keyed from the
  secret. torch's own keys (gloo's addresses, NCCL's unique id with its bootstrap magic, the store-based
  barrier's counts) go through it like the toolkit's: a user of the node who connects lists names that
  say nothing and reads nothing, and a value it writes is refused by the rank that reads it (StoreError,
  one line: the run stops, not requeued). Counts (`add`) are sealed too, by compare-and-set.
- `patch_rendezvous(module)`: torch's `_create_c10d_store`, which its env:// and tcp:// rendezvous call,
  makes the store of the run's own address through `run_store`; any other address is the script's own.

TCPStore itself cannot check a secret (no authentication in its protocol): this is how it is checked
instead. What it costs: a few hundred small requests at set-up, each through Python (sealing a value
takes microseconds); nothing on a step's path.
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch.distributed as tdist

from hpc.core.errors import StoreError
from hpc.core.meet import LISTEN_FD_VARIABLE, SECRET_VARIABLE, derive, secret_from
from hpc.placement.distenv import LAUNCHER_VARIABLE

log = logging.getLogger(__name__)

NONCE_BYTES = 12
# The sealed stores torch's rendezvous made here: a process group holds a store only on the C++ side, which
# keeps no Python object of a Python Store alive, so its `base` (the TCPStore rank 0 serves) would go with it.
_MADE: list[tdist.Store] = []
REFUSED = "not sealed with this run's secret"  # in the one line; the training finds it in torch's wrapping


class SealedStore(tdist.Store):
    """`base` with named keys and sealed values (see the module doc)."""

    def __init__(self, base: tdist.Store, secret: str):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        super().__init__()
        self.base: Any = base  # Any: torch types values as str, yet its stores take bytes (pybind11's caster does)
        self.secret = secret
        self._names = derive(secret, b"hpc store names")
        self._aead = AESGCM(derive(secret, b"hpc store values"))

    def _name(self, key: str) -> str:
        return "hpc/" + hmac.new(self._names, key.encode("utf-8", "surrogateescape"), "sha256").hexdigest()[:40]

    def _seal(self, name: str, value: bytes | str) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data, name.encode())

    def _open(self, key: str, name: str, sealed: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], name.encode())
        except (InvalidTag, ValueError):
            message = (
                f"the run's store holds a value for {key!r} {REFUSED}: another process wrote it (another user "
                "of the node?); the run stops"
            )
            log.error(f"hpc: {message}")
            raise StoreError(message) from None

    def set(self, key: str, value: bytes | str) -> None:
        name = self._name(key)
        self.base.set(name, self._seal(name, value))

    def get(self, key: str) -> bytes:
        name = self._name(key)
        return self._open(key, name, self.base.get(name))

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def add(self, key: str, amount: int) -> int:
        """A count, sealed: read, add, and write back only where nobody wrote between (compare-and-set)."""
        name = self._name(key)
        while True:
            current = self.base.get(name) if self.base.check([name]) else b""
            value = (int(self._open(key, name, current)) if current else 0) + amount
            if current and not amount:  # a read (a roll call of the heartbeats): nothing to write
                return value
            new = self._seal(name, str(value))
            if self.base.compare_set(name, current, new) == new:
                return value

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """As TCPStore's: `desired` set where the value is `expected` (or the key is missing and `expected`
        empty); returns the value now there (a missing key with another `expected`: `expected`)."""
        name = self._name(key)
        want = expected.encode() if isinstance(expected, str) else bytes(expected)
        wish = desired.encode() if isinstance(desired, str) else bytes(desired)
        while True:
            current = self.base.get(name) if self.base.check([name]) else None
            if current is None and want:
                return want
            if current is not None and self._open(key, name, current) != want:
                return self._open(key, name, current)
            new = self._seal(name, wish)
            if self.base.compare_set(name, current or b"", new) == new:
                return wish

    def check(self, keys: list[str]) -> bool:
        return self.base.check([self._name(k) for k in keys])

    def wait(self, keys: list[str], timeout: dt.timedelta | None = None) -> None:
        names = [self._name(k) for k in keys]
        self.base.wait(names) if timeout is None else self.base.wait(names, timeout)

    def delete_key(self, key: str) -> bool:
        return self.base.delete_key(self._name(key))

    def num_keys(self) -> int:
        return self.base.num_keys()

    def set_timeout(self, timeout: dt.timedelta) -> None:
        super().set_timeout(timeout)
        self.base.set_timeout(timeout)

    def clone(self) -> SealedStore:
        return SealedStore(self.base.clone(), self.secret)


def sealed(store: tdist.Store, env: Mapping[str, str] | None = None) -> tdist.Store:
    """`store` sealed with the run's secret, or as it is where no runner started the rank (a plain
    torchrun: torch's store as torch makes it). A rank the runner started always has the secret: without
    it, StoreError (one line)."""
    env = os.environ if env is None else env
    secret = secret_from(env)
    if secret is None and env.get(LAUNCHER_VARIABLE):
        raise StoreError(
            f"rank {env.get('RANK', '?')}: no {SECRET_VARIABLE} although the toolkit's runner started it: the "
            "run's store is not joined without it"
        )
    return store if secret is None else SealedStore(store, secret)


def take_listener() -> int | None:
    """The listening socket rank 0's runner handed its task, once: a second store of the process (a
    script that makes its process group again) binds the port itself."""
    fd = os.environ.pop(LISTEN_FD_VARIABLE, "")
    return int(fd) if fd.isdigit() else None


def unheld() -> None:
    """No sealed store in this process (the start-up hook could not reach torch's rendezvous): the runner's
    socket closed, so torch binds the port itself, and no secret for a store that will not have it."""
    fd = take_listener()
    if fd is not None:
        os.close(fd)
    os.environ.pop(SECRET_VARIABLE, None)


def run_store(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    timeout: dt.timedelta,
    **options: Any,  # TCPStore's own (wait_for_workers, multi_tenant, use_libuv), passed through
) -> tdist.Store:
    """The run's store at host:port (see the module doc): hosted on the runner's socket by rank 0, joined
    by the others, sealed."""
    fd = take_listener() if is_master else None
    if fd is not None:
        options = {**options, "master_listen_fd": fd, "use_libuv": True}  # the old backend does not serve on it
    base = tdist.TCPStore(host, port, world_size, is_master=is_master, timeout=timeout, **options)
    return sealed(base)


def patch_rendezvous(module: ModuleType) -> None:
    """torch.distributed.rendezvous: its store for the run's MASTER_ADDR:MASTER_PORT made by run_store."""
    original: Callable[..., tdist.Store] = module._create_c10d_store
    serves = getattr(module, "_agent_store_serves", None)  # torch 2.9 and later; before, any address
    older = getattr(module, "_torchelastic_use_agent_store", lambda: False)

    def agent_serves(hostname: str, port: int) -> bool:
        return bool(serves(hostname, port)) if serves is not None else bool(older())

    def create(
        hostname: str, port: int, rank: int, world_size: int, timeout: dt.timedelta, use_libuv: bool = True
    ) -> tdist.Store:
        ours = hostname == os.environ.get("MASTER_ADDR") and str(port) == os.environ.get("MASTER_PORT")
        if not ours:  # an address of the script's own
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        if agent_serves(hostname, port):  # torchrun's agent hosts it (its shared store): all ranks join
            _MADE.append(sealed(original(hostname, port, rank, world_size, timeout, use_libuv)))
            return _MADE[-1]
        made = run_store(hostname, port, world_size, rank == 0, timeout, multi_tenant=True, use_libuv=use_libuv)
        _MADE.append(made)
        return made

    module._create_c10d_store = create  # type: ignore[attr-defined]
