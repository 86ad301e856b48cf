"""Properties of every reader, over generated input (Hypothesis): the YAML config and profile loader,
the trace reader (real traces from ../shared/traces mutated, and generated Kineto-shaped JSON), the Slurm
hostlist and task-count parsers, and the readers of summary.json, index.json and metrics.jsonl.

Each reader's promise: a value of the documented shape, or the toolkit's own error (ConfigError,
TraceError, HostlistError, DistEnvError) whose one-line message names the file or value; never another
exception. The examples Hypothesis shrank failures to are kept as regular cases in test_bad_input.py.
CI runs a fixed sequence (tests/conftest.py's "ci" profile); HPC_FUZZ_SCALE multiplies the examples."""

import gzip
import json
import math
import os
import random
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analysis.records import TraceRecord
from analysis.pipeline import analyze_trace
from conftest import SHARED_TRACES
from hpc.core.errors import ConfigError, DistEnvError, HostlistError, TraceError
from hpc.core.rundir import RunPaths, read_index, read_metrics, truncate_metrics
from hpc.core.summary import RunRecord, read_summary
from hpc.core.summary import run_state
from hpc.settings.config import Layers
from hpc.placement.hostlist import expand_hostlist, expand_tasks_per_node
from hpc.settings.schema import RUN_SECTIONS, SECTIONS

SCALE = int(os.environ.get("HPC_FUZZ_SCALE", "1"))


def examples(n: int) -> settings:
    return settings(max_examples=max(1, n * SCALE))


# --- YAML configs and profiles ------------------------------------------------------------------------

KEYS = {name: [f for f in cls.__dataclass_fields__] for name, cls in SECTIONS.items()}
YAML_SCALARS = ["0", "-1", "1.5", "1/10", "1e999", ".inf", "-.nan", "0x1F", "0o17", "1_000", "true", "no", "On",
                "~", "null", "''", '"a\\tb"', "2026-11-23", "2026-11-23T10:00:00Z", "!!binary aGVsbG8=",
                "!!str 5", "!!int '7'", "!!float '2'", "!!set {a, b}", "!!omap [a: 1]", "!!python/tuple [1]",
                "!custom x", "[1, 2]", "{a: 1}", "'" + "9" * 5000 + "'", "9" * 5000, "&x 3", "*x", "*undefined",
                "|\n    text", "[" * 40 + "]" * 40, "\"\\u0000\"", "\"\\udc80\""]


