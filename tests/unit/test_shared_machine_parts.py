"""The parts that keep a run its owner's on a shared machine (issue 62, docs/security.md), in-process: which
directories may be written in (hpc/core/owner.py), files made new and never through a link, where a run
meets (hpc/core/meet.py) and its sealed store (hpc/training/distributed/runstore.py). The attacks themselves, as a
second user of this machine, are tests/e2e/test_shared_machine.py."""

import datetime as dt
import grp
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch.distributed as tdist

from hpc.core import meet, owner
from hpc.core.errors import StoreError, UsageError
from hpc.core.files import temp_name, write_atomic
from hpc.core.rundir import RunPaths
from hpc.training.distributed.runstore import REFUSED, SealedStore, sealed

NOBODY = pwd.getpwnam("nobody")
NOGROUP = grp.getgrgid(NOBODY.pw_gid)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root (CI is)")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- which directories may be written in --------------------------------------------------------------

def test_a_directory_of_ones_own_is_safe_and_one_others_can_write_in_is_not(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert owner.unsafe(mine) is None
    mine.chmod(0o707)
    assert "is writable by every user (mode 707)" in owner.unsafe(mine)
    mine.chmod(0o1777)  # sticky, as /tmp: fine above a run, never as the folder written in
    assert "writable by every user" in owner.unsafe(mine)
    (mine / "below").mkdir(mode=0o700)
    assert owner.unsafe(mine / "below") is None
    mine.chmod(0o777)  # not sticky: anyone could move `below` away and put their own in its place
    assert owner.unsafe(mine / "below") == f"{mine} is writable by every user (mode 777)"


@needs_root
def test_a_directory_another_user_owns_or_whose_group_can_write_is_not_safe(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY.pw_uid, NOBODY.pw_gid)
    assert owner.unsafe(theirs) == f"{theirs} is owned by nobody, not by you"
    os.chown(theirs, 0, NOGROUP.gr_gid)
    theirs.chmod(0o770)
    assert owner.unsafe(theirs) == f"{theirs} is writable by group {NOGROUP.gr_name} (mode 770)"
    (tmp_path / "link").symlink_to(theirs)  # where the files would land is what counts
    assert "writable by group" in owner.unsafe(tmp_path / "link")
    with pytest.raises(UsageError, match=r"^--run-dir .*link: not written in: .* writable by group"):
        owner.make_dirs(tmp_path / "link" / "run", "--run-dir")
    assert not (theirs / "run").exists()


@needs_root
def test_hpc_group_trusts_that_group_and_gives_it_what_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv(owner.GROUP_VARIABLE, NOGROUP.gr_name)
    monkeypatch.setattr(os, "getgroups", lambda: [0, NOGROUP.gr_gid])  # root, a member of the group here
    before = os.umask(0o022)
    try:
        assert owner.take_umask() == owner.GROUP_UMASK
        shared = tmp_path / "team"
        shared.mkdir()
        os.chown(shared, NOBODY.pw_uid, NOGROUP.gr_gid)  # a teammate's, with the group
        shared.chmod(0o2770)
        run = owner.make_dirs(shared / "runs" / "one")
        assert (run.stat().st_gid, mode_of(run)) == (NOGROUP.gr_gid, 0o2750)
        write_atomic(run / "summary.json", "{}")
        write_atomic(run / "task.json", "{}", mode=0o600)  # its command.env may hold secrets
        assert mode_of(run / "summary.json") == 0o640 and mode_of(run / "task.json") == 0o600
    finally:
        os.umask(before)
        monkeypatch.delenv(owner.GROUP_VARIABLE)
        owner.take_umask()
        os.umask(before)


def test_hpc_group_that_is_not_yours_is_one_line(monkeypatch):
    monkeypatch.setenv(owner.GROUP_VARIABLE, "no-such-group-here")
    with pytest.raises(UsageError, match="^HPC_GROUP='no-such-group-here': no such group on this machine$"):
        owner.take_umask()



@pytest.mark.parametrize("where", ["run", "run/checkpoints"])
def test_a_folder_a_rank_beside_us_makes_between_our_two_looks_is_taken(tmp_path, monkeypatch, where):
    """CI, under load: two ranks made RUN/checkpoints at once; one looked (not a directory yet), the other
    made it, the first looked again (it exists) and refused `--run-dir RUN/checkpoints: ... is not a
    directory`, its peer then waiting 300 s for it. The race replayed: the folder appears right after the
    first look; it is taken as made, and still checked as any existing folder."""
    (tmp_path / "run").mkdir(mode=0o700) if where != "run" else None
    target = tmp_path / where
    real_is_dir = Path.is_dir
    looked = []

    def racing(self):
        seen = real_is_dir(self)
        if self == target and not looked:
            looked.append(seen)
            os.mkdir(target, 0o700)  # the rank beside us, between this look and the next
        return seen

    monkeypatch.setattr(Path, "is_dir", racing)
    assert owner.make_dirs(target, "--run-dir") == target and looked == [False] and real_is_dir(target)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is not a directory"):  # a file there is still refused
        owner.make_dirs(tmp_path / "file" / "run", "--run-dir")

def test_what_the_toolkit_makes_is_the_owners_whatever_the_umask(tmp_path):
    before = os.umask(0o000)
    try:
        made = owner.make_dirs(tmp_path / "a" / "b")
        write_atomic(made / "f.json", "{}")
        assert (mode_of(tmp_path / "a"), mode_of(made), mode_of(made / "f.json")) == (0o700, 0o700, 0o600)
    finally:
        os.umask(before)


# --- files made new, never through a link ---------------------------------------------------------------

def test_a_link_planted_at_the_temp_name_is_never_followed(tmp_path):
    victim = tmp_path / "profile"
    victim.write_text("mine\n")
    out = tmp_path / "report.html"
    for pid in range(os.getpid() - 5, os.getpid() + 5):  # the name a writer used to take: .<name>.tmp.<pid>
        temp_name(out, pid).symlink_to(victim)
    write_atomic(out, "<html>")
    assert victim.read_text() == "mine\n" and out.read_text() == "<html>" and not out.is_symlink()
    with pytest.raises(FileExistsError):
        os.close(owner.open_new(temp_name(out)))  # what a temp or lock file is made with: O_EXCL | O_NOFOLLOW
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(OSError):  # ELOOP: a log is appended to only where it is no link
        os.close(owner.open_append(tmp_path / "log"))
    assert victim.read_text() == "mine\n"


# --- where a run meets ------------------------------------------------------------------------------------

def test_rank_zero_holds_a_port_of_the_address_asked_and_a_taken_one_is_one_line():
    with meet.listen("127.0.0.1") as held:
        host, port = held.getsockname()
        assert host == "127.0.0.1" and port > 0  # loopback only: not every interface
        with pytest.raises(StoreError, match=f"^the run's store could not listen at 127.0.0.1:{port} "):
            meet.listen("127.0.0.1", port).close()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens already: a client's connection waits for the store, none is refused


def test_the_meeting_is_the_owners_and_of_one_start(tmp_path):
    paths = RunPaths(tmp_path)
    one = meet.Meeting("7.0.0", "127.0.0.1", 40001, meet.new_secret())
    meet.publish(paths.meeting, one)
    assert mode_of(paths.meeting) == 0o600 and json.loads(paths.meeting.read_text())["port"] == 40001
    assert meet.read_meeting(paths.meeting, "7.0.0") == one
    assert meet.read_meeting(paths.meeting, "7.1.0") is None  # a requeue's ranks wait for their own start's
    found, why = meet.await_meeting(paths.meeting, "7.1.0", 0.5, lambda: None)
    assert found is None and why.startswith(f"rank 0 did not publish where the run meets ({paths.meeting}) within")
    found, why = meet.await_meeting(paths.meeting, "7.1.0", 60, lambda: "SIGTERM before the task started")
    assert (found, why) == (None, "SIGTERM before the task started")
    later = threading.Timer(0.5, meet.publish, (paths.meeting, meet.Meeting("7.1.0", "h", 40002, one.secret)))
    later.start()
    found, _ = meet.await_meeting(paths.meeting, "7.1.0", 60, lambda: None)
    assert found is not None and found.port == 40002
    later.join()


def test_a_secret_that_is_not_ours_is_refused():
    with pytest.raises(StoreError, match="HPC_STORE_SECRET: not a secret of this toolkit's"):
        meet.secret_from({meet.SECRET_VARIABLE: "hunter2"})
    assert meet.secret_from({}) is None


# --- the sealed store ---------------------------------------------------------------------------------------

@pytest.fixture()
def tcp_store():
    store = tdist.TCPStore("127.0.0.1", 0, 1, True, dt.timedelta(seconds=10), wait_for_workers=False)
    yield store, tdist.TCPStore("127.0.0.1", store.port, 1, False, dt.timedelta(seconds=10))


def test_the_sealed_store_keeps_torchs_semantics_between_its_ranks(tcp_store):
    server, outsider = tcp_store
    secret = meet.new_secret()
    a, b = SealedStore(server, secret), SealedStore(tdist.TCPStore("127.0.0.1", server.port, 1, False,
                                                                   dt.timedelta(seconds=10)), secret)
    a.set("hpc/joined/0", "nid001 4242")
    assert b.get("hpc/joined/0") == b"nid001 4242" and b.check(["hpc/joined/0"]) and not b.check(["nope"])
    assert [a.add("hpc/beat/0", 1) for _ in range(3)] == [1, 2, 3] and b.add("hpc/beat/0", 0) == 3
    assert b.compare_set("k", "", "v1") == b"v1" and a.compare_set("k", "x", "v2") == b"v1"
    assert a.compare_set("k", "v1", "v2") == b"v2" and b.get("k") == b"v2"
    assert b.compare_set("missing", "x", "v") == b"x" and not b.check(["missing"])  # as TCPStore answers
    b.wait(["hpc/joined/0"], dt.timedelta(seconds=1))
    assert a.multi_get(["k", "hpc/joined/0"]) == [b"v2", b"nid001 4242"]


def test_a_user_without_the_secret_lists_reads_and_forges_nothing(tcp_store):
    server, outsider = tcp_store  # the outsider: a plain client of the port, as another user of the node
    ranks = SealedStore(server, meet.new_secret())
    ranks.set("hpc/joined/0", "nid001 4242")
    assert ranks.get("hpc/joined/0") == b"nid001 4242"  # answered on the set's own connection: the set is in
    names = outsider.list_keys()
    assert names and all(n.startswith("hpc/") and len(n) == 44 and "joined" not in n for n in names)
    assert b"nid001" not in outsider.get(names[0]) and b"4242" not in outsider.get(names[0])
    outsider.set(names[0], b"nid666 1")  # a value written over the run's, without the secret...
    with pytest.raises(StoreError, match=f"holds a value for 'hpc/joined/0' {REFUSED}: another process wrote it"):
        ranks.get("hpc/joined/0")  # ... is refused by the rank that reads it
    other = SealedStore(server, meet.new_secret())  # another secret (another start's): its names differ
    assert not other.check(["hpc/joined/0"])


def test_a_rank_the_runner_started_has_the_secret_or_stops(tcp_store, monkeypatch):
    server, _ = tcp_store
    monkeypatch.setenv("HPC_RANK_LAUNCHER", "slurm")
    monkeypatch.delenv(meet.SECRET_VARIABLE, raising=False)
    with pytest.raises(StoreError, match="no HPC_STORE_SECRET although the toolkit's runner started it"):
        sealed(server)
    monkeypatch.delenv("HPC_RANK_LAUNCHER")
    assert sealed(server) is server  # a plain torchrun's: torch's store as torch makes it


def test_a_scripts_process_group_is_hosted_on_the_runners_socket_and_sealed(tmp_path):
    """What the start-up hook does for init_process_group('gloo') in a user's script, in a process of its
    own: the store serves on the socket handed over (loopback), and a plain client sees only sealed names."""
    code = f"""
import datetime as dt, os, sys, torch.distributed as d
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from hpc.training.distributed.runstore import patch_rendezvous
patch_rendezvous(sys.modules["torch.distributed.rendezvous"])
d.init_process_group("gloo")
import gc; gc.collect()  # the store must outlive the Python objects torch's rendezvous dropped
d.barrier(group=d.new_group())  # which uses it again
raw = d.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, False, dt.timedelta(seconds=10))
print(sorted(raw.list_keys()))
d.destroy_process_group()
"""
    with meet.listen("127.0.0.1") as held:
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(held.getsockname()[1]), meet.LISTEN_FD_VARIABLE: str(held.fileno()),
               meet.SECRET_VARIABLE: meet.new_secret(), "HPC_RANK_LAUNCHER": "submitit-local"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             pass_fds=(held.fileno(),))
    assert out.returncode == 0, out.stderr
    keys = eval(out.stdout)  # noqa: S307 - a list of strings this test printed
    assert keys and all(k.startswith("hpc/") and len(k) == 44 for k in keys), keys
