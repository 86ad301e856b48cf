"""The run and sweep directories' layout (hpc/core/rundir.py's module doc), pinned by literal paths: every
named file and folder of RunPaths and SweepPaths, typed `Path`, read-only."""

import dataclasses
from pathlib import Path

import pytest

from hpc.core.rundir import RunPaths, SweepPaths, Under

RUN = {
    "config": "config.yaml", "submitted": "submitted.yaml", "traces": "traces", "metrics": "metrics.jsonl",
    "summary": "summary.json", "checkpoints": "checkpoints", "checkpoint": "checkpoints/last.pt",
    "previous_checkpoint": "checkpoints/previous.pt", "checkpoint_info": "checkpoints/last.json",
    "tensorboard": "tensorboard", "lock": ".lock", "task": "task.json", "job": "job.json", "ranks": "ranks",
    "meeting": "ranks/meeting.json", "scheduler": "ranks/scheduler.json",
    "earlier": "ranks/earlier", "flight_recorder_dir": "flight_recorder", "flight_recorder_prefix": "flight_recorder/rank",
    "flight_recorder_pipe_prefix": "ranks/flight_recorder_pipe.rank", "gpus": "gpus",
}
SWEEP = {
    "sweep_file": "sweep.yaml", "index": "index.json", "study": "study.json", "analysis": "analysis",
    "analysis_jobs": "analysis-jobs", "report": "analysis/report.html", "sweep_table": "analysis/sweep.md",
    "why_table": "analysis/why.md", "runs_json": "analysis/runs.json",
}


@pytest.mark.parametrize("kind, layout", [(RunPaths, RUN), (SweepPaths, SWEEP)])
def test_every_named_place_is_where_the_layout_says(kind, layout):
    root = Path("/scratch/u/runs/tiny/41")
    paths = kind(root)
    named = {name for name, value in vars(kind).items() if isinstance(value, Under)}
    assert named == set(layout)  # none unlisted, none gone
    for name, relative in layout.items():
        got = getattr(paths, name)
        assert type(got) is type(root) and got == root / relative, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        paths.root = Path("/elsewhere")
    assert [f.name for f in dataclasses.fields(kind)] == ["root"]  # the places are no fields of the record


def test_a_place_follows_its_records_root():
    assert RunPaths(Path("a")).summary == Path("a/summary.json") and RunPaths(Path("b")).summary == Path("b/summary.json")


def test_a_sweep_point_resumed_in_its_run_directory_is_followed_under_its_new_job(tmp_path):
    """hpc.submit --resume SWEEP/61_1: index.json names the new job for that point (so hpc.study status follows
    it), its earlier job in history; every other point and the sweep's own header as they were."""
    import json

    from hpc.core.rundir import IndexPoint, SweepIndexFile, read_index, record_resumed_point, write_index

    sweep = SweepPaths(tmp_path)
    header = SweepIndexFile(sweep={"name": "s", "replicas": "seed"}, cluster="perlmutter")
    points = [IndexPoint(run_dir=f"61_{i}", data_fraction=1.0, batch_size=8, gpus=1, values={"seed": i},
                         job_id=f"61_{i}") for i in range(2)]
    write_index(sweep, header, points)
    assert record_resumed_point(sweep, "61_1", "99")
    after = {p.run_dir: (p.job_id, p.history) for p in read_index(sweep.index)}
    assert after == {"61_0": ("61_0", []), "61_1": ("99", ["61_1"])}
    said = json.loads(sweep.index.read_text())
    assert (said["sweep"], said["cluster"]) == ({"name": "s", "replicas": "seed"}, "perlmutter")
    assert not record_resumed_point(sweep, "elsewhere", "100")