@st.composite
def yaml_documents(draw) -> str:
    """A config-shaped document: known and unknown sections and keys, every scalar kind, anchors,
    aliases, merge keys, tags, duplicate keys, deep nesting; or not YAML at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200)).decode("latin-1")
    lines = []
    sections = draw(st.lists(st.sampled_from([*SECTIONS, "trian", "x"]), min_size=0, max_size=4))
    for i, section in enumerate(sections):
        anchor = f" &s{i}" if draw(st.booleans()) else ""
        lines.append(f"{section}:{anchor}")
        if i and draw(st.integers(0, 3)) == 0:
            lines.append(f"  <<: *s{draw(st.integers(0, i - 1))}")
        for _ in range(draw(st.integers(0, 4))):
            key = draw(st.sampled_from(KEYS.get(section, ["k"]) + ["unknown_key", "<<"]))
            value = draw(st.one_of(st.sampled_from(YAML_SCALARS), st.integers().map(str),
                                   st.floats().map(repr), st.text(max_size=30).map(json.dumps)))
            lines.append(f"  {key}: {value}")
    if draw(st.integers(0, 5)) == 0:
        lines.append("train: " + "[" * 3000 + "]" * 3000)
    return "\n".join(lines) + "\n"


@given(text=yaml_documents())
@examples(150)
def test_yaml_loader_gives_a_config_or_a_config_error_naming_the_file(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        layers = Layers().add_file(path, only=RUN_SECTIONS)
        cfg = layers.run_config()
    except ConfigError as e:
        message = str(e)
        assert str(path) in message or "--set" in message, message[:300]
        assert "\n" not in " ".join(message.split()) and len(message) < 10_000
        return
    assert all(math.isfinite(v) for v in (cfg.train.momentum, cfg.train.weight_decay, cfg.data.fraction))


@given(base=st.fixed_dictionaries({}, optional={"lr": st.floats(0.001, 1.0), "epochs": st.integers(1, 50),
                                                "seed": st.integers(0, 2**32 - 1), "schedule": st.sampled_from(
                                                    ["cosine", "constant", "multistep"])}),
       override=st.fixed_dictionaries({}, optional={"lr": st.floats(0.001, 1.0), "epochs": st.integers(1, 50)}))
@examples(60)
def test_merge_keys_merge_and_written_keys_win(base, override, tmp_path_factory):
    """`<<:` works as in PyYAML's safe loader: the merged keys, then the mapping's own override them."""
    text = "train:\n  <<: " + json.dumps(base) + "\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in override.items())
    assert yaml.safe_load(text)["train"] == {**base, **override}  # the reference
    path = tmp_path_factory.mktemp("merge") / "c.yaml"
    path.write_text(text)
    train = Layers().add_file(path).run_config().train
    assert {k: getattr(train, k) for k in {**base, **override}} == pytest.approx({**base, **override})


def test_an_alias_of_an_anchor_in_another_section_is_read(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("profiler:\n  active: &n 4\ntrain:\n  epochs: *n\n  <<: &t {lr: 0.25}\n")
    cfg = Layers().add_file(path).run_config()
    assert (cfg.profiler.active, cfg.train.epochs, cfg.train.lr) == (4, 4, 0.25)


# --- traces ------------------------------------------------------------------------------------------

# Two real traces of different eras and sizes: a 2-rank NCCL job (0.1 MB) and a DDP ResNet-50 (0.7 MB).
SMALL_TRACES = ["hta/trace_filter_2rank/sampled_rank-0.json.gz", "hta_single/nccl_data.json.gz"]
CATEGORIES = ["cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset", "Operator",
              "Runtime", "Kernel", "Memcpy", "python_function", "gpu_user_annotation", None, 5, ""]
ODD_VALUES = [None, True, "10", "", [1], {"a": 1}, -1, 0, 1e308, -1e308, 2**70, float("nan"), float("inf"), "\ud800"]


@st.composite
def kineto_events(draw) -> dict:
    event = {"ph": draw(st.sampled_from(["X", "X", "X", "i", "M", "f", "s", "B", 1])),
             "cat": draw(st.sampled_from(CATEGORIES)), "name": draw(st.sampled_from(
                 ["ProfilerStep#1", "aten::conv2d", "cudaLaunchKernel", "ncclKernel_AllReduce", "[memory]",
                  "void gemm<...>", "Memcpy DtoD", ""])),
             "pid": draw(st.integers(0, 3)), "tid": draw(st.integers(0, 9)),
             "ts": draw(st.floats(0, 1e6)), "dur": draw(st.floats(0, 1e4))}
    if draw(st.booleans()):
        event["args"] = {"correlation": draw(st.integers(-1, 50)), "stream": draw(st.integers(0, 20)),
                         "Total Allocated": draw(st.integers(0, 2**40)), "Device Type": draw(st.integers(0, 1)),
                         "Device Id": 0}
    for _ in range(draw(st.integers(0, 2))):  # a field retyped or dropped
        key = draw(st.sampled_from(sorted(event)))
        if draw(st.booleans()):
            event.pop(key)
        else:
            event[key] = draw(st.sampled_from(ODD_VALUES))
    return event


def _json_bytes(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


def assert_record_or_trace_error(path: Path) -> TraceRecord | None:
    try:
        record = analyze_trace(path)
    except TraceError as e:
        assert str(e) and "\n" not in str(e), str(e)
        return None
    for name in ("cpu_time_us", "cuda_time_us", "gpu_busy_us", "comm_time_us", "step_time_us_mean"):
        value = getattr(record, name)
        assert value is None or math.isfinite(value), (name, value)
    assert 0 <= record.bad_events <= record.events
    return record


@given(events=st.lists(kineto_events(), max_size=40), meta=st.dictionaries(
    st.sampled_from(["schemaVersion", "distributedInfo", "deviceProperties", "displayTimeUnit"]),
    st.sampled_from(ODD_VALUES + [{"rank": 1, "world_size": 2}, {"rank": "x"}])), gz=st.booleans())
@examples(120)
def test_generated_kineto_json_gives_a_record_or_a_trace_error(events, meta, gz, tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / ("t.json.gz" if gz else "t.json")
    data = _json_bytes({**meta, "traceEvents": events})
    path.write_bytes(gzip.compress(data) if gz else data)
    record = assert_record_or_trace_error(path)
    if record is not None:
        assert record.events == len(events)


@given(items=st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)),
                      max_size=20))
@examples(40)
def test_a_trace_with_no_event_objects_is_refused(items, tmp_path_factory):
    """traceEvents that holds no objects at all (or nothing) is no trace to analyse: one line, not an empty
    record with exit 0."""
    path = tmp_path_factory.mktemp("noobj") / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": items}))
    with pytest.raises(TraceError, match="no event"):
        analyze_trace(path)


@pytest.fixture(scope="module")
def real_traces():
    packed = {rel: (SHARED_TRACES / rel).read_bytes() for rel in SMALL_TRACES}
    return {rel: (gzip.decompress(gz), gz, json.loads(gzip.decompress(gz))) for rel, gz in packed.items()}


# Byte-level damage on both traces; field-level on the small one (re-serialising the larger costs 0.3 s).
MUTATIONS = [(t, how) for t in SMALL_TRACES for how in ("cut", "splice", "cut-gz")] + [
    (SMALL_TRACES[0], how) for how in ("retype", "drop", "extreme")]


@pytest.mark.traces
@given(mutation=st.sampled_from(MUTATIONS), seed=st.integers(0, 2**32 - 1))
@examples(50)
def test_real_traces_mutated_give_a_record_or_a_trace_error(real_traces, mutation, seed, tmp_path_factory):
    which, how = mutation
    rng = random.Random(seed)
    raw, gz, doc = real_traces[which]
    path = tmp_path_factory.mktemp("mut") / "t.json"
    if how in ("cut", "splice", "cut-gz"):
        at = rng.randrange(len(raw))
        data = raw[:at] if how != "splice" else raw[:at] + bytes(rng.randrange(256) for _ in range(8)) + raw[at:]
        if how == "cut-gz":
            data, path = gz[: rng.randrange(1, len(gz))], path.with_suffix(".gz")
        path.write_bytes(data)
        assert_record_or_trace_error(path)
        return
    events = doc["traceEvents"]
    picked = rng.sample(range(len(events)), k=min(20, len(events)))
    saved = {i: dict(events[i]) for i in picked}  # the parsed trace is shared: mutate, write, put back
    for i in picked:
        event = events[i] = dict(events[i])
        key = rng.choice(sorted(event))
        if how == "drop":
            event.pop(key)
        elif how == "retype":
            event[key] = rng.choice(ODD_VALUES)
        elif isinstance(event.get(key), (int, float)):
            event[key] = rng.choice([1e300, -1e300, 2**63, -(2**63), 0, float("nan")])
    try:
        path.write_bytes(_json_bytes(doc))
    finally:
        for i, event in saved.items():
            events[i] = event
    record = assert_record_or_trace_error(path)
    assert record is not None  # a whole file with some odd events is still analysed (they are skipped)


# --- Slurm's lists --------------------------------------------------------------------------------------

PREFIXES = st.text(alphabet="abnidgpu-_", min_size=1, max_size=5).filter(lambda p: not p[-1].isdigit())


@st.composite
def host_runs(draw) -> list[tuple[str, int, int, int]]:
    """Runs of hosts: (prefix, first number, count, zero-padded width)."""
    return draw(st.lists(st.tuples(PREFIXES, st.integers(0, 5000), st.integers(1, 40), st.integers(0, 5)),
                         min_size=1, max_size=6))


def compress(runs) -> tuple[str, list[str]]:
    """A hostlist for the runs, and the hosts it must expand to, in order."""
    parts, hosts = [], []
    for prefix, first, count, width in runs:
        last = first + count - 1
        width = max(width, 0)
        names = [f"{prefix}{n:0{width}d}" for n in range(first, last + 1)]
        parts.append(f"{prefix}[{first:0{width}d}-{last:0{width}d}]" if count > 1 else names[0])
        hosts.extend(names)
    return ",".join(parts), hosts


@given(runs=host_runs())
@examples(200)
def test_hostlists_round_trip_in_order_and_count(runs):
    expr, hosts = compress(runs)
    assert expand_hostlist(expr) == hosts
    assert len(expand_hostlist(expr)) == sum(count for _, _, count, _ in runs)


@given(text=st.text(alphabet="nid[]-,0123456789x+ \t", max_size=30))
@examples(300)
def test_any_hostlist_text_expands_or_is_refused(text):
    try:
        hosts = expand_hostlist(text)
    except HostlistError as e:
        assert text[:20] in str(e) or repr(text)[1:21] in str(e)
        return
    # Names as scontrol prints them: Slurm keeps odd text as it is ("[" is one empty name, "[,][" the name
    # "[,]]"); agreement with scontrol itself is tests/e2e/test_hostlist_scontrol.py's.
    assert all(type(h) is str for h in hosts) and len(hosts) <= 64 * 1024 * 8


@given(counts=st.lists(st.tuples(st.integers(0, 64), st.integers(1, 50)), min_size=1, max_size=8))
@examples(150)
def test_tasks_per_node_round_trips(counts):
    expr = ",".join(f"{c}(x{r})" if r > 1 else str(c) for c, r in counts)
    assert expand_tasks_per_node(expr) == [c for c, r in counts for _ in range(r)]


@given(text=st.text(max_size=30))
@examples(200)
def test_any_tasks_per_node_text_expands_or_is_refused(text):
    try:
        counts = expand_tasks_per_node(text)
    except DistEnvError as e:
        assert "SLURM_TASKS_PER_NODE" in str(e)
        return
    assert counts and all(type(c) is int and c >= 0 for c in counts) and len(counts) <= 1 << 20


# --- the run and sweep directory readers ------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
                        ["ranks", "rank", "points", "run_dir", "data_fraction", "batch_size", "gpus", "config",
                         "oom", "world_size", "kind", "step", "x", "stop_at", "steps", "complete", "outcome"]), inner,
                        max_size=5), max_leaves=20)


@given(value=JSON | st.binary(max_size=50))
@examples(150)
def test_run_directory_readers_take_anything(value, tmp_path_factory):
    root = tmp_path_factory.mktemp("read")
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    for name in ("summary.json", "index.json", "metrics.jsonl"):
        (root / name).write_bytes(data)
    warnings: list[str] = []
    summary = read_summary(root / "summary.json", warnings.append)
    assert summary is None or (isinstance(summary, RunRecord) and all(
        isinstance(r, dict) and type(r["rank"]) is int for r in summary.ranks))
    for point in read_index(root / "index.json", warnings.append):
        assert isinstance(point.run_dir, str) and not Path(point.run_dir).is_absolute()
        assert all(getattr(point, k) > 0 for k in ("data_fraction", "batch_size", "gpus", "nodes"))
    assert all(isinstance(r, dict) for r in read_metrics(root / "metrics.jsonl"))
    assert all(isinstance(w, str) and w for w in warnings)
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "last.json").write_bytes(data)
    state = run_state(RunPaths(root), warnings.append)  # the run's state from any files: never a traceback
    assert state.leaves in (None, "done", "stopped", "oom")
    assert state.step is None or (type(state.step) is int and state.step >= 0)
    assert state.complete == (state.leaves == "done")


@given(kept=st.integers(0, 40), lines=st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=30))
@examples(60)
def test_a_resume_keeps_each_step_once(kept, lines, tmp_path_factory):
    """metrics.jsonl after a resume from step `kept`: every record up to it, nothing after it, whatever came
    before (records of any steps, lines a kill cut short)."""
    path = tmp_path_factory.mktemp("resume") / "metrics.jsonl"
    text = "".join(json.dumps({"kind": "train", "step": step}) + "\n" if whole else '{"kind": "tr'
                   for step, whole in lines)
    path.write_text(text)
    before = [r.step for r in read_metrics(path)]
    truncate_metrics(path, kept)
    assert [r.step for r in read_metrics(path)] == [step for step in before if step <= kept]
    assert all(line.startswith("{") and line.endswith("}") for line in path.read_text().splitlines())


METRICS_LINE = st.fixed_dictionaries(
    {"kind": st.sampled_from(["train", "epoch", "eval", 1])},
    optional={"step": st.integers(-2, 50) | st.booleans() | st.text(max_size=2), "loss": st.floats() | st.text(max_size=2),
              "eval_images": st.integers(0, 9) | st.floats(0, 9), "extra": JSON})


def a_metrics_record(value: object) -> bool:
    """metrics.jsonl's layout as the writer states it, written out here: kind train or epoch, a step a whole
    number from 0, a loss a finite number, eval_images a whole number; any other key is not read."""
    if not isinstance(value, dict) or value.get("kind") not in ("train", "epoch"):
        return False
    step, loss, images = value.get("step"), value.get("loss"), value.get("eval_images")
    finite = loss is None or (type(loss) in (int, float) and math.isfinite(loss))
    return (step is None or (type(step) is int and step >= 0)) and finite and (images is None or type(images) is int)


def no_constant(word: str) -> object:
    raise ValueError(f"{word} is no JSON")


def strict_json(line: str) -> object:
    """A line as RFC 8259 reads it: NaN and Infinity are no JSON (Python's json module takes them)."""
    return json.loads(line, parse_constant=no_constant)


@given(lines=st.lists(METRICS_LINE.map(json.dumps) | JSON.map(json.dumps) | st.text(max_size=20), max_size=10))
@examples(60)
def test_metrics_lines_are_read_one_by_one(lines, tmp_path_factory):
    """Each line that is a metrics record is read, in order; any other (not JSON, not an object, another kind,
    a mistyped figure) is skipped."""
    path = tmp_path_factory.mktemp("metrics") / "metrics.jsonl"
    path.write_text("\n".join(line.replace("\n", " ") for line in lines) + "\n")
    wanted = []
    for line in lines:
        try:
            value = strict_json(line.replace("\n", " "))
        except ValueError:
            continue
        if a_metrics_record(value):
            wanted.append((value["kind"], value.get("step"), value.get("loss")))
    got = [(r.kind, r.step, r.loss) for r in read_metrics(path)]
    assert got == wanted
