"""hpc/launch/status.py: each point's state from the queue, its run directory and its records; its logs give
only an error's words."""

import json

from hpc.core.ending import RankEnd, RankExit
from hpc.core.rundir import RunPaths
from hpc.core.summary import record_scheduler
from hpc.launch.status import PointStatus, point_state
from hpc.launch.submission.queue import Queued
from recordedruns import recorded_run


def _run_dir(root, name, summary=None, err="", metrics=()):
    d = root / name
    d.mkdir()
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    (d / f"{name}_0_log.err").write_text(err)
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return d


def test_point_state_from_queue_run_directory_and_logs(tmp_path):
    done = _run_dir(tmp_path, "1_0", {"outcome": "done", "ranks": [{"rank": 0, "complete": True, "steps": 6}]})
    oom = _run_dir(tmp_path, "1_1", {"outcome": "oom", "ranks": []})
    crashed = _run_dir(tmp_path, "1_2", err="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n",
                       metrics=[{"kind": "train", "step": 2}, {"kind": "train", "step": 3}])
    # its second start (Slurm's restart count 1, recorded by its ranks) ended by Slurm at the time limit, as its
    # batch shell recorded scontrol's word; the log's line is only the words shown
    timed_out = recorded_run(tmp_path / "1_3", [RankExit(rank=0, kind=RankEnd.KILLED, attempt="1_3.1.0", started_ns=1,
                                                         ended_ns=2, signal="SIGTERM")]).root
    record_scheduler(RunPaths(timed_out), job="1_3", state="TIMEOUT")
    (timed_out / "1_3_0_log.err").write_text("slurmstepd: error: *** JOB 1 ON nid001 CANCELLED AT 2026 DUE TO TIME "
                                             "LIMIT ***\n")
    said_only = _run_dir(tmp_path, "1_5", err="slurmstepd: error: *** JOB 1 ON nid001 CANCELLED AT 2026 DUE TO TIME "
                                             "LIMIT ***\nsubmitit INFO (2026) - Requeued job 1 (2 remaining timeouts)\n")
    assert point_state(done, "1_0", None, None).state == "done"
    assert point_state(done, "1_0", None, None).steps == 6
    assert point_state(oom, "1_1", None, None).state == "oom"
    assert point_state(crashed, "1_2", None, None) == PointStatus("failed", 0, 3, "RuntimeError: boom")
    t = point_state(timed_out, "1_3", None, None)
    assert t.state == "timeout" and t.requeues == 1 and "DUE TO TIME LIMIT" in t.error
    assert point_state(tmp_path / "never", "1_4", None, None).state == "missing"
    # a log's text is no state: the words alone make neither a timeout nor a requeue
    assert point_state(said_only, "1_5", None, None) == PointStatus("failed", 0, None, t.error)
    assert point_state(crashed, "1_2", Queued("RUNNING"), None).state == "running"  # the queue knows best
    assert point_state(tmp_path / "never", "1_4", Queued("PENDING"), None).state == "pending"
    # pending again after it ran: Slurm requeued it (a lost node, a preemption) or it requeued itself
    assert point_state(_checkpoint_info(crashed, 2, 6), "1_2", Queued("PENDING"), None).state == "requeued"
    assert point_state(tmp_path / "never", "1_4", Queued("PENDING", 1), None) == PointStatus("requeued", 1, None, None)
    assert point_state(crashed, "1_2", None, "OUT_OF_MEMORY").state == "failed"  # host OOM: sacct's word
    assert point_state(crashed, "1_2", None, "CANCELLED").state == "cancelled"  # a person's scancel, not a failure
    assert point_state(tmp_path / "never", "1_4", None, "CANCELLED").state == "cancelled"  # before it started


def _checkpoint_info(run_dir, step, stop_at):
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "checkpoints" / "last.json").write_text(json.dumps({"step": step, "stop_at": stop_at}))
    return run_dir


def test_a_silent_queue_leaves_unknown_what_the_run_directory_cannot_settle(tmp_path):
    """squeue failing (controller down): done and oom come from the run directory; a point that is not
    finished may be running, so it is unknown, never "failed" (and never resubmitted on that word)."""
    done = _run_dir(tmp_path, "2_0", {"outcome": "done", "ranks": [{"rank": 0, "complete": True, "steps": 6}]})
    oom = _run_dir(tmp_path, "2_1", {"outcome": "oom", "ranks": []})
    halfway = _checkpoint_info(_run_dir(tmp_path, "2_2", metrics=[{"kind": "train", "step": 4}]), 4, 8)
    crashed = _run_dir(tmp_path, "2_3", err="RuntimeError: boom\n")
    assert point_state(done, "2_0", None, None, queue_known=False).state == "done"
    assert point_state(oom, "2_1", None, None, queue_known=False).state == "oom"
    assert point_state(halfway, "2_2", None, None, queue_known=False) == PointStatus("unknown", 0, 4, None)
    assert point_state(crashed, "2_3", None, None, queue_known=False).state == "unknown"
    assert point_state(tmp_path / "never", "2_4", None, None, queue_known=False).state == "unknown"
    assert point_state(halfway, "2_2", None, None).state == "failed"  # the queue read: it is not running
    # its final checkpoint written, its summary not yet (issue 90): it may be running, ending; the queue decides
    ending = _checkpoint_info(_run_dir(tmp_path, "2_5", metrics=[{"kind": "train", "step": 8}]), 8, 8)
    assert point_state(ending, "2_5", None, None, queue_known=False).state == "unknown"
    assert point_state(ending, "2_5", None, None).state == "done"  # the queue read: it has ended


def test_a_finished_run_without_its_summary_is_done_and_says_what_is_missing(tmp_path):
    """Killed between its last checkpoint and summary.json: the checkpoint says it is complete."""
    finished = _checkpoint_info(_run_dir(tmp_path, "3_0"), 8, 8)
    state = point_state(finished, "3_0", None, None)
    assert state.state == "done" and state.steps == 8 and "summary.json missing" in state.error
    stale = _checkpoint_info(_run_dir(tmp_path, "3_1", {"ranks": [{"rank": 0, "complete": False, "steps": 4}]}), 8, 8)
    assert point_state(stale, "3_1", None, None).state == "done"  # the summary said stopped at 4: out of date
    said_stopped = _checkpoint_info(_run_dir(tmp_path, "3_2", {"ranks": [{"rank": 0, "complete": False, "steps": 4}]}),
                                    4, 8)
    assert point_state(said_stopped, "3_2", None, None).state == "stopped"


def test_slurms_words_for_an_ended_job_are_read_through_the_one_table(tmp_path):
    """Issue 73: sacct's PREEMPTED is a preemption (it was `stopped`, a word that says the run saved); TIMEOUT
    alone (no log line) is the time limit; a job still accounted RUNNING after it left the queue is running;
    a state no Slurm lists is unknown, never shown lower-cased as a word of its own."""
    crashed = _run_dir(tmp_path, "4_0", err="RuntimeError: boom\n")
    assert point_state(crashed, "4_0", None, "PREEMPTED").state == "preempted"
    assert point_state(crashed, "4_0", None, "TIMEOUT").state == "timeout"
    assert point_state(crashed, "4_0", None, "RUNNING").state == "running"
    assert point_state(crashed, "4_0", None, "NODE_FAIL").state == "failed"
    assert point_state(crashed, "4_0", Queued("SOMETHING_NEW"), None).state == "unknown"
    assert point_state(crashed, "4_0", Queued("REQUEUE_HOLD"), None).state == "requeued"
    assert point_state(crashed, "4_0", None, "PREEMPTED").error == "RuntimeError: boom"  # the why, kept
