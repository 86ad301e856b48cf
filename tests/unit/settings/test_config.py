"""Config sections, precedence and one-line errors (exit 2) for every kind of bad input."""

from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_module

from hpc.core.errors import ConfigError
from hpc.settings.config import (
    Layers,
    check_request,
    load_cluster,
    load_run_config,
    resolve_profile_path,
)

PROFILES = Path(__file__).resolve().parents[3] / "profiles"


def test_shipped_profiles_load():
    pm = load_cluster("perlmutter")
    assert (pm.gpus_per_node, pm.constraint, pm.qos, pm.cpus_per_task, pm.account) == (4, "gpu", "regular", 32, None)
    assert any("module load pytorch" in line for line in pm.setup)
    assert "NCCL_NET_GDR_LEVEL" in pm.multinode_env and pm.multinode_env["NCCL_NET"] == "AWS Libfabric"
    assert (pm.account_suffix, pm.shared_qos, pm.gpu_order, pm.cpu_bind) == ("_g", "shared", (3, 2, 1, 0), "cores")
    assert load_cluster("local").scheduler == "local"
    smoke = load_run_config(str(PROFILES / "smoke.yaml"))
    assert smoke.model.arch == "tiny" and smoke.data.source == "synthetic"
    sweep = Layers().add_file(PROFILES / "study.yaml").build("sweep")
    assert sweep.data_fractions == (1.0, 0.5, 0.1)
    assert sweep.batch_sizes == (128, 512, 1024, 2048) and sweep.gpus == (1, 2, 4)


def test_precedence_cli_over_yaml_over_defaults():
    cfg = load_run_config(str(PROFILES / "smoke.yaml"), [("train.batch_size", 7, "--batch-size")])
    assert cfg.train.batch_size == 7  # command line
    assert cfg.model.arch == "tiny"  # YAML
    assert cfg.train.momentum == 0.9  # default


def test_fraction_strings():
    cfg = load_run_config(None, [("data.fraction", "1/10", "--data-fraction")])
    assert cfg.data.fraction == pytest.approx(0.1)


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,needles", [
    ("train:\n  batchsize: 3\n", ["unknown key train.batchsize"]),
    ("train:\n  batch_size: -3\n", ["train.batch_size = -3", "must be > 0"]),
    ("train:\n  batch_size: many\n", ["train.batch_size = 'many'", "expected an integer"]),
    ("train:\n  batch_size: true\n", ["train.batch_size = True", "expected an integer"]),
    ("model:\n  arch: resnet9\n", ["model.arch = 'resnet9'", "unknown arch"]),
    ("data:\n  fraction: 1.5\n", ["data.fraction = 1.5"]),
    ("data:\n  fraction: 1/0\n", ["data.fraction = '1/0'", "expected a number"]),
    ("optimizer:\n  lr: 1\n", ["unknown section 'optimizer'"]),
    ("train: [1, 2]\n", ["section 'train' must be a mapping"]),
    ("train:\n  lr: [oops\n", ["not valid YAML"]),
    ("- just\n- a list\n", ["expected a mapping of sections"]),
    ("profiler:\n  active: 0\n", ["profiler.active = 0"]),
])
def test_bad_config_file_is_one_line_exit_2(tmp_path, text, needles):
    path = write(tmp_path, text)
    proc = run_module("hpc.config", "--config", path)
    assert_one_line_error(proc, path, *needles)


def test_missing_file_and_bad_override(tmp_path):
    assert_one_line_error(run_module("hpc.config", "--config", str(tmp_path / "nope.yaml")), "nope.yaml",
                          "cannot read")
    assert_one_line_error(run_module("hpc.config", "--set", "train.epochs=0"), "--set train.epochs=0",
                          "train.epochs = 0")
    assert_one_line_error(run_module("hpc.config", "--set", "nosection=1"), "'nosection'")


