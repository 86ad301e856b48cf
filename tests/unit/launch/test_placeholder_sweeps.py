"""The placeholder grammar fuzzed through whole sweeps (issue 90): Hypothesis draws a sweep's shape (grid or
zip, its own axes or none, a replica axis, one or two batch sizes, data fractions and GPU counts) and a
command whose words use the point's fields and the axes, with format specs, repeated and unknown fields and
braces in the values. The plan (`hpc.study run FILE --dry-run -- ...`, planned in process) must hold
exactly the points the file lists, each word filled as its grammar says, or be refused in one line.

The oracle is written from the documented rules (docs/own-script.md, "A sweep"), piece by piece, not from
the toolkit's fill: `command.args` is a `str.format` template ({{ and }} are braces; a field of no value, or
a positional one, is refused); after `--`, only `{name}` or `{name:spec}` of a point's value is filled and
every other brace stays as written. A value is `format(value, spec)`; `{fraction}` is its shortest form.
An axis, or a study axis given more than one value, that no word uses is refused; zip takes equal lengths."""

import itertools
from pathlib import Path

import commands
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc.core.errors import ConfigError, UsageError
from hpc.settings.rankcommand import words_for

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "tests" / "scripts" / "torchrun_ddp.py")
AXES = ["lr", "seed", "wd"]
STUDY = ["batch", "fraction", "gpus", "nodes", "ranks"]
SPECS = ["", ".2f", "03d", "g", ">5", "x", "+", "s"]
# Literal text: no braces, and no lower-case letters, so two pieces never join into a field's name.
LITERAL = st.text(alphabet="ABXYZ0123456789-_=/.", min_size=1, max_size=4)
OWN_BRACES = ["{{", "}}", "{}", "{unknown}"]  # balanced tokens: str.format reads them the same alone or joined
# The study's defaults where the file gives no list (docs/reference.md: sweep.batch_sizes, data_fractions).
DEFAULTS = {"batch_sizes": [128, 512, 1024, 2048], "data_fractions": [1.0, 0.5, 0.1]}
AXIS_VALUE = st.one_of(st.integers(-5, 300), st.sampled_from([0.1, 0.001, 2.5]),
                       st.text(alphabet="ab{}:!.", min_size=1, max_size=4))


@st.composite
def sweeps(draw):
    names = draw(st.lists(st.sampled_from(AXES), unique=True, max_size=2))
    axes = {n: draw(st.lists(AXIS_VALUE, min_size=1, max_size=3, unique_by=repr)) for n in names}
    sweep = {"name": "fz", "gpus": draw(st.sampled_from([[1], [1, 2]])), "nodes": [1]}
    for key, lists in (("batch_sizes", [[8], [8, 16]]), ("data_fractions", [[1], [1, 0.5]])):
        given_ = draw(st.sampled_from([None, *lists]))  # None: the study's defaults, several values
        if given_ is not None:
            sweep[key] = given_
    if axes:
        sweep["axes"] = axes
        sweep["combine"] = draw(st.sampled_from(["grid", "zip"]))
        if draw(st.booleans()):
            sweep["replicas"] = draw(st.sampled_from(names))
    fields = [*names, *STUDY]
    piece = st.one_of(
        LITERAL.map(lambda t: ("text", t)),
        st.sampled_from(OWN_BRACES).map(lambda t: ("brace", t)),
        st.tuples(st.sampled_from(fields), st.sampled_from(SPECS)).map(lambda fs: ("field", *fs)),
    )
    word = st.lists(piece, min_size=1, max_size=4)
    after = draw(st.lists(word, min_size=1, max_size=3))
    args = draw(st.lists(word, max_size=2))
    return sweep, after, args


class Shortest(float):
    """A data fraction, marked: `{fraction}` alone is its shortest form (0.5, 1), with a spec a float's."""


def rendered(value, spec):
    """A value as `{name:spec}` writes it; None where its type refuses the spec."""
    if isinstance(value, Shortest):
        value, spec = float(value), spec or "g"
    try:
        return format(value, spec)
    except (ValueError, TypeError):
        return None


def word_text(pieces):
    return "".join(p[1] if p[0] != "field" else "{" + p[1] + (":" + p[2] if p[2] else "") + "}" for p in pieces)


def filled(pieces, values, template):
    """The word at a point as the documented grammar fills it; None where the toolkit must refuse it."""
    out = []
    for kind, *rest in pieces:
        if kind == "text":
            out.append(rest[0])
        elif kind == "brace":
            if not template:
                out.append(rest[0])
            elif rest[0] in ("{{", "}}"):
                out.append(rest[0][0])
            else:
                return None  # str.format: a positional field, or one with no value
        else:
            text = rendered(values[rest[0]], rest[1])
            if text is None:
                return None
            out.append(text)
    return "".join(out)


