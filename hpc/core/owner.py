"""What the toolkit makes is its owner's. On a login node, a `shared`-QOS node or a shared file system
($SCRATCH, $HOME) other users are not trusted (docs/security.md): every directory and file a command
makes is its owner's alone, or also readable by the owner's project group where HPC_GROUP names it,
whatever the umask; and a directory that another user could change is never written in.

- `take_umask(env)`: this process's umask, which every process it starts inherits (the ranks, a user's
  script and its checkpoints, torch's profiler, submitit; Slurm hands sbatch's umask to the job): 077,
  or 027 with HPC_GROUP. Every command sets it first (hpc/core/cli.py `run`).
- `unsafe(path)`: why a directory may not be written in, or None: it, or a directory above it, is owned
  by another user or writable by one (a world-writable one above with the sticky bit, as /tmp, is fine:
  nobody can move what is ours out of it; so is making a folder of ours in it: `made_in`), or it is not
  a directory.
- `make_dirs(path, source)`: a directory the toolkit writes in, made where missing (0700; with HPC_GROUP
  0750, the group's, set-group-id so what is made inside keeps the group), refused in one line where
  `unsafe`; `make_new_dir(path)`: one made now or not at all (a run of its own, the first free name).
- `open_new(path, mode)`: a file made here and now, never one that was there and never through a link
  (O_EXCL | O_NOFOLLOW): temp and lock files.

Who is trusted: you, root, and with HPC_GROUP=<group> that group's members (a directory of theirs with
the group, e.g. a shared runs folder under /global/cfs/cdirs/<project>). A group-writable directory is
fine when its group is HPC_GROUP's or your private group (named as you are). Written by hand: the
standard library's os and stat are all it takes; no library checks ownership along a path.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from hpc.core.errors import UsageError

GROUP_VARIABLE = "HPC_GROUP"  # a project group that may read the runs (e.g. m1234), inherited by the ranks
PRIVATE_UMASK, GROUP_UMASK = 0o077, 0o027

_group: int | None = None  # HPC_GROUP's gid, once take_umask read it


def group_id(env: Mapping[str, str]) -> int | None:
    """HPC_GROUP's gid, or None when it is unset; a group that does not exist or that you are not in is
    one line naming it."""
    name = env.get(GROUP_VARIABLE)
    if not name:
        return None
    try:
        gid = int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except (KeyError, OverflowError):
        raise UsageError(f"{GROUP_VARIABLE}={name!r}: no such group on this machine") from None
    if gid != os.getegid() and gid not in os.getgroups():
        raise UsageError(f"{GROUP_VARIABLE}={name!r}: you are not a member of that group (see `id`)")
    return gid


def take_umask(env: Mapping[str, str] | None = None) -> int:
    """Set this process's umask (see the module doc); returns it."""
    global _group
    _group = group_id(os.environ if env is None else env)
    mask = PRIVATE_UMASK if _group is None else GROUP_UMASK
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What the toolkit's files are made with: 0600, or 0640 with HPC_GROUP."""
    return 0o600 if _group is None else 0o640


def dir_mode() -> int:
    return 0o700 if _group is None else 0o2750


def _name_of_user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _name_of_group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _trusted_group(gid: int) -> bool:
    """HPC_GROUP's, or your private group (a group named as you are: Debian's and NERSC's user groups)."""
    return gid == _group or (gid == os.getegid() and _name_of_group(gid) == _name_of_user(os.geteuid()))


def _problem(path: Path, status: os.stat_result, written_in: bool) -> str | None:
    mode, me = status.st_mode, os.geteuid()
    if not stat.S_ISDIR(mode):
        return f"{path} is not a directory"
    teammate = _group is not None and status.st_gid == _group
    if status.st_uid not in (me, 0) and not teammate:
        return f"{path} is owned by {_name_of_user(status.st_uid)}, not by you"
    if written_in and status.st_uid == 0 and me != 0 and not teammate:
        return f"{path} is owned by root, not by you"
    sticky = bool(mode & stat.S_ISVTX) and not written_in  # nobody moves what is ours out of /tmp
    if mode & stat.S_IWOTH and not sticky:
        return f"{path} is writable by every user (mode {stat.S_IMODE(mode):o})"
    if mode & stat.S_IWGRP and not sticky and not _trusted_group(status.st_gid):
        return f"{path} is writable by group {_name_of_group(status.st_gid)} (mode {stat.S_IMODE(mode):o})"
    return None


def unsafe(path: str | os.PathLike[str], made_in: bool = False) -> str | None:
    """Why the existing directory `path` may not be written in, or None (see the module doc); `made_in`:
    only a directory of ours is made in it. Links are followed: what counts is where the files land, and
    every directory on the way there."""
    real = Path(os.path.realpath(path))
    for i, folder in enumerate([real, *real.parents]):
        try:
            status = os.stat(folder)
        except OSError as e:
            return f"{folder}: cannot be checked ({e.strerror or e})"
        problem = _problem(folder, status, written_in=i == 0 and not made_in)
        if problem:
            return problem
    return None


def refuse_unsafe(path: str | os.PathLike[str], source: str, made_in: bool = False) -> None:
    """UsageError naming `source` when `unsafe(path, made_in)` (path exists)."""
    problem = unsafe(path, made_in)
    if problem:
        raise UsageError(f"{source} {path}: not written in: {problem} (docs/security.md)")


def make_dirs(path: str | os.PathLike[str], source: str = "directory") -> Path:
    """`path` as a directory of the owner's (see the module doc): each missing one made with dir_mode()
    (and HPC_GROUP's group), the nearest existing one refused where `unsafe`. Returns the path."""
    path = Path(path)
    missing: list[Path] = []
    top = path
    while not top.is_dir():
        if top.exists() or top.is_symlink() or top.parent == top:  # a file, a dangling link
            if top.is_dir():  # made between the two looks, by a rank beside us (seen under load): it is one
                break
            raise UsageError(f"{source} {path}: {top} is not a directory")
        missing.append(top)
        top = top.parent
    refuse_unsafe(top if missing else path, source, made_in=bool(missing))
    for folder in reversed(missing):
        if not make_new_dir(folder):  # made meanwhile by a rank beside us: checked as any existing one
            refuse_unsafe(folder, source)
    return path


def make_new_dir(path: str | os.PathLike[str]) -> bool:
    """`path` made now, the owner's (in a directory make_dirs made or checked); False where something is
    there already (made by another meanwhile: whoever made it owns it)."""
    try:
        os.mkdir(path, dir_mode())
    except FileExistsError:
        return False
    if _group is not None:
        os.chown(path, -1, _group)
        os.chmod(path, dir_mode())  # mkdir's mode is cut by the umask and drops set-group-id
    return True


def open_new(path: str | os.PathLike[str], mode: int | None = None) -> int:
    """A descriptor of a file made now at `path` (write-only), never an existing one, never through a
    link: O_EXCL | O_NOFOLLOW. FileExistsError when anything is there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, file_mode() if mode is None else mode)


def open_append(path: str | os.PathLike[str]) -> int:
    """A descriptor to append to `path` (made where missing), never through a link: a log in a directory
    of the owner's."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