def test_bad_cluster_profile(tmp_path):
    path = write(tmp_path, "cluster:\n  scheduler: pbs\n")
    assert_one_line_error(run_module("hpc.config", "--profile", path), path, "cluster.scheduler = 'pbs'")
    path = write(tmp_path, "cluster:\n  time_limit_min: 100\n  max_time_limit_min: 50\n", "c2.yaml")
    assert_one_line_error(run_module("hpc.config", "--profile", path), "cluster.time_limit_min = 100")
    path = write(tmp_path, "cluster:\n  env: {BAD-NAME: 1}\n", "c3.yaml")
    assert_one_line_error(run_module("hpc.config", "--profile", path), "cluster.env")


def test_bad_sweep(tmp_path):
    path = write(tmp_path, "sweep:\n  batch_sizes: [128, -1]\n")
    assert_one_line_error(run_module("hpc.config", "--sweep", path), path, "sweep.batch_sizes")
    path = write(tmp_path, "sweep:\n  gpus: []\n", "s2.yaml")
    assert_one_line_error(run_module("hpc.config", "--sweep", path), "sweep.gpus = []", "must not be empty")


def test_request_checked_against_profile():
    pm = load_cluster("perlmutter")
    check_request(pm, 2, 4, 120)
    with pytest.raises(ConfigError, match=r"--gpus 5: profile 'perlmutter' has 4 GPUs per node"):
        check_request(pm, 1, 5, None)
    with pytest.raises(ConfigError, match=r"--nodes 0"):
        check_request(pm, 0, 4, None)
    with pytest.raises(ConfigError, match=r"--time 3000: profile 'perlmutter' allows at most 2880"):
        check_request(pm, 1, 4, 3000)


def test_profile_name_resolution():
    assert resolve_profile_path("perlmutter") == PROFILES / "perlmutter.yaml"
    assert resolve_profile_path("x/y.yaml").name == "y.yaml"


def test_each_limit_of_a_job_shape_just_under_and_just_over():
    """The profile's limits, read here from its YAML (not from the code's ClusterConfig), each at the edge."""
    import yaml

    raw = yaml.safe_load((PROFILES / "perlmutter.yaml").read_text())["cluster"]
    pm = load_cluster("perlmutter")
    most, per_node, longest, warning = raw["max_nodes"], raw["gpus_per_node"], raw["max_time_limit_min"], \
        raw["signal_delay_s"]
    shortest = warning // 60 + 1  # the first whole minute longer than the warning before the limit
    for ok in ((most, per_node, longest), (1, 1, shortest), (1, per_node, None)):
        check_request(pm, *ok)
    refused = {
        (most + 1, 1, None): f"--nodes {most + 1}: profile 'perlmutter' allows at most {most}",
        (0, 1, None): "--nodes 0: must be >= 1",
        (1, 0, None): "--gpus 0: must be >= 1",
        (1, per_node + 1, None): f"--gpus {per_node + 1}: profile 'perlmutter' has {per_node} GPUs per node",
        (1, 1, 0): "--time 0: must be >= 1 minute",
        (1, 1, longest + 1): f"--time {longest + 1}: profile 'perlmutter' allows at most {longest} min",
        (1, 1, shortest - 1): f"--time {shortest - 1}: must exceed the {warning} s warning signal",
    }
    for shape, words in refused.items():
        with pytest.raises(ConfigError) as info:
            check_request(pm, *shape, source="here")
        assert str(info.value).startswith(f"here: {words}"), (shape, str(info.value))


@pytest.mark.parametrize("nodes, gpus, way", [
    (2, 8, "8 GPUs over 2 nodes, as sbatch's --gpus counts them, is --gpus-per-node 4"),
    (2, 12, "more GPUs: --nodes 3 --gpus-per-node 4"),  # 6 a node: more than a node has
    (4, 6, "more GPUs: --nodes 2 --gpus-per-node 4"),  # 6 over 4 nodes: not whole
    (1, 8, "more GPUs: --nodes 2 --gpus-per-node 4"),  # one node: no per-job reading
])
def test_too_many_gpus_a_node_names_the_way(nodes, gpus, way):
    with pytest.raises(ConfigError) as info:
        check_request(load_cluster("perlmutter"), nodes, gpus, None)
    said = str(info.value)
    assert said.endswith("; " + way) and "--gpus counts GPUs per node here (as --gpus-per-node)" in said, said


