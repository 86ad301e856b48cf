"""A run on a shared machine, attacked by another user of it (issue 62; the model: docs/security.md). A
second account is made here (the suite runs as root in CI); each attack is tried for real, as that user,
against runs of root's, and must fail: the run's store (its port, its keys, its values), planted
directories and files, a planted profile, TensorBoard's info file and port, terminal escapes in a trace,
and a folder that is not a run taken as one. The attacker's code starts as root only to import what it
needs (this interpreter lives under /root), then drops to the other user's uid and gids for good, before
it touches anything of the run's."""

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, free_port, processes, run_module, wait_until

OTHER = "hpcother"
SCRIPTS = REPO / "tests" / "scripts"
PY = sys.executable


@pytest.fixture(scope="module")
def other():
    """The other user of the machine (made once; kept, as a machine's users are)."""
    if os.geteuid() != 0:
        pytest.skip("making a second user needs root (tests/run.sh runs the suite as root in CI)")
    if subprocess.run(["id", OTHER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", OTHER], check=True)
    return pwd.getpwnam(OTHER)


@pytest.fixture()
def shared(other):
    """A folder every user may write in, as /tmp or a project's scratch: sticky, mode 1777."""
    folder = Path(tempfile.mkdtemp(prefix="hpc-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def attack(other, code: str, timeout: float = 120, wait: bool = True):
    """Run `code` as the other user (imports done as root first: see the module doc); its process, or its
    completed run (stdout, stderr, exit code)."""
    prelude = textwrap.dedent(f"""
        import datetime as dt, json, os, socket, sys, time
        from pathlib import Path
        import torch.distributed as tdist
        os.setgroups([]); os.setgid({other.pw_gid}); os.setuid({other.pw_uid})
        os.environ["HOME"] = {other.pw_dir!r}; os.umask(0o022)
        assert os.geteuid() == {other.pw_uid}
    """)
    argv = [PY, "-c", prelude + textwrap.dedent(code)]
    if not wait:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def of_run(folder: Path) -> list[str]:
    return [cmd for pid, cmd in processes().items() if str(folder) in cmd and pid != os.getpid()]


LATE = """import sys, time
import torch, torch.distributed as dist
time.sleep(float(sys.argv[1]))  # before its process group: the store is not served yet
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"sum {t.item():g}", flush=True)
time.sleep(float(sys.argv[2]))  # the group formed, its keys in the store
dist.destroy_process_group()
"""


# --- 1. the run's store ----------------------------------------------------------------------------------

def test_the_runs_store_is_its_ranks_alone(other, tmp_path):
    """Its port is held at loopback from before any task starts (nobody can take it, or host a store
    there), the meeting file is the owner's, and a user who connects lists only names that say nothing,
    reads nothing, and what it writes changes nothing of the run."""
    (tmp_path / "late.py").write_text(LATE)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([PY, "-m", "hpc.submit", "--local", "--gpus", "2", "--no-profile", "--runs-dir", str(runs),
                             "--", PY, str(tmp_path / "late.py"), "4", "6"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        meeting = wait_until(lambda: next(iter(runs.glob("late/*/ranks/meeting.json")), None), "the meeting", 120)
        port = json.loads(meeting.read_text())["port"]
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert listening.split()[3:4] == [f"127.0.0.1:{port}"], listening  # loopback alone, not *:port
        squat = attack(other, f"""
            for host in ("127.0.0.1", "0.0.0.0"):
                s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, {port})); print("took", host)
                except OSError as e:
                    print("refused", host, e.strerror)
            try:
                print(Path({str(meeting)!r}).read_text())
            except OSError as e:
                print("meeting:", e.strerror)
        """)
        assert squat.stdout.splitlines() == ["refused 127.0.0.1 Address already in use",
                                             "refused 0.0.0.0 Address already in use",
                                             "meeting: Permission denied"], squat.stdout + squat.stderr
        snoop = attack(other, f"""
            c = tdist.TCPStore("127.0.0.1", {port}, 1, False, dt.timedelta(seconds=60))
            deadline = time.time() + 60
            while len(c.list_keys()) < 2 and time.time() < deadline:
                time.sleep(0.2)
            keys = c.list_keys()
            values = [c.get(k) for k in keys]
            c.set("hpc/joined/1", "nid666 1"); c.set("default_pg/0//cpu//0/rank_1", "127.0.0.1:1")
            print(json.dumps({{"keys": keys, "values": [v.hex() for v in values]}}))
        """)
        assert snoop.returncode == 0, snoop.stderr
        seen = json.loads(snoop.stdout)
        assert len(seen["keys"]) >= 2 and all(k.startswith("hpc/") and len(k) == 44 for k in seen["keys"]), seen
        host = socket.gethostname().encode().hex()
        for value in seen["values"]:  # sealed: no address, host name or word of the run's in any of them
            assert host not in value and b"127.0.0.1".hex() not in value and b"rank".hex() not in value, value
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "sum 2" in out, out[-3000:]  # unharmed: each rank's 1, summed
    (summary,) = runs.glob("late/*/summary.json")
    assert json.loads(summary.read_text())["outcome"] == "done"
    assert not of_run(runs)


def test_a_port_another_user_holds_fails_the_run_in_one_line(other, tmp_path):
    """A port given (HPC_MASTER_PORT, a user's own choice) that another user took first: the run fails at
    once, saying so, never requeued; nothing of it is left running."""
    squatter = attack(other, """
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
        print(s.getsockname()[1], flush=True); time.sleep(300)
    """, wait=False)
    try:
        port = int(squatter.stdout.readline())
        runs = tmp_path / "runs"
        r = run_module("hpc.submit", "--local", "--gpus", "2", "--no-profile", "--runs-dir", str(runs), "--",
                       PY, str(SCRIPTS / "torchrun_ddp.py"), "--epochs", "1", env={"HPC_MASTER_PORT": str(port)},
                       cwd=tmp_path, timeout=300)
    finally:
        squatter.kill()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the run's store could not listen at 127.0.0.1:{port} (Address already in use)" in r.stdout + r.stderr
    (summary,) = runs.glob("torchrun_ddp/*/summary.json")
    summary = json.loads(summary.read_text())
    assert summary["outcome"] == "failed" and [r["kind"] for r in summary["ranks"]] == ["failed", "peer"]
    assert not of_run(runs)


# --- 2. directories and files --------------------------------------------------------------------------

def test_a_planted_runs_folder_is_refused_and_its_command_never_runs(other, shared):
    """The other user made `runs/` where the victim submits from, with a run of theirs in it (its task.json
    runs their command): the victim's commands refuse to write there, in one line."""
    planted = attack(other, f"""
        run = Path({str(shared)!r}) / "runs" / "torchrun_ddp" / "1"
        run.mkdir(parents=True)
        (run / "task.json").write_text(json.dumps({{"words": ["touch", {str(shared / "PWNED")!r}], "cwd": "/",
                                                    "name": "x"}}))
        for folder in (run, run.parent, run.parent.parent):
            folder.chmod(0o777)
    """)
    assert planted.returncode == 0, planted.stderr
    submitted = run_module("hpc.submit", "--local", "--gpus", "1", "--no-profile", "--runs-dir", str(shared / "runs"),
                           "--", PY, str(SCRIPTS / "torchrun_ddp.py"), cwd=shared)
    assert_one_line_error(submitted, f"{shared / 'runs'}", "owned by hpcother")
    by_hand = run_module("hpc.rank", "--run-dir", str(shared / "runs" / "torchrun_ddp" / "1"), cwd=shared)
    assert_one_line_error(by_hand, "--run-dir", "owned by hpcother")
    assert not (shared / "PWNED").exists() and not list(shared.rglob("ranks"))


def test_no_report_is_written_where_another_user_can_plant(other, shared, tmp_path):
    """A report into a folder of the other user's, or straight into a world-writable one, is refused; in a
    folder of the victim's the other user cannot plant a link at all."""
    trace = REPO / "results" / "gpu" / "resnet152_rank0.pt.trace.json.gz"
    victim_file = tmp_path / "profile"
    victim_file.write_text("mine\n")
    nxt = int(Path("/proc/sys/kernel/ns_last_pid").read_text())  # the pids to come: the old temp names'
    theirs = attack(other, f"""
        out = Path({str(shared)!r}) / "out"; out.mkdir(); out.chmod(0o777)
        for pid in range({nxt}, {nxt} + 400):
            (out / f".report.html.tmp.{{pid}}").symlink_to({str(victim_file)!r})
    """)
    assert theirs.returncode == 0, theirs.stderr
    for out, why in ((shared / "out", "owned by hpcother"), (shared, "writable by every user")):
        r = run_module("analysis", str(trace), "--report", "--out", str(out), timeout=300)
        assert_one_line_error(r, "--out", why)
    assert victim_file.read_text() == "mine\n" and not (shared / "out" / "report.html").exists()


def test_a_private_run_linked_into_a_shared_folder_reaches_no_report_they_can_read(other, shared, tmp_path):
    """The other user links the victim's private trace into a folder they share with the victim; the victim
    analyses that folder: the report (made in a folder of the victim's own, made in the shared one as in
    /tmp) and its tables are the victim's alone."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    trace = REPO / "results" / "gpu" / "resnet152_rank0.pt.trace.json.gz"
    (private / "rank0.1.pt.trace.json.gz").write_bytes(trace.read_bytes())
    planted = attack(other, f"Path({str(shared)!r}, 'rank0.1.pt.trace.json.gz').symlink_to("
                            f"{str(private / 'rank0.1.pt.trace.json.gz')!r})")
    assert planted.returncode == 0, planted.stderr
    into_shared = run_module("analysis", str(shared), "--report", "--out", str(shared / "analysis"), timeout=300)
    assert into_shared.returncode == 0, into_shared.stderr
    report = shared / "analysis" / "report.html"
    read = attack(other, f"""
        for p in ({str(report)!r}, {str(shared / "analysis")!r} + "/runs.json"):
            try:
                open(p).read(1); print("read")
            except OSError as e:
                print(e.strerror)
    """)
    assert report.is_file() and read.stdout.split() == ["Permission", "denied", "Permission", "denied"], read.stdout
    assert oct(report.stat().st_mode & 0o777) == "0o600" and oct((shared / "analysis").stat().st_mode & 0o777) == "0o700"


def test_everything_a_run_writes_is_its_owners_whatever_the_umask(other, tmp_path, data_root):
    """umask 022 (many sites' default): the checkpoints, traces, logs, task.json (command.env holds secrets)
    and summary are still the owner's alone; the other user reads none of them."""
    runs = tmp_path / "runs"
    r = subprocess.run(["bash", "-c", 'umask 022 && exec "$@"', "-", PY, "-m", "hpc.submit", "--local", "--gpus",
                        "2", "--config", "profiles/smoke.yaml", "--data-root", str(data_root), "--runs-dir",
                        str(runs), "--max-steps", "4"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    made = [p for p in runs.rglob("*")]
    assert any(p.name == "last.pt" for p in made) and any(p.name.endswith(".pt.trace.json") for p in made)
    loose = [f"{p} {p.stat().st_mode & 0o777:o}" for p in made
             if not p.is_symlink() and p.stat().st_mode & 0o077 and p.stat().st_mode & 0o777 != 0o700]
    assert not loose, loose  # files 0600, folders 0700
    wanted = [p for p in made if p.name in ("task.json", "last.pt", "summary.json", "rank0.out")]
    read = attack(other, f"""
        for p in {[str(p) for p in wanted]!r}:
            try:
                open(p, "rb").read(1); print("read", p)
            except OSError as e:
                print(e.strerror)
    """)
    assert read.stdout.split("\n")[:-1] == ["Permission denied"] * len(wanted), read.stdout


# --- 3. profiles ----------------------------------------------------------------------------------------

def test_a_planted_profile_is_not_read(other, shared):
    """A `local` file where the victim submits from does not replace the packaged profile, and says so."""
    planted = attack(other, f"""
        Path({str(shared)!r}, "local").write_text("cluster:\\n  max_requeues: 77\\n  setup: ['touch {shared}/PWNED']\\n")
    """)
    assert planted.returncode == 0, planted.stderr
    r = run_module("hpc.submit", "--local", "--gpus", "1", "--no-profile", "--runs-dir", str(shared / "mine"),
                   "--", PY, "-c", "print('ran')", cwd=shared, timeout=300)  # runs/ of its own, made in /tmp
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"hpc: ./local is not read: --profile local is the packaged profile" in r.stderr
    assert not (shared / "PWNED").exists()
    printed = run_module("hpc.config", "--profile", "local", cwd=shared)
    assert printed.returncode == 0 and "77" not in printed.stdout


# --- 4. TensorBoard -------------------------------------------------------------------------------------

def test_tensorboard_follows_no_planted_info_file_and_sees_ipv6(other, tmp_path):
    """The other user made TensorBoard's info folder (0777) with links for the pids to come: the victim's
    TensorBoard writes none. And a port the other user holds on IPv6's loopback is refused, not shared."""
    tmp = Path(tempfile.mkdtemp(prefix="hpc-tmp-", dir="/tmp"))
    tmp.chmod(0o1777)
    canary = tmp_path / "bashrc"
    canary.write_text("mine\n")
    nxt = int(Path("/proc/sys/kernel/ns_last_pid").read_text())  # the pids to come
    planted = attack(other, f"""
        info = Path({str(tmp)!r}) / ".tensorboard-info"; info.mkdir(); info.chmod(0o777)
        for pid in range({nxt}, {nxt} + 400):
            (info / f"pid-{{pid}}.info").symlink_to({str(canary)!r})
    """)
    assert planted.returncode == 0, planted.stderr
    port = free_port()
    logdir = tmp_path / "logs"
    logdir.mkdir()
    server = subprocess.Popen([PY, "-m", "analysis.tensorboard", str(logdir), "--port", str(port), "--url-file",
                               str(tmp_path / "url")], env={**os.environ, "TMPDIR": str(tmp)}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (tmp_path / "url").exists(), "its URL", 90)
        wait_until(lambda: listens(port), "it to listen", 90)
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=60)
    assert canary.read_text() == "mine\n", out
    assert not [p for p in (tmp / ".tensorboard-info").iterdir() if not p.is_symlink()]
    assert oct((tmp_path / "url").stat().st_mode & 0o777) == "0o600"
    subprocess.run(["rm", "-rf", str(tmp)], check=False)
    if not ipv6_loopback():
        return  # no ::1 on this machine: nobody can listen there either
    six = attack(other, """
        s = socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(120)
    """, wait=False)
    try:
        port6 = int(six.stdout.readline())
        r = run_module("analysis.tensorboard", str(logdir), "--port", str(port6), "--url-file", str(tmp_path / "u2"))
    finally:
        six.kill()
    assert_one_line_error(r, f"--port {port6} (on ::1, the other loopback): cannot listen there")


# --- 5. output --------------------------------------------------------------------------------------------

def test_terminal_escapes_in_a_trace_never_reach_the_terminal(other, shared, tmp_path):
    """A trace is other people's data: its names may hold escape sequences (a title set, a screen cleared)."""
    planted = attack(other, f"""
        evil = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m"
        events = [{{"ph": "X", "cat": "cpu_op", "name": "aten::mm" + evil, "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
                    "args": {{}}}} for i in range(20)]
        events += [{{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{{i}}", "pid": 1, "tid": 1, "ts": 100 * i,
                     "dur": 100, "args": {{}}}} for i in range(2)]
        Path({str(shared)!r}, "rank0" + evil + ".pt.trace.json").write_text(json.dumps({{"traceEvents": events}}))
    """)
    assert planted.returncode == 0, planted.stderr
    r = run_module("analysis", str(shared), "--format", "table")
    said = r.stdout + r.stderr
    assert "\x1b" not in said and "\x9b" not in said and "\x07" not in said, said
    assert "\\x1b" in said, said  # the names are shown, escaped


# --- 6. run directories -----------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["hpc.rank", "hpc.batch"])
def test_a_folder_that_is_not_a_run_is_refused_by_every_door(door, tmp_path):
    """As root `--run-dir /etc` wrote task.json, summary.json and logs/ into /etc: a folder of other things
    is refused before anything is written (shown on a copy of /etc's shape, never /etc itself)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("passwd", "hosts", "profile"):
        (etc / name).write_text("x\n")
    before = sorted(p.name for p in etc.iterdir())
    r = run_module(door, "--run-dir", str(etc), "--", PY, "-c", "print(1)", env={"SLURM_JOB_ID": "1"})
    assert_one_line_error(r, f"--run-dir '{etc}': holds other files (hosts, passwd, profile), not a run")
    assert sorted(p.name for p in etc.iterdir()) == before
