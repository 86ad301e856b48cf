"""The one reference (hpc/settings/reference.py): every config key explained from its field's comment, every
HPC_* variable the code reads in one table, docs/reference.md made from both, `python -m hpc.config
--explain` and `--variables`."""

import dataclasses
import re
from pathlib import Path

import pytest

from commands import assert_refused, call

REPO = Path(__file__).resolve().parents[3]


def test_every_key_of_every_section_says_what_it_means():
    from hpc.settings.reference import key_docs
    from hpc.settings.schema import SECTIONS

    docs = {d.key: d for d in key_docs()}
    keys = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert set(docs) == keys
    assert not [k for k, d in docs.items() if len(d.meaning) < 8], [k for k, d in docs.items() if len(d.meaning) < 8]


@dataclasses.dataclass
class Documented:
    # two lines above
    # of comment
    first: int = 1
    second: str = "x#y"  # at its end, after a string holding a hash
    third: bool = False

    # above, after a blank line
    fourth: float = 0.5  # and at its end
    # a comment of nothing (the class ends)


def test_a_fields_comment_is_the_lines_above_it_and_the_one_at_its_end():
    from hpc.settings.reference import field_comments

    assert field_comments(Documented) == {
        "first": "two lines above of comment",
        "second": "at its end, after a string holding a hash",
        "third": "",
        "fourth": "above, after a blank line and at its end",
    }


def test_a_keys_type_default_and_flags_are_told():
    from hpc.launch.configcli import all_key_docs

    docs = {d.key: d for d in all_key_docs()}
    assert (docs["train.lr"].type, docs["train.lr"].default, docs["train.lr"].flags) == ("float or none", "none",
                                                                                       ("--lr",))
    assert (docs["train.batch_size"].type, docs["train.batch_size"].default) == ("int", "128")
    assert docs["sweep.batch_sizes"].default == "[128, 512, 1024, 2048]"
    assert docs["profiler.enabled"].flags == ("--no-profile",) and docs["profiler.enabled"].default == "true"
    assert docs["cluster.time_limit_min"].flags == ("-t/--time",) and docs["cluster.qos"].flags == ("-q/--qos",)


def test_explain_answers_a_key_a_section_or_all():
    one = call("hpc.config", ["--explain", "train.lr"], None)
    assert one.code == 0 and one.stdout.splitlines()[0].startswith("train.lr: float or none (default none)")
    assert "lr_per_256" in one.stdout and len(one.stdout.splitlines()) == 2
    section = call("hpc.config", ["--explain", "profiler"], None)
    assert section.code == 0 and all(line.startswith(("profiler.", "    ")) for line in section.stdout.splitlines())
    every = call("hpc.config", ["--explain"], None)
    assert every.stdout.count("\n    ") == len(__import__("hpc.settings.reference", fromlist=["x"]).key_docs())
    assert_refused(call("hpc.config", ["--explain", "trian.lr"], None), "hpc.config", "trian.lr",
                   "did you mean train.lr")


# HPC_ followed by a name, in code, scripts and profiles; a name ending in _ is a prefix in prose, not a variable
VARIABLE = re.compile(r"\bHPC_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_variable_the_code_reads_is_in_the_table_and_nothing_else():
    from hpc.settings.reference import VARIABLES

    sources = [*REPO.glob("hpc/**/*.py"), *REPO.glob("analysis/**/*.py"), *REPO.glob("jobs/*"),
               *REPO.glob("profiles/*.yaml")]
    named = {m for path in sources for m in VARIABLE.findall(path.read_text())}
    assert named == set(VARIABLES), (named - set(VARIABLES), set(VARIABLES) - named)
    assert all(v.meaning and v.set_by in ("you", "the toolkit") for v in VARIABLES.values())


def test_the_variables_command_lists_each_once():
    from hpc.settings.reference import VARIABLES

    out = call("hpc.config", ["--variables"], None)
    assert out.code == 0 and [line.split()[0] for line in out.stdout.splitlines()] == list(VARIABLES)


def test_docs_reference_is_made_from_the_code():
    out = call("hpc.config", ["--reference"], None)
    assert out.code == 0
    assert (REPO / "docs" / "reference.md").read_text() == out.stdout, (
        "docs/reference.md is stale: python -m hpc.config --reference > docs/reference.md")


@pytest.mark.parametrize("word", ["train.lr=0.1", "+model.arch=tiny", "data.root=/x/y"])
def test_a_hydra_override_gets_the_way_to_say_it(word, tmp_path):
    out = call("hpc.train", ["--run-dir", str(tmp_path / "r"), word], None)
    assert_refused(out, "hpc.train", f"did you mean --set {word.lstrip('+')}")
