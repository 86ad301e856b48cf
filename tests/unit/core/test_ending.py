"""hpc/core/ending.py and summary.json as a function of the run directory's records (issue 60): the one
rule, the typed exit record, a summary rebuilt from its records the same file, and rebuilt on read where
a record is newer."""

import json
import os
import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from recordedruns import entries, recorded_run

from hpc.core.ending import EXIT_CODES, Outcome, RankEnd, RankExit, decode_exit, encode_exit, run_outcome
from hpc.core.summary import current_summary, decode_run_record, read_records, run_state, write_run_summary


def exit_record(rank, kind, **more):
    return RankExit(rank=rank, kind=kind, attempt="41.0.0", group="41.0.0", world_size=2, started_ns=10 + rank,
                    hostname="nid001", logs={"err": f"/r/logs/rank{rank}.err"}, **more)


def run_with(tmp_path, *records, facts=()):
    return recorded_run(tmp_path / "run", records, facts)


def test_a_summary_deleted_and_made_again_from_its_records_is_the_same_file(tmp_path):
    """Rank 1's runner was SIGKILLed (its record says running); the follower saw the job end: rank 1 is lost,
    the run preempted. That end is recorded with the records, so the summary made again says the same,
    byte for byte (before, the remade one said `running`: the follower's knowledge lived only in it)."""
    paths = run_with(tmp_path, exit_record(0, RankEnd.OK, ended_ns=50, exit_code=0),
                     exit_record(1, RankEnd.RUNNING), facts=[{"rank": 0, "attempt": "41.0.0", "steps": 7}])
    first = write_run_summary(paths, ended=True)
    assert first.outcome == "preempted" and [r.kind for r in first.ranks] == ["ok", "lost"]
    written = paths.summary.read_bytes()
    assert decode_run_record(written).outcome == Outcome.PREEMPTED  # the typed record, strictly
    with pytest.raises(msgspec.ValidationError):
        decode_run_record(written.replace(b'"outcome": "preempted"', b'"outcome": "finished-ish"'))
    paths.summary.unlink()
    assert write_run_summary(paths).outcome == "preempted"
    assert paths.summary.read_bytes() == written


def test_a_reader_gets_the_summary_its_records_make_without_writing(tmp_path):
    """No summary.json (a run killed before its last writer): a reader gets the one its records make, and
    writes nothing (it may not own the run). A summary older than a record is remade; a current one is read."""
    paths = run_with(tmp_path, exit_record(0, RankEnd.STOPPED, ended_ns=50, exit_code=3),
                     exit_record(1, RankEnd.STOPPED, ended_ns=51, exit_code=3))
    assert current_summary(paths).outcome == "stopped" and not paths.summary.exists()
    assert run_state(paths).said == Outcome.STOPPED
    write_run_summary(paths)
    paths.rank_exit(1).write_bytes(encode_exit(exit_record(1, RankEnd.FAILED, ended_ns=52, exit_code=1)))
    old = paths.summary.stat().st_mtime_ns
    os.utime(paths.rank_exit(1), ns=(old + 10**9, old + 10**9))  # the record written after the summary
    assert current_summary(paths).outcome == "failed"
    assert json.loads(paths.summary.read_text())["outcome"] == "stopped"  # on disk: untouched
    os.utime(paths.summary, ns=(old + 2 * 10**9, old + 2 * 10**9))
    assert current_summary(paths).outcome == "stopped"  # the written one, current by its time


def test_an_exit_record_not_of_the_contracts_shape_is_no_record(tmp_path):
    paths = run_with(tmp_path, exit_record(0, RankEnd.OK, ended_ns=5, exit_code=0))
    paths.rank_exit(1).write_text(json.dumps({"rank": 1, "kind": "finished-ish", "attempt": "41.0.0"}))
    paths.rank_exit(2).write_text(json.dumps({"rank": "2", "kind": "ok", "attempt": "41.0.0"}))
    assert [r.rank for r in read_records(paths)] == [0]
    with pytest.raises(msgspec.ValidationError):
        decode_exit(b'{"rank": 0, "attempt": "1.0.0"}')  # no kind


