"""A run directory as its ranks' runners leave it after a step, written from typed records: the tests' one
maker of exit records, facts and the task they ran (a user's command, whose requeue code is 3)."""

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from analysis.records import SlowRank
from hpc.core.ending import RankExit, encode_exit
from hpc.core.rundir import RunPaths
from hpc.core.summary import RankEntry, RunRecord
from hpc.settings.rankcommand import user_command


def recorded_run(root: Path, records: Iterable[RankExit], facts: Iterable[Mapping] = (), task: bool = True) -> RunPaths:
    """`root` made with each rank's exit record, its facts where given, and task.json unless `task` is False
    (a run started outside any runner)."""
    paths = RunPaths(root)
    paths.ranks.mkdir(parents=True)
    if task:
        paths.task.write_text(json.dumps(msgspec.to_builtins(user_command(["python", "train.py"], "/", None, 60))))
    for record in records:
        paths.rank_exit(record.rank).write_bytes(encode_exit(record))
    for fact in facts:
        paths.rank_facts(fact["rank"]).write_text(json.dumps(fact))
    return paths


def entries(ranks: Iterable[Mapping]) -> list[RankEntry]:
    """summary.json's rank entries decoded from the mappings a test writes, as read_summary decodes them."""
    return [msgspec.convert(r, RankEntry) for r in ranks]


def summary_of(**fields: object) -> RunRecord:
    """A RunRecord decoded from summary.json's fields as a test writes them (its ranks as mappings)."""
    return msgspec.convert(fields, RunRecord)


def slow_rank_of(**fields: object) -> SlowRank:
    """The analysis's straggler record with the fields a test gives, the rest those of a plain two-rank run."""
    plain: dict[str, object] = {"rank": 1, "node": "nid001", "own_s": 0.02, "median_own_s": 0.01,
                                "ranks_measured": 2, "steps_compared": 12}
    return msgspec.convert({**plain, **fields}, SlowRank)