@pytest.mark.parametrize("text, parsed", [
    ("train.lr=0.1", ("train.lr", 0.1)),
    (" train.epochs = 3", ("train.epochs", 3)),  # YAML reads the value, blanks around the key go
    ("train.cuda_graph=true", ("train.cuda_graph", True)),
    ("data.name=", ("data.name", "")),  # nothing after = is the empty string, not YAML's null
    ("data.name=  ", ("data.name", "")),
    ("train.milestones=[3, 6]", ("train.milestones", [3, 6])),
    ("data.name=a: b: c", ("data.name", "a: b: c")),  # not YAML: kept as written
    ("model.arch=x=y", ("model.arch", "x=y")),  # the first = splits
])
def test_a_set_is_a_key_and_a_yaml_value(text, parsed):
    from hpc.settings.config import parse_override

    assert parse_override(text) == parsed


def test_a_set_without_a_value_names_itself_and_its_flag():
    from hpc.settings.config import parse_override, set_source

    with pytest.raises(ConfigError) as info:
        parse_override("train.lr", source="--sbatch-like")
    assert str(info.value) == "--sbatch-like 'train.lr': expected SECTION.KEY=VALUE"
    assert set_source("train.lr=1") == "--set train.lr=1"
    long = "train.lr=" + "1" * 200
    assert set_source(long) == "--set " + long[:97] + "..." and len(set_source(long)) == len("--set ") + 100
    assert set_source(long[:100]) == "--set " + long[:100]  # 100 characters are shown whole


def test_a_saved_config_is_rebuilt_from_its_run_sections_alone():
    from hpc.settings.config import run_config_from_dict

    cfg = run_config_from_dict({"train": {"lr": 0.5, "epochs": 2}, "cluster": {"max_nodes": "not read"},
                                "data": None, "model": {"arch": "resnet18"}}, "config.yaml")
    default = load_run_config(None)
    assert (cfg.train.lr, cfg.train.epochs, cfg.model.arch) == (0.5, 2, "resnet18")
    assert cfg.data == default.data  # an empty section: its defaults
    with pytest.raises(ConfigError, match=r"^config.yaml.*train\.lr"):
        run_config_from_dict({"train": {"lr": "fast"}}, "config.yaml")


def test_the_packaged_profiles_are_the_files_with_a_cluster_section():
    import yaml

    from hpc.settings.config import packaged_profiles

    found = sorted(p.stem for p in PROFILES.glob("*.yaml") if "cluster" in (yaml.safe_load(p.read_text()) or {}))
    assert packaged_profiles() == found and "perlmutter" in found and "local" in found


