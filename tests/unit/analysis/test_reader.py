"""analysis/read/reader.py: a trace file streamed, its events a window at a time. The oracle is the
standard library's json.load of the same file: every complete event's name, times and pid, in order, and
every other top-level value, whatever the window size (down to a few bytes, splitting strings, escapes
and multi-byte characters) and whether the file is gzip's."""

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.read.events import Event
from analysis.read.reader import Reader, read_batches
from hpc.core.errors import TraceError

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
events = st.lists(st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "i", "f", "s", "M"]), "name": names, "pid": st.integers(0, 9),
    "ts": st.integers(0, 10**9).map(float), "dur": st.integers(0, 10**5).map(float),
    "cat": st.sampled_from(["cpu_op", "kernel", "cuda_runtime"])}), max_size=40)


def read(path, chunk: int) -> tuple[list[tuple], dict]:
    reader = Reader(chunk=chunk)
    got = [(e.name, e.pid, e.ts, e.dur) for b in read_batches(path, reader) for e in b.events if isinstance(e, Event)]
    return got, reader.meta


def expected(doc: dict) -> list[tuple]:
    return [(e["name"], e["pid"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]


@settings(max_examples=60, deadline=None)
@given(events=events, chunk=st.sampled_from([1, 3, 7, 64, 1 << 20]), gz=st.booleans(),
       events_last=st.booleans(), indent=st.sampled_from([None, 1]))
def test_every_event_and_value_as_json_reads_them(tmp_path_factory, events, chunk, gz, events_last, indent):
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "A100 ☃"}], "traceEvents": events,
           "distributedInfo": {"rank": 3, "world_size": 4}}
    if events_last:
        doc = {k: doc[k] for k in ("schemaVersion", "deviceProperties", "distributedInfo", "traceEvents")}
    text = json.dumps(doc, indent=indent, ensure_ascii=False).encode()
    path = tmp_path_factory.mktemp("t") / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    oracle = json.loads(text)
    got, meta = read(path, chunk)
    assert got == expected(oracle)
    assert meta == {k: v for k, v in oracle.items() if k != "traceEvents"}


def write(tmp_path, text: str):
    path = tmp_path / "t.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, said", [
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', "truncated or malformed"),
    ('[{"ph": "X"}]', "not a Chrome trace"),
    ('{"schemaVersion": 1}', "not a Chrome trace (no top-level traceEvents)"),
    ("", "after 0 events (unexpected end of file)"),
])
def test_a_file_that_is_not_a_whole_trace_is_one_trace_error(tmp_path, text, said):
    with pytest.raises(TraceError, match=said.replace("(", r"\(").replace(")", r"\)")):
        list(read_batches(write(tmp_path, text), Reader(chunk=5)))


def test_a_cut_gzip_is_one_trace_error(tmp_path):
    whole = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": "k" * 5000, "ts": 1}] * 50}).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError, match="truncated"):
        list(read_batches(path, Reader()))
