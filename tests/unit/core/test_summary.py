"""hpc/core/summary.py: how a run ended, from literal rank records."""

import json

import msgspec
import pytest

from hpc.core.errors import SchemaError
from hpc.core.rundir import RunPaths
from hpc.core.summary import (
    attempt_of,
    RankFacts,
    RunRecord,
    read_facts,
    build_summary,
    failure_line,
    last_said,
    read_records,
    root_cause,
)
from hpc.core.ending import RankExit, run_outcome
from hpc.settings.rankcommand import user_command
from recordedruns import summary_of


def exits(*records):
    """Literal exit records as the runner writes them (typed: hpc/core/ending.py RankExit)."""
    return [msgspec.convert(r, RankExit) for r in records]


def record(rank, kind, ended, **more):
    return {"rank": rank, "kind": kind, "ended_ns": ended, "attempt": "9.0.0", "hostname": f"nid00{rank // 2 + 1}",
            "local_rank": rank % 2, "world_size": 4, "message": more.pop("message", f"{kind} {rank}"),
            "logs": {"err": f"/r/logs/rank{rank}.err"}, **more}


def test_the_root_cause_is_the_first_rank_to_fail_on_its_own():
    records = exits(record(0, "peer", 50), record(1, "failed", 30, message="exit 1: ValueError: x"),
                    record(2, "failed", 20, message="signal SIGSEGV: "), record(3, "peer", 10))
    assert root_cause(records).rank == 2  # the victims ended first, yet are never the cause
    assert run_outcome(records, 4) == "failed"
    line = failure_line(records, 4)
    assert line.startswith("rank 2 failed first (on nid002, local rank 0): signal SIGSEGV")
    assert "/r/logs/rank2.err" in line and "ranks 0,1,3 ended after it" in line
    assert "left no record" in failure_line(records[1:3], 4) and "ranks 0,3 left no record" in failure_line(records[1:3], 4)
    tie = exits(record(3, "failed", 5), record(1, "failed", 5))
    assert root_cause(tie).rank == 1


@pytest.mark.parametrize("kinds, outcome", [
    (["ok"] * 4, "done"), (["ok"] * 3, "running"), (["stopped"] * 4, "stopped"), (["ok", "stopped"] * 2, "stopped"),
    (["stopped", "killed", "stopped", "stopped"], "preempted"), (["interrupted"] * 4, "preempted"),
    (["running", "ok", "ok", "ok"], "running"),
])
def test_a_runs_outcome_from_its_ranks(kinds, outcome):
    assert run_outcome(exits(*[record(r, k, r) for r, k in enumerate(kinds)]), 4) == outcome
    assert failure_line(exits(*[record(r, k, r) for r, k in enumerate(kinds)]), 4) is None


def test_only_the_latest_attempt_is_read(tmp_path):
    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    old = {**record(0, "failed", 1), "attempt": "9.0.0", "group": "9.0.0", "started_ns": 100}
    new = {**record(0, "ok", 2), "attempt": "9.1.0", "group": "9.1.0", "started_ns": 200}
    paths.rank_exit(0).write_text(json.dumps(new))
    paths.rank_exit(1).write_text(json.dumps({**old, "rank": 1}))
    paths.rank_exit(2).write_text("{cut sho")  # a record cut by a full disk is not read
    assert [(r.rank, r.attempt) for r in read_records(paths)] == [(0, "9.1.0")]
    (tmp_path / "task.json").write_text(json.dumps(msgspec.to_builtins(user_command(["x"], "/", None, 60))))
    summary = build_summary(paths, read_records(paths), {})
    assert summary.outcome == "running" and summary.world_size == 4 and not summary.profiled