def expected_plan(sweep, after, args):
    """Sorted (axis values, batch, fraction, gpus, words) of every point; None where the plan is refused."""
    axes = sweep.get("axes", {})
    used = " ".join(word_text(w) for w in (*after, *args))
    if any("{" + name + "}" not in used and "{" + name + ":" not in used for name in axes):
        return None
    lengths = {len(v) for v in axes.values()}
    if sweep.get("combine") == "zip" and len(lengths) > 1:
        return None
    study = {"batch_sizes": "batch", "data_fractions": "fraction"}
    if any(len(sweep.get(key, ())) > 1 and "{" + field not in used for key, field in study.items()):
        return None
    shape = {key: sweep.get(key, DEFAULTS[key] if "{" + field in used else DEFAULTS[key][:1])
             for key, field in study.items()}  # a default axis no word uses: its first value, once
    rows = (zip(*axes.values()) if sweep.get("combine") == "zip" else itertools.product(*axes.values())) if axes else [()]
    points = []
    for row, batch, fraction, gpus in itertools.product(list(rows), shape["batch_sizes"], shape["data_fractions"],
                                                        sweep["gpus"]):
        values = {**dict(zip(axes, row)), "batch": batch, "fraction": Shortest(fraction), "gpus": gpus, "nodes": 1,
                  "ranks": gpus}
        words = [filled(w, values, template=False) for w in after] + [filled(w, values, template=True) for w in args]
        if None in words:
            return None
        points.append((tuple(sorted((k, repr(v)) for k, v in dict(zip(axes, row)).items())), batch, float(fraction),
                       gpus, tuple(words)))
    return sorted(points)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=sweeps())
def test_a_sweeps_words_are_filled_as_their_grammar_says_or_refused_in_one_line(drawn, tmp_path):
    sweep, after, args = drawn
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"sweep": sweep, **({"command": {"args": [word_text(w) for w in args]}}
                                                       if args else {})}))
    expected = expected_plan(sweep, after, args)
    argv = ["--dry-run", "--sweep", str(path), "--", "python", SCRIPT, *(word_text(w) for w in after)]
    try:
        plan = commands.plan_of(tmp_path / "runs", argv)
    except (UsageError, ConfigError) as e:
        assert "\n" not in str(e) and str(e), str(e)
        assert expected is None, (str(e), sweep, [word_text(w) for w in after], [word_text(w) for w in args])
        return
    got = sorted(
        (tuple(sorted((k, repr(v)) for k, v in (p.values or {}).items())), p.batch_size, float(p.data_fraction),
         p.gpus, tuple(words_for(c, Path("/r/7"), "py")[2:]))
        for spec in plan.specs for p, c in spec.points
    )
    assert expected is not None, ("planned what must be refused", sweep, got[:2])
    assert got == expected


@pytest.mark.parametrize("after, value, words", [
    (["--tag", "{lr}"], "{seed}", ["--tag", "{seed}"]),  # a value's braces are its own: never filled again
    (["{lr}{lr}", "{lr:>4}"], "a}", ["a}a}", "  a}"]),  # a field twice in a word; a spec on a text value
])
def test_a_values_braces_stay_as_the_value_has_them(after, value, words, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"sweep": {"name": "b", "batch_sizes": [8], "gpus": [1], "data_fractions": [1],
                                              "axes": {"lr": [value]}}}))
    plan = commands.plan_of(tmp_path / "runs", ["--dry-run", "--sweep", str(path), "--", "python", SCRIPT, *after])
    assert [words_for(c, Path("/r"), "py")[2:] for s in plan.specs for _, c in s.points] == [words]


@pytest.mark.parametrize("command, after, needles", [
    (None, ["--lr", "{lr:d}"], ["{lr:d}", "Unknown format code 'd'"]),  # a float refuses an int's spec
    (["--x", "{}"], ["{lr}"], ["command.args", "'{}'"]),  # a positional field: str.format has no value for it
    (["--x", "{nope}"], ["{lr}"], ["no value for {nope}"]),
])
def test_a_refused_placeholder_is_one_line_and_exit_2_from_the_command(command, after, needles, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"sweep": {"name": "r", "gpus": [1], "axes": {"lr": [0.1, 0.2]}},
                                    **({"command": {"args": command}} if command else {})}))
    out = commands.call("hpc.study", ["run", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--",
                                      "python", SCRIPT, *after])
    commands.assert_refused(out, "hpc.study", *needles)
    assert not (tmp_path / "runs").exists()