@given(st.builds(exit_record, st.integers(0, 9), st.sampled_from(list(RankEnd)), exit_code=st.none() | st.integers(0, 255),
                 signal=st.none() | st.sampled_from(["SIGKILL", "SIGTERM"]), steps_seen=st.none() | st.integers(0, 10**6)))
def test_an_exit_record_survives_its_file(record):
    assert decode_exit(encode_exit(record)) == record


KINDS = st.sampled_from([k for k in RankEnd if k != RankEnd.RUNNING])


@given(st.lists(st.tuples(KINDS, st.integers(0, 100)), min_size=1, max_size=6), st.booleans())
def test_the_one_rule_against_its_words(ends, cancelled):
    """The rule, checked against a plain statement of it (not its code): done only when every rank of the
    world ended ok; a cancel the scheduler said is a cancel unless done; else the first of the ranks that
    ended failed or oom names the run; else any rank stopped from outside makes it preempted."""
    ranks = entries({"rank": r, "kind": k, "ended_ns": t} for r, (k, t) in enumerate(ends))
    said = run_outcome(ranks, len(ranks), cancelled)
    kinds = [k for k, _ in ends]
    bad = sorted((t, k != RankEnd.OOM, r, k) for r, (k, t) in enumerate(ends) if k in (RankEnd.FAILED, RankEnd.OOM))
    if all(k == RankEnd.OK for k in kinds):
        assert said == "done"
    elif cancelled:
        assert said == "cancelled"
    elif bad:
        assert said == ("failed" if bad[0][3] == RankEnd.FAILED else "oom")
    elif any(k in ("killed", "interrupted", "peer", "lost") for k in kinds):
        assert said == "preempted"
    else:
        assert said == "stopped"
    assert run_outcome(ranks[:-1], len(ranks), False) != "done"  # a rank without a record: not done


