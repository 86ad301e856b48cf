"""A sweep as one HParams view in TensorBoard (issue 88): each point a session, its swept values (and the
study's fields that differ between points) as its hyperparameters, its metrics' final values as its metrics.
Written under SWEEP/analysis/hparams/ with TensorBoard's own hparams protos and event writer, so that
`python -m analysis.tensorboard SWEEP` shows it; made whole in a new folder, then put in place of the last.
No torch import, no TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from analysis.explain.metric import STUDY_WORDS, varying
from analysis.records import RunRow
from hpc.core.ending import Outcome

HPARAMS_DIR = "hparams"
MAX_METRICS = 12  # the HParams table's columns: the metrics a point logged, at most this many


def hparams_of(r: RunRow, study: list[str]) -> dict[str, object]:
    values: dict[str, object] = dict(r.values or {})
    values.update({STUDY_WORDS[f]: getattr(r, f) for f in study})
    return values


def _set(value: object, into: Any) -> None:
    """A hyperparameter's value into its google.protobuf.Value (the map makes one): a number, text or a bool."""
    if isinstance(value, bool):
        into.bool_value = value
    elif isinstance(value, (int, float)):
        into.number_value = float(value)
    else:
        into.string_value = str(value)


def write_hparams(out: Path, rows: list[RunRow]) -> Path | None:
    """SWEEP/analysis/hparams/: the experiment, then a session a point; None where no point logged a metric."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    names = list(dict.fromkeys(n for r in rows for n in (r.metrics or {})))[:MAX_METRICS]
    if not names:
        return None
    study = varying(rows)
    keys = list(dict.fromkeys(k for r in rows for k in hparams_of(r, study)))

    def write(folder: Path, summaries: list[summary_pb2.Summary], scalars: dict[str, tuple[int, float]]) -> None:
        """One event file: the hparams summaries, then each metric's final value at its last step."""
        writer = EventFileWriter(str(folder))
        for summary in summaries:
            writer.add_event(event_pb2.Event(wall_time=time.time(), summary=summary))
        for tag, (step, value) in scalars.items():
            scalar = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=scalar))
        writer.close()

    def tagged(tag: str, data: plugin_data_pb2.HParamsPluginData) -> summary_pb2.Summary:
        said = metadata.create_summary_metadata(data)
        return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=said)])

    make = Path(tempfile.mkdtemp(prefix=".hparams-", dir=out))
    try:
        experiment = api_pb2.Experiment(
            hparam_infos=[api_pb2.HParamInfo(name=k) for k in keys],
            metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=n)) for n in names],
        )
        write(make, [tagged(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))], {})
        for r in rows:
            session = make / Path(r.run_dir).name
            start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
            for key, value in hparams_of(r, study).items():
                _set(value, start.hparams[key])
            ended = api_pb2.STATUS_SUCCESS if r.outcome == Outcome.DONE else api_pb2.STATUS_FAILURE
            end = plugin_data_pb2.SessionEndInfo(status=ended, end_time_secs=time.time())
            scalars = {n: (m.last_step, m.final) for n, m in (r.metrics or {}).items() if n in names}
            said = [
                tagged(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
                tagged(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)),
            ]
            write(session, said, scalars)
        target = out / HPARAMS_DIR
        if target.exists():
            shutil.rmtree(target)
        os.replace(make, target)
    finally:
        shutil.rmtree(make, ignore_errors=True)
    return target
