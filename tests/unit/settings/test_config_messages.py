"""Each ConfigError of the config loader whole: the flag or file a value came from, the value, what was
expected. The oracle is the message the README's rule asks for (one line naming the bad value and where it
came from), written out here; the commands' tests check the exit code and the one line, not the words."""

import logging
import math
import os

import pytest
import yaml

from hpc.core.errors import ConfigError, UsageError
from hpc.settings import config
from hpc.settings.config import (
    INT64_MAX,
    MAX_CONFIG_BYTES,
    Layers,
    build_section,
    load_cluster,
    load_run_config,
    packaged_profiles,
    read_yaml,
    resolve_profile_path,
    set_source,
)
from hpc.settings.schema import SECTIONS


def error_of(call, *args, **kwargs) -> str:
    with pytest.raises((ConfigError, UsageError)) as info:
        call(*args, **kwargs)
    return str(info.value)


RUN = "data, model, train, profiler"  # the run sections, in RunConfig's order


@pytest.mark.parametrize("section, raw, message", [
    ("train", {"epochs": "3"}, "--set x: train.epochs = '3': expected an integer"),  # strict: no "3" for 3
    ("train", {"nesterov": 1}, "--set x: train.nesterov = 1: expected a boolean (true/false)"),  # no 1 for true
    ("train", {"lr": [1, 2]}, "--set x: train.lr = [1, 2]: expected a number"),
    ("train", {"momentum": [1, 2]}, "--set x: train.momentum = [1, 2]: expected a number"),
    ("train", {"lr": math.inf}, "--set x: train.lr = inf: expected a finite number"),
    ("train", {"seed": INT64_MAX + 1}, f"--set x: train.seed = {INT64_MAX + 1}: expected an integer within +-{INT64_MAX}"),
    ("train", {"seed": -INT64_MAX - 1}, f"--set x: train.seed = {-INT64_MAX - 1}: expected an integer within +-{INT64_MAX}"),
    ("model", {"arch": "res\0net"}, "--set x: model.arch = 'res\\x00net': expected a string without NUL characters"),
    ("train", {"epochs": "3\udcff"}, "--set x: train.epochs = '3\\udcff': expected an integer of valid UTF-8 text"),
    ("sweep", {"batch_sizes": ["a"]}, "--set x: sweep.batch_sizes = ['a']: expected a list of int"),
    ("command", {"env": "x"}, "--set x: command.env = 'x': expected a mapping of names to scalar values"),
    ("data", {"root": 3}, "--set x: data.root = 3: expected a string"),  # a string or none: none unsaid
    ("data", {"fraction": "1/2" + " " * 61}, f"--set x: data.fraction = {'1/2' + ' ' * 61!r}: expected a number"),
])
def test_a_value_of_the_wrong_type_is_named_with_what_was_expected(section, raw, message):
    assert error_of(build_section, section, raw, dict.fromkeys(raw, "--set x")) == message


@pytest.mark.parametrize("section, raw, typed", [
    ("train", {"epochs": INT64_MAX}, INT64_MAX),
    ("data", {"fraction": "1/2" + " " * 60}, 0.5),  # 63 characters: read as a fraction
    ("train", {"lr": 1}, 1.0),  # an integer is a number
])
def test_values_at_the_edges_are_taken(section, raw, typed):
    key = next(iter(raw))
    assert getattr(build_section(section, raw, {}), key) == typed


def test_every_annotation_of_the_schema_has_words():
    """The error's "expected ..." is worded for every field's type: no class name or repr leaks."""
    import typing

    for cls in SECTIONS.values():
        for key, tp in typing.get_type_hints(cls).items():
            words = config._expected(tp)
            assert words and "<" not in words and "typing" not in words, (cls.__name__, key, words)


def test_a_check_across_two_keys_names_both_with_their_sources():
    assert error_of(build_section, "cluster", {"time_limit_min": 1}, {"time_limit_min": "--set t"}) == (
        "defaults: cluster.signal_delay_s = 120: must be shorter than the time limit (1 min) "
        "(cluster.time_limit_min from --set t)")  # the value at fault left at its default
    assert error_of(build_section, "cluster", {"signal_delay_s": 99999}, {"signal_delay_s": "--set s"}) == (
        "--set s: cluster.signal_delay_s = 99999: must be shorter than the time limit (30 min) "
        "(cluster.time_limit_min from defaults)")
    assert error_of(build_section, "train", {"schedule": "x"}, {}) == (
        "defaults: train.schedule = 'x': must be one of cosine, multistep, constant")  # one key: nothing more