def test_every_outcome_has_its_documented_exit_code():
    """docs/faults.md says each outcome's exit code in words (`done` 0; ...; `stopped`, `preempted` and
    `cancelled` 3): read from the document itself, every outcome said once, as the table has it."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "faults.md").read_text()
    paragraph = " ".join(text[text.index("**How a followed run ended"):].split("\n\n")[0].split())
    said = {}
    for part in paragraph.split(";"):
        code = re.search(r"`\s+(\d)\b", part)
        for word in re.findall(r"`(\w+)`", part) if code else ():
            if word in {str(o) for o in Outcome}:
                said[word] = int(code.group(1))
    assert said == {str(o): code for o, code in EXIT_CODES.items()}


def test_the_documented_exit_codes_are_the_codes_one_table():
    """The README's table of how a followed run's outcome is hpc.submit's exit code, and docs/faults.md's
    sentence, read here and held to hpc/core/ending.py EXIT_CODES (the README once said an OOM exits 4)."""
    from pathlib import Path

    from hpc.core.ending import EXIT_CODES

    repo = Path(__file__).resolve().parents[3]
    readme = repo.joinpath("README.md").read_text().split("Exit codes everywhere", 1)[1].split("\n\n")[0]
    faults = repo.joinpath("docs", "faults.md").read_text().split("How a followed run ended", 1)[1].split("\n\n")[0]
    for text in (readme, faults):
        said: dict[str, int] = {}
        for words, code in re.findall(r"((?:`\w+`(?:,\s+|\s+and\s+)?)+)\s+(\d)\b", text):
            said.update({w: int(code) for w in re.findall(r"`(\w+)`", words)})
        assert said == {str(o): c for o, c in EXIT_CODES.items()}, text


def test_a_word_is_its_enums_member_in_every_form():
    """Word: the member is its word in f-strings with a format spec, in str(), and against a plain string."""
    assert f"{Outcome.DONE:>6}|{RankEnd.LOST:<5}|" == "  done|lost |"
    assert str(Outcome.CANCELLED) == "cancelled" and Outcome.CANCELLED == "cancelled"
    assert json.dumps({"outcome": Outcome.OOM}) == '{"outcome": "oom"}'


def test_summary_json_leaves_out_the_unset_flags_and_keeps_the_rest():
    """as_dict: each of the seven optional flags (signals passed on, steps seen, stop, hung, orphaned,
    leftovers killed, pid) is left out when unset, kept when set, even to a falsy value; other unset fields
    stay, as null."""
    flags = {"signals_passed_on": ["SIGTERM"], "steps_seen": 0, "stop": "SIGINT", "hung": False, "orphaned": True,
             "leftovers_killed": False, "pid": 4242}
    bare = RankExit(rank=1, kind=RankEnd.OK, attempt="a").as_dict()
    assert not set(flags) & set(bare) and bare["exit_code"] is None and bare["message"] is None
    for key, value in flags.items():
        one = RankExit(rank=1, kind=RankEnd.OK, attempt="a", **{key: value}).as_dict()
        assert one[key] == value and set(one) - set(bare) == {key}


def test_a_bad_end_of_unknown_time_counts_as_the_first():
    """A rank whose end time was not recorded (its runner died first) is not taken for a later one."""
    from hpc.core.ending import first_bad

    ranks = entries([{"rank": 1, "kind": "failed", "ended_ns": None}, {"rank": 0, "kind": "oom", "ended_ns": 1}])
    assert first_bad(ranks).rank == 1


# squeue(1)'s JOB STATE CODES, as its manual lists them (Slurm 23.11): the oracle for the one table
SQUEUE_MANUAL_STATES = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD",
    "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
}


def test_one_table_maps_every_state_slurm_lists_onto_a_point_state():
    from hpc.core.ending import POINT_STATES, SLURM_CANCELLED, SLURM_STATES, PointState, slurm_state

    assert set(SLURM_STATES) == SQUEUE_MANUAL_STATES
    assert set(SLURM_STATES.values()) <= set(POINT_STATES)
    assert slurm_state("CANCELLED by 0") == Outcome.CANCELLED == slurm_state(SLURM_CANCELLED)  # sacct's words
    assert slurm_state("PREEMPTED") == Outcome.PREEMPTED  # not stopped: nothing says the run saved
    assert slurm_state("COMPLETED") == Outcome.DONE and slurm_state("TIMEOUT") == PointState.TIMEOUT
    assert slurm_state("NOT_A_STATE") == PointState.UNKNOWN == slurm_state(None) == slurm_state("")
    assert slurm_state(" PENDING\t") == PointState.PENDING and slurm_state(" \t") == PointState.UNKNOWN  # blanks
    assert len(POINT_STATES) == len(set(POINT_STATES)) == len(PointState) - 1 + len(Outcome)  # all but unfinished


# Slurm's slurm.h: the base states after JOB_SUSPENDED are the finished ones (IS_JOB_FINISHED); every other
# word squeue shows is a running or pending base state, or a flag over one (COMPLETING: the nodes are still
# being released and the job's own end is not yet readable; STOPPED: its tasks are SIGSTOPped, it holds its
# nodes). REVOKED is a flag too, but a federation's revoked sibling never runs here: over, as cancelled.
SLURM_FINISHED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                  "OUT_OF_MEMORY", "REVOKED"}


@pytest.mark.parametrize("word", sorted(SQUEUE_MANUAL_STATES))
def test_a_slurm_state_reads_as_ended_exactly_when_slurm_counts_the_job_finished(word):
    """Issue 90's mutants: Slurm's STOPPED read as the toolkit's `stopped`, COMPLETING read as done."""
    from hpc.core.ending import PointState, slurm_state

    not_ended = {PointState.PENDING, PointState.REQUEUED, Outcome.RUNNING}
    assert (slurm_state(word) not in not_ended) == (word in SLURM_FINISHED), (word, slurm_state(word))
    if word in ("STOPPED", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"):
        assert slurm_state(word) == Outcome.RUNNING  # it holds its nodes: not pending either
