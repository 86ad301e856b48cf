"""One writer per run directory: `RunLock`, an exclusive lock on RUN/.lock.

hpc.train's rank 0 takes it before the run writes anything and holds it for its lifetime; a second
run started on the same directory is refused in one line naming the holder (host, pid, since when).
The lock is the kernel's (`flock`), not the file's existence, so the OS releases it when the holder
dies however it dies: a run killed with SIGKILL never blocks the next (its .lock file stays, unlocked,
and the next holder takes it over). A holder that ends removes the file while it still holds it, and a
taker checks that the file it locked is still the one at the path, so removing it opens no race.
Written by hand because the standard library's fcntl is all it takes.

flock works across nodes on NFS (emulated with POSIX locks) and on Lustre mounted with `flock` (as
Perlmutter's $SCRATCH is); where a file system refuses locks altogether, `acquire` says so and the run
goes on unguarded rather than not at all.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import socket
from pathlib import Path

from hpc.core.errors import UsageError
from hpc.core.owner import file_mode

# errnos of a file system that does not lock at all (as opposed to a lock someone holds)
NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def holder_line() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()} since {dt.datetime.now().isoformat(timespec='seconds')}"


class RunLock:
    """An exclusive, non-blocking lock on `path`, released by release() or by the holder's death."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self, what: str) -> str | None:
        """Take the lock, or raise UsageError naming `what` and the holder. Returns None, or a line saying
        why the run goes on unguarded (the file system does not lock)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process that has not said who"
                os.close(fd)
                raise UsageError(
                    f"{what}: in use by another run ({holder}); wait for it to end, or give another run directory"
                ) from None
            except OSError as e:
                os.close(fd)
                if e.errno in NO_LOCKING:
                    return f"{self.path}: the file system does not lock ({e.strerror}); a second writer is not refused"
                raise
            if self._still_at_path(fd):
                break
            os.close(fd)  # its holder removed it between our open and our lock: take the new one
        try:  # who holds it, for the refusal's line; a full disk may not take even that, and need not
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder_line().encode(), 0)
        except OSError:
            pass
        self.fd = fd
        return None

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the file, then drop the lock (closing the last descriptor): a run leaves no .lock behind."""
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass  # a read-only or vanished directory: the lock goes with the descriptor anyway
            os.close(self.fd)
            self.fd = None