def test_an_earlier_starts_records_are_kept_and_said(tmp_path):
    """A torchrun restart across two nodes: each rank's runner moves its first start's record aside, and
    summary.json and one line name the rank that start lost first. The node whose worker died counts a
    restart (9.0.1), the other restarts its worker without counting (9.0.0 again): the group's store
    (a new one each start) says which records are one start. A requeue (9.1.0) is not torchrun's
    restart: no line."""
    from hpc.core.summary import restarts_line
    from hpc.core.summary import keep_earlier

    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    first = [record(0, "interrupted", 6, message="signal SIGTERM after SIGTERM", started_ns=1),
             record(1, "failed", 5, message="signal SIGKILL: killed from outside", started_ns=2)]
    first[1].update(hostname="nid002", local_rank=0)  # one rank a node
    for r in first:
        paths.rank_exit(r["rank"]).write_text(json.dumps({**r, "world_size": 2, "group": "9.0@nid001:111"}))
    for rank, attempt in ((0, "9.0.0"), (1, "9.0.1")):
        keep_earlier(paths, rank)
        paths.rank_exit(rank).write_text(json.dumps({**record(rank, "ok", 9, started_ns=7 + rank), "world_size": 2,
                                                     "attempt": attempt, "group": "9.0@nid001:222"}))
    assert sorted(p.name for p in paths.earlier.iterdir()) == ["rank0.1.exit.json", "rank1.2.exit.json"]
    assert [(r.rank, r.attempt) for r in read_records(paths)] == [(0, "9.0.0"), (1, "9.0.1")]
    summary = build_summary(paths, read_records(paths), {})
    assert summary.outcome == "done" and summary.attempt == "9.0.1"
    assert msgspec.to_builtins(summary.earlier) == [{
        "attempt": "9.0.0", "outcome": "failed", "first": "rank 1 (nid002): signal SIGKILL: killed from outside",
        "failure": "rank 1 failed first (on nid002, local rank 0): signal SIGKILL: killed from outside; its stderr: "
                   "/r/logs/rank1.err; rank 0 ended after it"}]
    assert restarts_line(summary) == (
        "torchrun restarted the worker group 1 time (ranks/earlier/ has how each rank ended): after 9.0.0, "
        "rank 1 (nid002): signal SIGKILL: killed from outside")
    assert restarts_line(msgspec.structs.replace(summary, attempt="9.1.0")) is None  # a requeue's earlier start


@pytest.mark.parametrize("lines, said", [
    # seen in CI: the script raised, then gloo's threads aborted its exit (SIGABRT)
    (["[rank1]: Traceback (most recent call last):", '[rank1]:   File "crash_ddp.py", line 24, in main',
      "[rank1]: ValueError: bad batch at step 3 on rank 1 (pid 9)", "terminate called without an active exception"],
     "[rank1]: ValueError: bad batch at step 3 on rank 1 (pid 9)"),
    (["Traceback (most recent call last):", "torch.distributed.DistBackendError: [../gloo] Connection closed"],
     "torch.distributed.DistBackendError: [../gloo] Connection closed"),
    (["loading", "Segmentation fault (core dumped)"], "Segmentation fault (core dumped)"),
    ([], None),
])
def test_a_failed_rank_is_said_by_its_exception_where_it_raised_one(lines, said):
    assert last_said(lines) == said