def test_a_config_files_faults_are_one_line_naming_the_file_and_its_flag(tmp_path):
    """read_yaml in-process (test_bad_input.py runs the commands): each fault named after `--flag path`."""
    import os

    from hpc.settings.config import MAX_CONFIG_BYTES, read_yaml
    from hpc.settings.schema import SECTIONS

    def said(path, flag="--config"):
        with pytest.raises(ConfigError) as info:
            read_yaml(path, flag)
        return str(info.value)

    where = f"--config {tmp_path}"
    assert said(tmp_path) == f"{where}: is a directory, not a config file"
    assert said(tmp_path, "") == f"{tmp_path}: is a directory, not a config file"  # no flag: the path alone
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert said(fifo) == f"--config {fifo}: not a regular file (a device or a pipe), not a config file"
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * MAX_CONFIG_BYTES)
    assert read_yaml(big) == {}  # at the bound: read (a comment)
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    assert said(big) == f"--config {big}: more than {MAX_CONFIG_BYTES // 2**20} MiB: not a config file"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"train:\n  name: caf\xe9\n")
    assert said(latin) == f"--config {latin}: not a text (UTF-8) file: byte 18 is b'\\xe9'"
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  lr: [1, 2\n")
    assert said(broken).startswith(f"--config {broken}: not valid YAML at line 3: ")
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 5000 + "]" * 5000 + "\n")
    assert said(deep) == f"--config {deep}: not valid YAML at line 1: nested more than 100 levels deep"
    digits = tmp_path / "digits.yaml"
    digits.write_text("train:\n  epochs: " + "9" * 5000 + "\n")
    assert said(digits).startswith(f"--config {digits}: not a usable value (")
    listed = tmp_path / "list.yaml"
    listed.write_text("- train\n")
    assert said(listed) == f"{listed}: expected a mapping of sections ({', '.join(SECTIONS)}), got list"
    typo = tmp_path / "typo.yaml"
    typo.write_text("trian: {}\n")
    assert said(typo) == f"{typo}: unknown section 'trian'; did you mean train?"
    odd = tmp_path / "odd.yaml"
    odd.write_text("zzz: {}\n")
    assert said(odd) == f"{odd}: unknown section 'zzz' (known: {', '.join(SECTIONS)})"
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("train: 3\n")
    assert said(scalar) == f"{scalar}: section 'train' must be a mapping, got 3"
    empty = tmp_path / "empty.yaml"
    empty.write_text("train:\n")
    assert read_yaml(empty) == {"train": {}}  # an empty section: its defaults
    unreadable = tmp_path / "missing.yaml"
    assert said(unreadable).startswith(f"--config {unreadable}: ")


@pytest.mark.parametrize("name, raw, sources, said", [
    ("train", {"lr": "fast"}, {"lr": "--set train.lr=fast"}, "--set train.lr=fast: train.lr = 'fast': expected a number"),
    ("train", {"epochs": 2.5}, {"epochs": "x.yaml"}, "x.yaml: train.epochs = 2.5: expected an integer"),
    ("train", {"lr": -1.0}, {"lr": "--lr"}, "--lr: train.lr = -1.0: must be > 0"),
    ("train", {"bach_size": 3}, {"bach_size": "--set train.bach_size=3"},
     "--set train.bach_size=3: unknown key train.bach_size; did you mean batch_size?"),
    ("train", {"zzz": 3}, {}, "defaults: unknown key train.zzz; python -m hpc.config [--profile P] prints every key"),
    ("sweep", {"gpus": [1, "x"]}, {"gpus": "s.yaml"}, "s.yaml: sweep.gpus = [1, 'x']: expected a list of int"),
    ("cluster", {"env": {"A": [1]}}, {"env": "p.yaml"},
     "p.yaml: cluster.env = {'A': [1]}: expected a mapping of names to scalar values"),
    ("data", {"fraction": "2/0"}, {"fraction": "--fraction"}, "--fraction: data.fraction = '2/0': expected a number"),
    ("train", {"cuda_graph": "maybe"}, {"cuda_graph": "c.yaml"},
     "c.yaml: train.cuda_graph = 'maybe': must be one of auto, true, false"),
    ("train", {"cuda_graph": 3}, {"cuda_graph": "c.yaml"},
     "c.yaml: train.cuda_graph = 3: expected a boolean (true/false) or a string"),
])
def test_a_bad_value_is_one_line_naming_where_it_came_from_and_what_was_expected(name, raw, sources, said):
    """build_section's words, whole: where the value came from, the key, the value as given, what it needed."""
    from hpc.settings.config import build_section

    with pytest.raises(ConfigError) as info:
        build_section(name, raw, sources)
    assert str(info.value) == said


def test_values_are_read_as_a_person_writes_them():
    from hpc.settings.config import build_section

    env = build_section("cluster", {"env": {"A": True, "B": 2, "C": 1.5, "D": "x"}}, {}).env
    assert env == {"A": "true", "B": "2", "C": "1.5", "D": "x"}  # a shell's words: true, not True
    assert build_section("data", {"fraction": "1/10"}, {}).fraction == 0.1  # a fraction as written
    assert build_section("sweep", {"data_fractions": ["1/2", 0.25]}, {}).data_fractions == (0.5, 0.25)
    assert build_section("train", {"lr": "0.5"}, {}).lr == 0.5