def test_a_file_that_cannot_be_read_is_named_with_the_flag_that_gave_it(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    assert error_of(read_yaml, loop).startswith(f"config file '{loop}': not a usable path (")
    assert error_of(read_yaml, loop, "--config").startswith(f"--config '{loop}': not a usable path (")
    # a regular file the kernel will not read (EIO): the system's words, not Python's repr of the error
    assert error_of(read_yaml, "/proc/self/mem") == "/proc/self/mem: cannot read config file (Input/output error)"
    assert error_of(load_run_config, str(tmp_path)) == f"--config {tmp_path}: is a directory, not a config file"


def test_a_file_of_the_size_bound_is_read_and_one_byte_more_is_not(tmp_path):
    at = tmp_path / "at.yaml"
    at.write_bytes(b"#" * MAX_CONFIG_BYTES)  # a comment: an empty config
    assert read_yaml(at) == {}
    over = tmp_path / "over.yaml"
    over.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    assert error_of(read_yaml, over) == f"{over}: more than 1 MiB: not a config file"


def test_text_that_is_not_yaml_or_no_value_is_one_line(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1\n")
    assert error_of(read_yaml, bad).startswith(f"{bad}: not valid YAML at line 3: ")
    control = tmp_path / "control.yaml"
    control.write_text("train: \x07\n")  # PyYAML's reader refuses it before any mark exists
    assert error_of(read_yaml, control).startswith(f"{control}: not valid YAML: unacceptable character #x0007")
    huge = tmp_path / "huge.yaml"
    huge.write_text(f"train:\n  seed: {'9' * 5000}\n")  # Python refuses an integer of over 4300 digits
    try:
        int("9" * 5000)
    except ValueError as e:  # the oracle: Python's own words, on one line and cut to 120 characters
        python_says = " ".join(str(e).split())[:120]
    assert error_of(read_yaml, huge) == f"{huge}: not a usable value ({python_says})"

    def too_deep(text):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(config, "load_yaml_text", too_deep)  # whatever recursion the parser's bound misses
    assert error_of(read_yaml, bad) == f"{bad}: nested too deeply to be a config file"


def test_a_section_or_key_out_of_place_names_the_sections_there_are(tmp_path):
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text("cluster:\n  name: x\n")
    assert error_of(load_run_config, str(cluster_file)) == (
        f"{cluster_file}: section 'cluster' is not used here (expected {RUN})")
    assert error_of(load_run_config, None, [("cluster.name", "x", "--set cluster.name=x")]) == (
        f"--set cluster.name=x: section 'cluster' is not used here (this command reads {RUN})")
    assert error_of(load_run_config, None, [("cluster.a.b", 1, "--set c")]) == (
        f"--set c: section 'cluster' is not used here (this command reads {RUN})")  # the first word is the section
    assert error_of(load_run_config, None, [("train.nosuch", 1, "--set train.nosuch=1")]).startswith(
        "--set train.nosuch=1: unknown key train.nosuch")
    sections = ", ".join(SECTIONS)
    for dotted in ("train", "train.", "nosuch.x"):
        assert error_of(Layers().set, dotted, 1, "--set s") == f"--set s: {dotted!r} is not SECTION.KEY (sections: {sections})"
    layers = Layers().set("train.a.b", 1, "--set s")  # the key is all after the first dot: unknown when built
    assert error_of(layers.build, "train").startswith("--set s: unknown key train.a.b")


def test_a_set_value_is_named_by_its_text_cut_past_100_characters():
    assert set_source("k=" + "v" * 98) == "--set k=" + "v" * 98
    assert set_source("k=" + "v" * 99) == "--set k=" + "v" * 95 + "..."


def test_a_profile_is_a_packaged_name_or_a_path(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    assert resolve_profile_path("mine.yml") == resolve_profile_path("./mine.yml").__class__("mine.yml")
    assert str(resolve_profile_path("mine.yaml")) == "mine.yaml"
    assert str(resolve_profile_path(f"sub{os.sep}mine")) == f"sub{os.sep}mine"
    shipped = sorted(p.stem for p in config.PROFILES_DIR.glob("*.yaml")
                     if "cluster" in (yaml.safe_load(p.read_text()) or {}))
    assert error_of(resolve_profile_path, "nosuch") == (
        f"--profile 'nosuch': no packaged profile of that name ({', '.join(shipped)}); "
        "a file of yours is given as a path, e.g. --profile ./nosuch.yaml")
    (tmp_path / "perlmutter.yaml").write_text("cluster: {}\n")  # planted where the user submits from
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        assert resolve_profile_path("perlmutter") == config.PROFILES_DIR / "perlmutter.yaml"
    assert [r.getMessage() for r in caplog.records] == [
        f"hpc: ./perlmutter.yaml is not read: --profile perlmutter is the packaged profile "
        f"({config.PROFILES_DIR / 'perlmutter.yaml'}); to use the file, give it as a path: --profile ./perlmutter.yaml"]
    (tmp_path / "local").symlink_to(tmp_path / "local")  # a loop of links: the system will not look
    assert error_of(resolve_profile_path, "local", "--profile").startswith("--profile 'local': not a usable path (")


def test_the_packaged_profiles_are_the_files_with_a_cluster_section(tmp_path, monkeypatch):
    (tmp_path / "a.yaml").write_text("cluster:\n  name: a\n")  # on the first line
    (tmp_path / "b.yaml").write_text("# mine\ncluster:\n  name: b\n")
    (tmp_path / "c.yaml").write_text("train:\n  lr: 0.1\n")
    (tmp_path / "d.yaml").write_text("train:\n  cluster: 1\n")  # a key of that name in another section
    monkeypatch.setattr(config, "PROFILES_DIR", tmp_path)
    assert packaged_profiles() == ["a", "b"]
    assert load_cluster("a").name == "a"


def test_the_default_sources_are_named_as_the_user_gave_them(tmp_path):
    from hpc.settings.config import parse_override

    assert error_of(parse_override, "train.lr") == "--set 'train.lr': expected SECTION.KEY=VALUE"
    assert parse_override(" train.lr =0.5") == ("train.lr", 0.5)
    assert error_of(Layers().add_file, tmp_path) == f"{tmp_path}: is a directory, not a config file"


def test_a_profile_holds_the_cluster_alone_and_its_errors_name_the_flag(tmp_path):
    mixed = tmp_path / "mine.yaml"
    mixed.write_text("cluster:\n  name: mine\ntrain:\n  lr: 0.1\n")
    assert error_of(load_cluster, str(mixed)) == f"{mixed}: section 'train' is not used here (expected cluster)"
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    assert error_of(load_cluster, str(folder)) == f"--profile {folder}: is a directory, not a config file"
    assert error_of(load_cluster, "local", [("cluster.nosuch", 1, "--set cluster.nosuch=1")]).startswith(
        "--set cluster.nosuch=1: unknown key cluster.nosuch")


def test_a_job_shape_is_checked_against_the_profile_in_words():
    import dataclasses

    from hpc.settings.config import check_request

    pm = load_cluster("perlmutter")
    assert pm.gpus_per_node == 4
    assert error_of(check_request, pm, 0, 1, None) == "command line: --nodes 0: must be >= 1"
    way = "--gpus counts GPUs per node here (as --gpus-per-node)"
    assert error_of(check_request, pm, 1, 8, None) == (
        f"command line: --gpus 8: profile 'perlmutter' has 4 GPUs per node; {way}; "
        "more GPUs: --nodes 2 --gpus-per-node 4")
    assert error_of(check_request, pm, 2, 8, None) == (  # sbatch's --gpus: the job's, spread over its nodes
        f"command line: --gpus 8: profile 'perlmutter' has 4 GPUs per node; {way}; "
        "8 GPUs over 2 nodes, as sbatch's --gpus counts them, is --gpus-per-node 4")
    assert error_of(check_request, pm, 2, 10, None).endswith("more GPUs: --nodes 3 --gpus-per-node 4")  # uneven
    assert error_of(check_request, pm, 2, 12, None).endswith("more GPUs: --nodes 3 --gpus-per-node 4")  # 6 a node
    quick = dataclasses.replace(pm, signal_delay_s=0)
    check_request(quick, 1, 1, 1)  # one minute is a time limit
    assert error_of(check_request, quick, 1, 1, 0) == "command line: --time 0: must be >= 1 minute"
