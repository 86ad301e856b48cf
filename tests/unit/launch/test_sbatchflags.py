"""sbatch's options as Slurm users type them (hpc/launch/submission/sbatchflags.py), read back from the
script `hpc.submit --dry-run` prints. The oracle is sbatch(1): each row's lines are what sbatch would be
given for the habit, written here from the man page, not computed by the code under test; the real
sbatch on the test cluster checks the same in tests/e2e/test_sbatch_habits_slurm.py."""

import argparse
import contextlib
import io
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commands import assert_refused, call, entry, environment

BASE = ["--dry-run", "--profile", "perlmutter", "--config", "profiles/smoke.yaml"]
ACCOUNT = ["--account", "m1234_g"]  # the long form, which the toolkit always took

# (habit, what the script holds; "!" lines it must not hold). Each row failed on the code before this module
# (commit e457053: all 82 rows of HABITS and REFUSED).
HABITS = [
    (["-N", "2", "--gpus", "4"], ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4"]),
    (["-t", "01:30:00"], ["#SBATCH --time=90"]),
    (["--time", "1-00:00:00"], ["#SBATCH --time=1440"]),
    (["-t", "1-2:30"], ["#SBATCH --time=1590"]),
    (["-t", "2-0"], ["#SBATCH --time=2880"]),
    (["-t", "45:30"], ["#SBATCH --time=46"]),  # M:S: seconds round up to a minute, as Slurm does
    (["-t", "1:75:00"], ["#SBATCH --time=135"]),  # fields past 59 count on, as Slurm does
    (["-A", "m9_g"], ["#SBATCH --account=m9_g"]),
    (["-q", "debug"], ["#SBATCH --qos=debug"]),
    (["-p", "gpu_ss11"], ["#SBATCH --partition=gpu_ss11"]),
    (["-J", "myrun"], ["#SBATCH --job-name=myrun"]),
    (["--job-name", "myrun"], ["#SBATCH --job-name=myrun"]),
    (["-C", "gpu&hbm80g"], ["#SBATCH --constraint='gpu&hbm80g'", "!#SBATCH --constraint=gpu\n"]),
    (["-c", "16"], ["#SBATCH --cpus-per-task=16"]),
    (["--cpus-per-task", "8"], ["#SBATCH --cpus-per-task=8"]),
    (["--gpus-per-node", "2"], ["#SBATCH --gpus-per-node=2", "#SBATCH --ntasks-per-node=2"]),
    (["-d", "afterok:123"], ["#SBATCH --dependency=afterok:123"]),
    (["--dependency", "afterany:1:2"], ["#SBATCH --dependency=afterany:1:2"]),
    (["--mem", "0"], ["#SBATCH --mem=0"]),
    (["--mem", "200G"], ["#SBATCH --mem=200G"]),
    (["--exclusive"], ["#SBATCH --exclusive\n"]),
    (["--exclusive=user"], ["#SBATCH --exclusive=user"]),
    # --export as sbatch reads it: a list without ALL is not the submitting environment
    (["--export", "FOO=1,BAR=2"], ["export FOO=1\n", "export BAR=2\n", "#SBATCH --export=NONE", "--export=ALL "]),
    (["--export", "ALL,FOO=1"], ["export FOO=1\n", "!#SBATCH --export", "!--export=ALL"]),
    (["--export", "NONE"], ["#SBATCH --export=NONE", "--export=ALL "]),
    (["--export", "HOME,FOO=a b"], ["#SBATCH --export=HOME\n", "export FOO='a b'"]),  # a bare name: from here
    (["--export", "ALL", "--export", "A=1,B=2"], ["export A=1\n", "export B=2\n", "!#SBATCH --export"]),
    # any other sbatch option, as typed
    (["--mail-type", "END", "--mail-user", "me@lab.org"], ["#SBATCH --mail-type=END", "#SBATCH --mail-user=me@lab.org"]),
    (["--mail-type=BEGIN"], ["#SBATCH --mail-type=BEGIN"]),
    (["-H"], ["#SBATCH --hold\n"]),
    (["--reservation", "sc23"], ["#SBATCH --reservation=sc23"]),
    (["-w", "nid001"], ["#SBATCH --nodelist=nid001"]),
    (["-x", "nid[002-003]"], ["#SBATCH --exclude='nid[002-003]'"]),
    (["-b", "now+1hour"], ["#SBATCH --begin=now+1hour"]),
    (["--comment", "mine"], ["#SBATCH --comment=mine"]),
    (["--time-min", "30"], ["#SBATCH --time-min=30"]),
    (["--mem-per-gpu", "40G"], ["#SBATCH --mem-per-gpu=40G", "!#SBATCH --mem="]),
    (["--nice"], ["#SBATCH --nice\n"]),
    # --sbatch KEY[=VALUE]: a key of the toolkit's maps onto its flag, a flag without a value passes
    (["--sbatch", "exclusive"], ["#SBATCH --exclusive\n"]),
    (["--sbatch", "requeue"], ["#SBATCH --requeue\n", "!--requeue="]),  # a flag alone, as sbatch takes it
    (["--sbatch", "dependency=afterok:7"], ["#SBATCH --dependency=afterok:7"]),
    (["--sbatch", "time=1:00:00"], ["#SBATCH --time=60"]),
    (["--sbatch", "constraint=gpu&hbm40g"], ["#SBATCH --constraint='gpu&hbm40g'"]),
    (["--sbatch", "mem=0"], ["#SBATCH --mem=0"]),
    (["--mem", "200GB"], ["#SBATCH --mem=200GB"]),  # issue 90: sbatch reads it as 200G; the profile writes it so
    (["--mem", "64000mb"], ["#SBATCH --mem=64000mb"]),
    (["--sbatch", "nodes=2"], ["#SBATCH --nodes=2"]),
    (["--sbatch", "job-name=x"], ["#SBATCH --job-name=x"]),
    (["--sbatch", "export=ALL,FOO=2"], ["export FOO=2\n", "!#SBATCH --export"]),
]
# Habits that worked before and must go on working (regressions, not new rows).
KEPT = [
    (["--nodes", "2"], ["#SBATCH --nodes=2"]),
    (["--sbatch", "mail-type=END"], ["#SBATCH --mail-type=END"]),
    (["--sbatch", "profile=task"], ["#SBATCH --profile=task"]),  # sbatch's own --profile, by its one way
    (["--sbatch", "segment=4"], ["#SBATCH --segment=4"]),  # an option newer than the table: passed as given
]
# (habit, what the one line must name): refused with the way to say it
REFUSED = [
    (["-N", "2", "--gpus", "8"], ["--gpus 8", "--gpus-per-node 4"]),
    (["--gpus", "8"], ["--gpus 8", "per node", "--nodes 2 --gpus-per-node 4"]),
    (["-G", "8", "-N", "2"], ["-G 8", "--gpus-per-node 4"]),
    (["--sbatch", "gpus=8", "-N", "2"], ["gpus=8", "whole job", "--gpus-per-node 4"]),  # issue 90: as -G
    (["--sbatch", "gpus=8"], ["gpus=8", "--gpus-per-node 8"]),
    (["--sbatch", "gpus"], ["'gpus'", "takes a value"]),
    (["--gpus", "4", "--gpus-per-node", "2"], ["--gpus 4", "--gpus-per-node 2"]),
    (["-o", "x.out"], ["-o x.out", "RUN/logs"]),
    (["-e", "x.err"], ["-e x.err", "RUN/logs"]),
    (["--array", "0-3"], ["--array 0-3", "hpc.study run"]),
    (["-n", "8"], ["-n 8", "--gpus-per-node"]),
    (["--ntasks-per-node", "4"], ["--ntasks-per-node 4", "--gpus-per-node"]),
    (["--signal", "USR1@60"], ["--signal USR1@60", "cluster.signal_delay_s"]),
    (["--wrap", "python x.py"], ["--wrap", "after --"]),
    (["--test-only"], ["--test-only", "--dry-run"]),
    (["--no-requeue"], ["--no-requeue", "cluster.max_requeues=0"]),
    (["-D", "/tmp"], ["-D /tmp", "command.cwd"]),
    (["--sbatch", "output=x"], ["output=x", "RUN/logs"]),
    (["--sbatch", "array=1-3"], ["array=1-3", "hpc.study run"]),
    (["--sbatch", "image=x:1"], ["image=x:1", "--set cluster.image"]),
    (["--sbatch", "time=30", "-t", "60"], ["time=30", "-t 60", "twice"]),
    (["--sbatch", "time"], ["--sbatch time", "takes a value"]),
    (["--profile", "energy"], ["--profile energy", "--sbatch profile=energy"]),
    (["-t", "0"], ["-t/--time", "'0'", "no time limit"]),
    (["-t", "UNLIMITED"], ["'UNLIMITED'", "no time limit"]),
    (["-t", "1.5"], ["'1.5'", "not a Slurm time"]),
    (["-N", "2-4"], ["'2-4'", "range"]),
    (["--gpus-per-node", "a100:4"], ["'a100:4'", "GPU type"]),
    (["--mem", "12X"], ["'12X'", "not a size"]),
    (["--mem", "200B"], ["'200B'", "not a size"]),  # as sbatch 22.05 refuses it (Invalid --mem specification)
    (["--mem", "200GiB"], ["'200GiB'", "not a size"]),
    (["--mem", "10G", "--mem-per-gpu", "4G"], ["--mem 10G", "--mem-per-gpu", "one of them"]),
    (["--export", "FOO=1,2"], ["'2' is not a variable name", "--export NAME"]),
    (["--export", "FOO=\"a,b\""], ["sbatch keeps quotes", "--export FOO"]),
    (["--export", "ALL,NONE"], ["ALL and NONE"]),
    (["--export", "HPC_NOT_SET_ANYWHERE"], ["HPC_NOT_SET_ANYWHERE", "not set here"]),
    (["--mail-typ", "END"], ["--mail-typ", "did you mean --mail-type"]),
    (["train.lr=0.1"], ["train.lr=0.1", "did you mean --set train.lr=0.1"]),
    (["--local", "--dependency", "afterok:1"], ["--dependency afterok:1", "--local"]),
    (["--local", "--mail-type", "END"], ["--mail-type END", "--local"]),
    (["--local", "--export", "FOO=1"], ["--export without ALL", "ALL,NAME=VALUE"]),
]


def dry_run(argv, tmp_path, env: dict | None = None):
    return call("hpc.submit", [*BASE, "--runs-dir", str(tmp_path / "runs"), *argv], {"HOME": "/home/me", **(env or {})})


@pytest.mark.parametrize("habit, script", HABITS + KEPT, ids=[" ".join(h) for h, _ in HABITS + KEPT])
def test_an_sbatch_habit_means_what_it_means_to_sbatch(habit, script, tmp_path):
    argv = habit if "-A" in habit else [*ACCOUNT, *habit]
    out = dry_run(argv, tmp_path)
    assert out.code == 0, out.stderr
    for line in script:
        if line.startswith("!"):
            assert line[1:] not in out.stdout, (line, out.stdout)
        else:
            assert line in out.stdout, (line, out.stdout)


@pytest.mark.parametrize("habit, needles", REFUSED, ids=[" ".join(h) for h, _ in REFUSED])
def test_an_sbatch_habit_another_way_is_refused_naming_it(habit, needles, tmp_path):
    assert_refused(dry_run([*ACCOUNT, *habit], tmp_path), "hpc.submit", *needles)


def test_the_study_takes_the_same_habits(tmp_path):
    out = call("hpc.study", ["run", "profiles/study-smoke.yaml", "--dry-run", "--runs-dir", str(tmp_path), "-A",
                             "m1234_g", "-t", "2:00:00", "--mail-type", "END", "-d", "afterok:5"], None)
    assert out.code == 0, out.stderr
    gpu_jobs = out.stdout.split("# then the analysis job")[0]
    assert gpu_jobs.count("#SBATCH --time=120") == gpu_jobs.count("#!/bin/bash") >= 1
    assert gpu_jobs.count("#SBATCH --mail-type=END") == gpu_jobs.count("#!/bin/bash")
    assert gpu_jobs.count("#SBATCH --dependency=afterok:5") == gpu_jobs.count("#!/bin/bash")
    assert_refused(call("hpc.study", ["run", "profiles/study-smoke.yaml", "--dry-run", "-o", "x"], None), "hpc.study",
                   "RUN/logs")


# ---- sbatch(1)'s options, every one accounted for --------------------------------------------------------

# Every option of sbatch(1), Slurm 22.05 (`man sbatch` on the test cluster, its OPTIONS headings).
SBATCH_1 = """
-A --account --acctg-freq -a --array --batch --bb --bbf -b --begin -D --chdir --cluster-constraint -M --clusters
--comment -C --constraint --container --contiguous -S --core-spec --cores-per-socket --cpu-freq --cpus-per-gpu
-c --cpus-per-task --deadline --delay-boot -d --dependency -m --distribution -e --error -x --exclude --exclusive --export
--export-file -B --extra-node-info --get-user-env --gid --gpu-bind --gpu-freq -G --gpus --gpus-per-node
--gpus-per-socket --gpus-per-task --gres --gres-flags -h --help --hint -H --hold --ignore-pbs -i --input
-J --job-name --kill-on-invalid-dep -L --licenses --mail-type --mail-user --mcs-label --mem --mem-bind
--mem-per-cpu --mem-per-gpu --mincpus --network --nice -k --no-kill --no-requeue -F --nodefile -w --nodelist
-N --nodes -n --ntasks --ntasks-per-core --ntasks-per-gpu --ntasks-per-node --ntasks-per-socket --open-mode
-o --output -O --overcommit -s --oversubscribe --parsable -p --partition --power --prefer --priority --profile
--propagate -q --qos -Q --quiet --reboot --requeue --reservation --signal --sockets-per-node --spread-job
--switches --test-only --thread-spec --threads-per-core -t --time --time-min --tmp --uid --usage
--use-min-nodes -v --verbose -V --version -W --wait --wait-all-nodes --wckey --wrap
""".split()


def test_every_option_of_sbatch_is_taken_passed_or_refused_once():
    from hpc.launch.submission.sbatchflags import NAMESAKES, OWN, PASSED, REFUSED as REFUSED_TABLE

    tables = [OWN, PASSED, REFUSED_TABLE, NAMESAKES]
    longs = [name for table in tables for name in table]
    assert len(longs) == len(set(longs))  # none in two tables
    shorts = [row[0] for table in (OWN, PASSED, REFUSED_TABLE) for row in table.values() if row[0]]
    shorts += [s for s in NAMESAKES.values() if s]
    assert len(shorts) == len(set(shorts))
    named = {f"--{n}" for n in longs} | {f"-{s}" for s in shorts}
    assert named == set(SBATCH_1), (set(SBATCH_1) - named, named - set(SBATCH_1))


@pytest.mark.slurm
def test_the_table_is_the_installed_sbatchs(slurm_cluster):
    """The test cluster's Slurm (its sbatch(1)) lists the same options as SBATCH_1."""
    import subprocess

    text = subprocess.run(["man", "sbatch"], capture_output=True, text=True, env={"MANWIDTH": "200"}).stdout
    text = re.sub(r".\x08", "", text)
    headings = re.findall(r"^ {7}((?:-[A-Za-z], )?--[a-z][a-z-]*)", text, flags=re.M)
    listed = {w.strip() for h in headings for w in h.split(",")}
    assert listed == set(SBATCH_1), (listed ^ set(SBATCH_1))


@pytest.mark.parametrize("option", sorted(__import__("hpc.launch.submission.sbatchflags", fromlist=["x"]).PASSED))
def test_every_passed_option_reaches_the_script_as_typed(option, tmp_path):
    from hpc.launch.submission.sbatchflags import FLAG, PASSED

    kind = PASSED[option][1]
    argv = [f"--{option}"] if kind != "value" else [f"--{option}", "v1"]
    out = dry_run([*ACCOUNT, *argv], tmp_path)
    assert out.code == 0, out.stderr
    line = f"#SBATCH --{option}\n" if kind != "value" else f"#SBATCH --{option}=v1\n"
    assert line in out.stdout, (line, kind, FLAG)


@pytest.mark.parametrize("option", sorted(__import__("hpc.launch.submission.sbatchflags", fromlist=["x"]).REFUSED))
def test_every_refused_option_is_one_line_naming_its_way(option, tmp_path):
    from hpc.launch.submission.sbatchflags import REFUSED as TABLE

    short, kind, way = TABLE[option]
    argv = [f"--{option}"] + ([] if kind == "flag" else ["v"])
    assert_refused(dry_run([*ACCOUNT, *argv], tmp_path), "hpc.submit", f"--{option}", way)


# ---- sbatch's --time, checked against Slurm's own reading --------------------------------------------------

# What the test cluster's Slurm 22.05 made of each (`sbatch -t T`, then scontrol's TimeLimit), 2026-11-29.
SLURM_SAID = {"90": "01:30:00", "1:30": "00:02:00", "1:30:00": "01:30:00", "1-0": "1-00:00:00",
              "1-2:30": "1-02:30:00", "1-2:30:15": "1-02:31:00", "0:30": "00:01:00", "1:75:00": "02:15:00",
              "75:00": "01:15:00", "1-": "1-00:00:00", "00:00:30": "00:01:00", "2-00:00:00": "2-00:00:00"}


def scontrol_minutes(shown: str) -> int:
    days, _, clock = shown.rpartition("-")
    h, m, s = map(int, clock.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


@pytest.mark.parametrize("text", sorted(SLURM_SAID))
def test_a_time_is_read_as_slurm_read_it(text):
    from hpc.launch.submission.sbatchflags import minutes_of

    assert minutes_of(text) == scontrol_minutes(SLURM_SAID[text])


@given(days=st.integers(0, 30), hours=st.integers(0, 99), minutes=st.integers(0, 99), seconds=st.integers(0, 99),
       form=st.sampled_from(["M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"]))
def test_every_form_of_time_is_its_seconds_rounded_up_to_minutes(days, hours, minutes, seconds, form):
    from hpc.launch.submission.sbatchflags import minutes_of

    text = {"M": f"{minutes}", "M:S": f"{minutes}:{seconds}", "H:M:S": f"{hours}:{minutes}:{seconds}",
            "D-H": f"{days}-{hours}", "D-H:M": f"{days}-{hours}:{minutes}",
            "D-H:M:S": f"{days}-{hours}:{minutes}:{seconds}"}[form]
    total = {"M": minutes * 60, "M:S": minutes * 60 + seconds, "H:M:S": (hours * 60 + minutes) * 60 + seconds,
             "D-H": (days * 24 + hours) * 3600, "D-H:M": ((days * 24 + hours) * 60 + minutes) * 60,
             "D-H:M:S": ((days * 24 + hours) * 60 + minutes) * 60 + seconds}[form]
    if total == 0:
        with pytest.raises(Exception, match="no time limit"):
            minutes_of(text)
    else:
        assert minutes_of(text) == math.ceil(total / 60)


# ---- sbatch's --export --------------------------------------------------------------------------------------


@pytest.mark.parametrize("items, inherit, values, names", [
    ([], True, {}, ()),
    (["ALL"], True, {}, ()),
    (["NONE"], False, {}, ()),
    (["FOO=1"], False, {"FOO": "1"}, ()),
    (["ALL,FOO=1,BAR=x=y"], True, {"FOO": "1", "BAR": "x=y"}, ()),
    (["HOME"], False, {}, ("HOME",)),
    (["ALL,HOME"], True, {}, ("HOME",)),
    (["FOO=1", "ALL"], True, {"FOO": "1"}, ()),  # repeated: one list
    (["NONE,FOO=2"], False, {"FOO": "2"}, ()),
    (["all,FOO=it's"], True, {"FOO": "it's"}, ()),  # Slurm's words in any case; a quote inside a value is kept
])
def test_export_is_read_in_sbatchs_grammar(items, inherit, values, names):
    from hpc.launch.submission.sbatchflags import parse_export

    got = parse_export(items, {"HOME": "/home/me"})
    assert (got.inherit, dict(got.values), got.names) == (inherit, values, names)
    assert got.sbatch_value() == (None if inherit else (",".join(names) or "NONE"))


@pytest.mark.parametrize("flag", ["--exclusive", "--nice", "-k", "--no-kill", "--get-user-env", "--propagate"])
def test_an_option_whose_value_comes_after_equals_never_takes_the_next_word(flag, tmp_path):
    """Issue 90: sbatch reads --exclusive[=user], --nice[=N], -k, --get-user-env[=T] and --propagate[=...]
    values only after `=`; bare, the next word is the next word (here hpc.study run's SWEEP.yaml)."""
    out = call("hpc.study", ["run", flag, "profiles/study-smoke.yaml", "--dry-run", "-A", "m1_g", "--runs-dir",
                             str(tmp_path)])
    assert out.code == 0, out.stderr
    long = {"-k": "--no-kill"}.get(flag, flag)
    assert out.stdout.count(f"#SBATCH {long}\n") == 2  # both arrays of the smoke sweep, the flag alone
    given = call("hpc.submit", [*ACCOUNT, f"{long}=1", "--dry-run", "--runs-dir", str(tmp_path), "--", "python", "-c",
                                "pass"])
    assert given.code == 0 and f"#SBATCH {long}=1\n" in given.stdout, given.stderr


# ---- every refusal as its whole line (issue 90: the words of an error are part of what it promises) --------

TIME_WAY = ("give minutes or [D-]H:M:S (e.g. 90, 1:30:00, 1-00:00:00), within the profile's limit (the toolkit "
            "warns the run before it ends)")
SEE = " (see python -m hpc.submit --help)"
ONE_WORD = "must be one word, without blanks or control characters" + SEE
LOCAL_WAY = "an option for a new Slurm job; --local runs on this machine, now"
WHOLE_LINES = [
    (["-t", "0"], f"argument -t/--time: '0': no time limit; {TIME_WAY}{SEE}"),
    (["-t", " 0 "], f"argument -t/--time: ' 0 ': no time limit; {TIME_WAY}{SEE}"),
    (["-t", "INFINITE"], f"argument -t/--time: 'INFINITE': no time limit; {TIME_WAY}{SEE}"),
    (["-t", "unlimited"], f"argument -t/--time: 'unlimited': no time limit; {TIME_WAY}{SEE}"),  # any case
    (["-t", "soon"], f"argument -t/--time: 'soon': not a Slurm time; {TIME_WAY}{SEE}"),
    (["-t", ""], f"argument -t/--time: '': not a Slurm time; {TIME_WAY}{SEE}"),
    (["-t", "0:0"], f"argument -t/--time: '0:0': no time limit; give a limit the profile allows{SEE}"),
    (["--sbatch", "time=0"], f"--sbatch 'time=0': '0': no time limit; {TIME_WAY}"),
    (["--export", "ALL,NONE"], "--export 'ALL,NONE': ALL and NONE together; say one"),
    (["--export", "all", "--export", "none"], "--export 'none': ALL and NONE together; say one"),
    (["--export", "NONE,ALL"], "--export 'NONE,ALL': ALL and NONE together; say one"),
    (["--export", "A-B=1"], "--export 'A-B=1': 'A-B' is not a variable name (sbatch splits --export at commas; a "
                            "value with a comma: set it here and give its bare name, --export NAME)"),
    (["--export", "A='x,y'"], "--export \"A='x,y'\": sbatch keeps quotes in the value; set it here and give its "
                              "bare name (--export A)"),
    (["--export", 'A="x"'], "--export 'A=\"x\"': sbatch keeps quotes in the value; set it here and give its bare "
                            "name (--export A)"),
    (["--export", "A=x\ny"], "--export A: the value must be one line"),
    (["--export", "A=x\0y"], "--export A: the value must be one line"),
    (["-N", "two"], f"argument -N/--nodes: 'two': not a whole number{SEE}"),
    (["--sbatch", "nodes=x"], "--sbatch 'nodes=x': 'x': not a whole number"),
    (["--sbatch", "gpus=x"], "--sbatch 'gpus=x': 'x': not a whole number"),
    (["-C", "a b"], f"argument -C/--constraint: 'a b': {ONE_WORD}"),  # a blank, 32
    (["-C", "a\x7fb"], f"argument -C/--constraint: 'a\\x7fb': {ONE_WORD}"),  # DEL, 127
    (["-C", ""], f"argument -C/--constraint: '': {ONE_WORD}"),
    (["-d", "after\tok"], f"argument -d/--dependency: 'after\\tok': {ONE_WORD}"),
    (["--mail-type", "a\x7f"], "--mail-type 'a\\x7f': the value must be one non-empty line"),
    (["--mail-type", "a\x1fb"], "--mail-type 'a\\x1fb': the value must be one non-empty line"),  # 31
    (["--mail-type", ""], "--mail-type '': the value must be one non-empty line"),
    (["--sbatch", "mail-type="], "--mail-type '': the value must be one non-empty line"),
    (["--sbatch", "mail-type=x\ny"], "--mail-type 'x\\ny': the value must be one non-empty line"),
    (["--sbatch", "a b=1"], "--sbatch 'a b=1': 'a b' is not an sbatch option name (e.g. mail-type=END)"),
    (["--sbatch", "qos"], "--sbatch 'qos': --qos takes a value (--sbatch qos=VALUE, or --qos VALUE)"),
    (["-N", "2", "--sbatch", "nodes=3"], "--sbatch 'nodes=3' and -N 2: the same option twice; say it once"),
    (["--mem", "1G", "--sbatch", "mem=2G"], "--sbatch 'mem=2G' and --mem 1G: the same option twice; say it once"),
    (["--gpus", "2", "--gpus-per-node", "4"], "--gpus 2 and --gpus-per-node 4: both count GPUs per node; say one"),
    (["-N", "2", "-G", "8"], "-G 8: sbatch's -G/--gpus counts the GPUs of the whole job; the toolkit asks per node "
                             "(one task each): say --gpus-per-node 4"),
    (["-N", "3", "-G", "8"], "-G 8: sbatch's -G/--gpus counts the GPUs of the whole job; the toolkit asks per node "
                             "(one task each): 8 GPUs do not divide over 3 node(s)"),
    (["-N", "3", "--sbatch", "gpus=8"], "--sbatch 'gpus=8': sbatch's -G/--gpus counts the GPUs of the whole job; the "
                                        "toolkit asks per node (one task each): 8 GPUs do not divide over 3 node(s)"),
    (["-o", "x.out"], "-o x.out: sbatch's --output is not taken here: each rank's output goes to RUN/logs/, the "
                      "job's beside it in RUN/"),
    (["--test-only"], "--test-only: sbatch's --test-only is not taken here: --dry-run prints the job's script and "
                      "submits nothing"),
    (["--sbatch", "output=x"], "--sbatch 'output=x': sbatch's --output is not taken here: each rank's output goes to "
                               "RUN/logs/, the job's beside it in RUN/"),
    (["--sbatch", "image=x"], "--sbatch 'image=x': the container image is the profile's: --set cluster.image=IMAGE"),
    (["--local", "--constraint", "gpu"], f"--constraint gpu: {LOCAL_WAY}"),
    (["--local", "-c", "4"], f"--cpus-per-task 4: {LOCAL_WAY}"),
    (["--local", "--exclusive"], f"--exclusive: {LOCAL_WAY}"),
    (["--local", "--sbatch", "mail-type=END"], f"--mail-type END: {LOCAL_WAY}"),
    (["--local", "--sbatch", "requeue"], f"--requeue: {LOCAL_WAY}"),
]


# plain ids: mutmut selects tests by id, and an id holding a control character cannot be selected
@pytest.mark.parametrize("argv, line", WHOLE_LINES, ids=[f"line{i}" for i in range(len(WHOLE_LINES))])
def test_each_refusal_is_its_whole_line(argv, line):
    local = argv[0] == "--local"
    base = ["--dry-run", "--config", "profiles/smoke.yaml"] if local else [*BASE, *ACCOUNT]
    out = call("hpc.submit", [*base, *argv])
    assert (out.code, out.stderr) == (2, f"hpc.submit: error: command line: {line}\n")


@pytest.mark.parametrize("argv, held", [
    (["--export", "NONE,AA,BB"], "#SBATCH --export=AA,BB"),  # bare names, from the submitting environment
    (["--export", "lower_case=1"], "#SBATCH --export=NONE"),  # a name in any case; no ALL: a fresh environment
    (["--sbatch", "mail-type=END", "--sbatch", "qos=debug"], "#SBATCH --qos=debug"),  # on past a passed option
    (["--sbatch", "export=A=1", "--sbatch", "qos=debug"], "#SBATCH --qos=debug"),  # on past an export
    (["--sbatch", "exclusive"], "#SBATCH --exclusive"),
    (["--sbatch", "exclusive=user"], "#SBATCH --exclusive=user"),  # read as given: no reader of its own
    (["--sbatch=--mail-type=END"], "#SBATCH --mail-type=END"),  # sbatch's own spelling, dashes and all
    (["-C", "a!b"], "#SBATCH --constraint='a!b'"),  # 33: printable
    (["-C", "a\x80"], "#SBATCH --constraint='a\\x80'"),  # past DEL (the dry run shows it escaped)
    (["--mail-type", "a b"], "#SBATCH --mail-type='a b'"),  # a value may hold a blank
    (["--mail-type", "a\x80"], "#SBATCH --mail-type='a\\x80'"),
], ids=lambda value: None if isinstance(value, list) else value.split()[1].split("=")[0].lstrip("-"))
def test_what_sbatch_takes_is_written_as_sbatch_takes_it(argv, held, tmp_path):
    out = dry_run([*ACCOUNT, *argv], tmp_path, {"AA": "1", "BB": "2"})
    assert out.code == 0 and held in out.stdout.splitlines(), out.stderr


def test_a_bare_wait_through_sbatch_is_the_wait_flag_not_a_second_one(tmp_path):
    out = dry_run([*ACCOUNT, "--sbatch", "wait"], tmp_path)
    assert out.code == 0, out.stderr  # no "the same option twice" against --wait's default


@pytest.mark.parametrize("text, minutes", [("0:1", 1), ("0:59", 1), ("1:0", 1), ("0:61", 2), ("0-0:0:1", 1)])
def test_a_second_of_time_is_a_minute_and_no_time_is_refused(text, minutes):
    from hpc.launch.submission.sbatchflags import minutes_of

    assert minutes_of(text) == minutes
    with pytest.raises(argparse.ArgumentTypeError, match=r"'0:0': no time limit; give a limit the profile allows"):
        minutes_of("0:0")


def test_the_profile_keys_name_the_flags_that_stand_in_for_them():
    from hpc.launch.submission.sbatchflags import profile_flags

    flags = profile_flags()
    assert flags["cluster.time_limit_min"] == ("-t/--time",) and flags["cluster.mem_gb"] == ("--mem",)
    assert "cluster.nodes" not in flags and len(flags) == 8


SLURM_HELP = Path(__file__).parents[2] / "golden" / "submit-help-slurm.txt"


def test_the_slurm_options_help_is_pinned_by_a_golden_file():
    """The Slurm group of `hpc.submit --help`, what a user reads before typing an sbatch habit: each flag, its
    value's name and its help, and no refused or passed-through option listed. UPDATE_GOLDEN=1 rewrites it."""
    out = io.StringIO()
    with environment({"COLUMNS": "120"}), contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        entry("hpc.submit")(["--help"])
    text = out.getvalue()
    section = text[text.index("\nSlurm:\n") + 1 : text.index("\nsubmission:\n") + 1]
    if os.environ.get("UPDATE_GOLDEN"):
        SLURM_HELP.write_text(section)
    assert section == SLURM_HELP.read_text(), "the Slurm options' help changed; rerun with UPDATE_GOLDEN=1 if meant"
