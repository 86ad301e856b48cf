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