@pytest.mark.parametrize("env, attempt", [
    ({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}, "12.2.0"),
    ({"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "1"}, "12_1.0.0"),
    ({"SUBMITIT_LOCAL_JOB_ID": "777", "TORCHELASTIC_RESTART_COUNT": "1"}, "777.0.1"),
    ({}, "here.0.0"),
])
def test_an_attempt_is_the_job_and_its_restarts(env, attempt):
    assert attempt_of(env) == attempt


def test_a_commands_steps_are_its_beats_where_its_facts_stopped_short():
    """A script killed with no handler of its own last wrote its facts at a profiler cycle's end (5 steps):
    its runner counted 80 beats, one a step, and summary.json says 80. Facts that saw more (a training
    resumed at step 100, counted from 0 this start) keep theirs; no beats counted, the facts' stand."""
    from hpc.core.summary import rank_entries

    def facts(steps):
        return {0: RankFacts(rank=0, attempt="7.0.0", steps=steps)}

    record = {"rank": 0, "kind": "interrupted", "attempt": "7.0.0", "steps_seen": 80}
    assert rank_entries(exits(record), facts(5), ())[0].steps == 80
    assert rank_entries(exits(record), {}, ())[0].steps == 80  # killed before any facts
    assert rank_entries(exits(record), facts(100), ())[0].steps == 100
    plain = {k: v for k, v in record.items() if k != "steps_seen"}
    assert rank_entries(exits(plain), facts(5), ())[0].steps == 5


def test_only_a_command_done_with_no_step_on_any_rank_is_said_to_have_stepped_none():
    from hpc.core.summary import no_step_line

    def summary(kind="command", outcome="done", steps=(0, 0)):
        return summary_of(kind=kind, outcome=outcome, ranks=[{"rank": i, "steps": n} for i, n in enumerate(steps)])

    assert "no torch.optim optimizer step on any rank" in no_step_line(summary())
    assert no_step_line(summary(steps=(None, None))) is not None  # no facts, no beats: nothing seen either
    assert no_step_line(summary(steps=(0, 3))) is None  # one rank trained: not nothing
    assert no_step_line(summary(outcome="failed")) is None and no_step_line(summary(kind="train")) is None
    assert no_step_line(None) is None


def test_a_cancel_the_scheduler_reported_is_the_runs_outcome_unless_it_finished(tmp_path):
    """Slurm's CANCELLED (recorded by the follower) makes a stopped start `cancelled`; a finished one stays
    done, and another job's cancel (a requeued job's earlier id) is not this start's."""
    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    stopped = exits(record(0, "stopped", 10, attempt="77.0.0", world_size=1))
    (paths.ranks / "rank0.exit.json").write_bytes(msgspec.json.encode(stopped[0]))
    assert build_summary(paths, stopped, {}).outcome == "stopped"
    paths.scheduler.write_text(json.dumps({"job": "77", "state": "CANCELLED"}))
    assert build_summary(paths, stopped, {}).outcome == "cancelled"
    done = exits(record(0, "ok", 10, attempt="77.0.0", world_size=1))
    assert build_summary(paths, done, {}).outcome == "done"
    paths.scheduler.write_text(json.dumps({"job": "76", "state": "CANCELLED"}))
    assert build_summary(paths, stopped, {}).outcome == "stopped"


@pytest.mark.parametrize("outcomes, code", [
    (["done"], 0), (["oom"], 0), (["stopped"], 3), (["preempted"], 3), (["cancelled"], 3), (["failed"], 1),
    (["done", "cancelled"], 3), (["cancelled", "failed"], 1), ([], 0),
])
def test_hpc_submits_exit_code_is_the_documented_one_for_each_outcome(outcomes, code):
    """docs/faults.md's table: done and oom 0, failed 1, stopped, preempted and cancelled 3."""
    from hpc.launch.submission.follow import exit_code_of_outcomes

    assert exit_code_of_outcomes(outcomes) == code


# (outcome, the ranks' ends, srun's code) -> the job's code (docs/faults.md: afterok holds only for a run that
# finished; an OOM is 4 to Slurm but 0 to a command, a sweep's result) and the command's
JOB_CODES = [
    ("done", [], 9, 0, 0),
    ("oom", [{"kind": "oom", "exit_code": 4}], 4, 4, 0),
    ("failed", [{"kind": "stopped", "exit_code": 3}, {"kind": "failed", "exit_code": 7}], 7, 7, 1),
    ("failed", [{"kind": "failed", "signal": "SIGKILL"}], 9, 137, 1),
    ("stopped", [{"kind": "stopped", "exit_code": 0}], 0, 3, 3),
    ("preempted", [{"kind": "killed", "stop": "SIGTERM", "signal": "SIGKILL"}], 0, 3, 3),
    ("cancelled", [{"kind": "interrupted", "exit_code": 0}], 0, 1, 3),
    ("running", [{"kind": "running"}], 143, 143, 1),
    (None, [], 0, 1, 1),
    (None, [], 2, 2, 1),
]


@pytest.mark.parametrize("outcome, ranks, step_rc, job, command", JOB_CODES)
def test_a_runs_exit_code_is_decided_once_for_its_job_and_for_a_command(outcome, ranks, step_rc, job, command):
    from hpc.core.ending import Outcome
    from hpc.core.summary import CodeFor, run_exit_code

    entries = summary_of(ranks=[{"rank": r, **e} for r, e in enumerate(ranks)]).ranks
    said = Outcome(outcome) if outcome is not None else None
    assert run_exit_code(said, CodeFor.JOB, entries, step_rc) == job
    assert run_exit_code(said, CodeFor.COMMAND, entries, step_rc) == command


def test_summary_json_says_its_schema_and_another_is_refused_in_one_line(tmp_path):
    """Issue 73: a file of another layout (a later toolkit's) is not read as this one; one of the first
    layout, written before the field, is."""
    from hpc.core.summary import SUMMARY_SCHEMA, decode_run_record, read_summary

    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    paths.rank_exit(0).write_text(json.dumps({**record(0, "ok", 2), "group": "9.0.0", "started_ns": 1}))
    written = build_summary(paths, read_records(paths), {})
    assert written.schema == SUMMARY_SCHEMA == 1
    path = tmp_path / "summary.json"
    for schema, read in ((1, True), (None, True), (2, False), ("1", False), (True, False)):
        said = []
        body = {k: v for k, v in msgspec.to_builtins(written).items() if k != "schema"}
        path.write_text(json.dumps(body if schema is None else {**body, "schema": schema}))
        got = read_summary(path, said.append)
        assert (got is not None) is read, (schema, said)
        assert said == ([] if read else [f"{path}: ignored: schema {schema!r}, and this toolkit reads schema 1"])
    with pytest.raises(SchemaError, match="schema 2, and this toolkit reads schema 1"):
        decode_run_record(json.dumps({**msgspec.to_builtins(written), "schema": 2}).encode())


def test_every_record_between_processes_says_its_schema_and_another_is_refused(tmp_path, caplog):
    """Issue 73: an exit record, scheduler.json and task.json of a later toolkit's layout are each refused by
    their reader, said in one line, never read as this one's; one written before the field was added (no
    schema) is of the first. The oracle: the outcome the summary reads with the record, and without it."""
    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    stopped = record(0, "stopped", 10, attempt="77.0.0", group="77.0.0", world_size=1)
    for schema, read in ((None, True), (1, True), (2, False)):
        paths.rank_exit(0).write_text(json.dumps(stopped if schema is None else {**stopped, "schema": schema}))
        caplog.clear()
        assert [r.rank for r in read_records(paths)] == ([0] if read else [])
        assert ("rank0.exit.json: not an exit record (schema 2, and this toolkit reads schema 1)" in caplog.text) is (not read)
    paths.rank_exit(0).write_text(json.dumps(stopped))
    assert "schema" not in msgspec.to_builtins(build_summary(paths, read_records(paths), {}).ranks[0])  # summary.json's
    for schema, outcome in ((None, "cancelled"), (1, "cancelled"), (2, "stopped")):
        said = {"job": "77", "state": "CANCELLED"}
        paths.scheduler.write_text(json.dumps(said if schema is None else {**said, "schema": schema}))
        caplog.clear()
        assert build_summary(paths, read_records(paths), {}).outcome == outcome
        assert ("scheduler.json: ignored: schema 2, and this toolkit" in caplog.text) is (schema == 2)
    task = msgspec.to_builtins(user_command(["python", "train.py"], "/", {"enabled": True}, 60))
    for schema, command in ((1, ["python", "train.py"]), (2, None)):
        (tmp_path / "task.json").write_text(json.dumps({**task, "schema": schema}))
        paths.rank_exit(0).write_text(json.dumps({k: v for k, v in stopped.items() if k != "command"}))
        caplog.clear()
        summary = build_summary(paths, read_records(paths), {})
        assert summary.command == command and summary.profiled is (schema == 1)
        assert ("task.json: ignored: schema 2, and this toolkit" in caplog.text) is (schema == 2)


def test_hpc_rank_refuses_a_task_json_it_cannot_read_in_one_line(tmp_path):
    """`python -m hpc.rank --run-dir RUN` runs RUN/task.json again: one that is missing, not a task, of
    another schema or without a command is one line, exit 2, and nothing is written."""
    import subprocess
    import sys

    from conftest import assert_one_line_error

    task = msgspec.to_builtins(user_command(["python", "train.py"], "/", None, 60))
    cases = {"missing": None, "garbage": b"{not json", "later": json.dumps({**task, "schema": 2}).encode(),
             "empty": json.dumps({**task, "words": []}).encode()}
    needles = {"missing": "no task.json", "garbage": "task.json is not a task",
               "later": "task.json is not a task (schema 2, and this toolkit reads schema 1)", "empty": "has no command in it"}
    for name, body in cases.items():
        run = tmp_path / name
        run.mkdir()
        if body is not None:
            (run / "task.json").write_bytes(body)
        before = sorted(p.name for p in run.iterdir())
        proc = subprocess.run([sys.executable, "-m", "hpc.rank", "--run-dir", str(run)], capture_output=True,
                              text=True, timeout=60)
        assert_one_line_error(proc, needles[name])
        assert sorted(p.name for p in run.iterdir()) == before


def test_the_runs_oom_is_the_lowest_ranks_record_decoded_and_a_mistyped_one_is_none(tmp_path, caplog):
    """Issue 73: summary.json's `oom` is an OomRecord (hpc/training/oom.py's recorder, the training's and a
    script's); one that is not that shape is said and left out, never handed on as a dict."""
    from hpc.core.summary import OomRecord

    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    ended = exits(record(0, "oom", 5, attempt="3.0.0", exit_code=4), record(1, "oom", 6, attempt="3.0.0", exit_code=4))
    oom = {"rank": 1, "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "batch_size_per_gpu": 512}
    paths.rank_facts(1).write_text(json.dumps({"rank": 1, "attempt": "3.0.0", "steps": 4, "oom": oom}))
    paths.rank_facts(0).write_text(json.dumps({"rank": 0, "attempt": "3.0.0", "steps": 4, "oom": {"rank": "x"}}))
    facts = read_facts(paths)
    assert "rank 0: its out-of-memory record ignored" in caplog.text and facts[0].steps == 4  # the rest is kept
    summary = build_summary(paths, ended, facts)
    assert summary.oom == OomRecord(rank=1, message=oom["message"], batch_size_per_gpu=512)
    assert build_summary(paths, ended, {0: facts[0]}).oom is None


def test_a_facts_file_not_of_its_shape_is_no_record_and_said(tmp_path, caplog):
    """Issue 73: each rank's facts are decoded into RankFacts when read; a mistyped one is said in a line
    naming the value and left out, a cut one (being written) is no record yet, the others are kept."""
    paths = RunPaths(tmp_path)
    paths.ranks.mkdir()
    paths.rank_facts(0).write_text(json.dumps({"rank": 0, "steps": "x"}))
    paths.rank_facts(1).write_text(json.dumps({"rank": 1, "steps": 3, "step_time_s": {"n": 2, "mean": 0.5}}))
    paths.rank_facts(2).write_text('{"rank": 2, "ste')
    facts = read_facts(paths)
    assert list(facts) == [1] and facts[1].step_time_s.mean == 0.5
    assert "rank0.facts.json: not a facts record (steps 'x': Expected `int | null`, got `str`" in caplog.text
    assert "rank2" not in caplog.text


def test_a_facts_file_says_its_layout_and_one_of_another_is_refused_in_a_line(tmp_path, caplog):
    """Issue 73: rank{R}.facts.json carries its layout like every record between processes; one of a later
    layout is said and not read, one without the field (written before it) is of the first."""
    from hpc.core.summary import write_facts

    paths = RunPaths(tmp_path)
    write_facts(paths, RankFacts(rank=0, steps=3))
    assert json.loads(paths.rank_facts(0).read_text())["schema"] == 1
    paths.rank_facts(1).write_text(json.dumps({"rank": 1, "steps": 4}))
    paths.rank_facts(2).write_text(json.dumps({"rank": 2, "steps": 5, "schema": 2}))
    assert {r: f.steps for r, f in read_facts(paths).items()} == {0: 3, 1: 4}
    assert "rank2.facts.json: not read: schema 2, and this toolkit reads schema 1" in caplog.text
