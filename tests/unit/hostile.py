"""Hostile files for the bad-input battery, written once per session: configs, profiles, sweeps, data
roots, checkpoints, run directories, traces, sweep indexes. Each is wrong in exactly one way."""

import gzip
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from hpc.training import data
from hpc.training.checkpoint import state_digest

REPO = Path(__file__).resolve().parents[2]
RANDOM = bytes(range(256)) * 8  # not UTF-8, not gzip, not a pickle, not JSON


class Evil:
    """Pickles to a call of os.system: a loader that ran it would be a code execution."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/hpc-pwned",))


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def yaml_files(h: Path) -> None:
    levels = ["&a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefgh"):
        levels.append(f"&{name} [{', '.join(['*' + 'abcdefgh'[i]] * 10)}]")
    files = {
        "latin1.yaml": b"train:\n  lr: caf\xe9\n",
        "list.yaml": "- train\n- data\n",
        "sweep_dir/index.json": '{"points": []}\n',  # a sweep directory with nothing to resubmit yet
        "sweep_dir/sweep.yaml": "sweep:\n  name: s\n",
        "scalar.yaml": "42\n",
        "tag.yaml": "train: !!python/object/apply:os.system ['echo pwned']\n",
        "dup.yaml": "train:\n  lr: 0.1\n  lr: 0.2\n",
        "dupsection.yaml": "train:\n  lr: 0.1\ntrain:\n  epochs: 2\n",
        "unknown_section.yaml": "trian:\n  lr: 0.1\n",
        "section_list.yaml": "train: [1, 2]\n",
        "unknown_key.yaml": "train:\n  learning_rate: 0.1\n",
        "deep.yaml": "train: " + "[" * 3000 + "]" * 3000 + "\n",
        "cluster_in_run.yaml": "cluster:\n  gpus_per_node: 4\ntrain:\n  lr: 0.1\n",
        "run_only_profile.yaml": "train:\n  lr: 0.1\n",
        "profile_zero_gpus.yaml": "cluster:\n  name: zero\n  gpus_per_node: 0\n",
        "profile_bad_scheduler.yaml": "cluster:\n  name: odd\n  scheduler: pbs\n",
        "sweep_escape.yaml": "sweep:\n  name: ../../escape\n  batch_sizes: [8]\n  gpus: [1]\n  data_fractions: [1]\n",
        "sweep_empty_batches.yaml": "sweep:\n  batch_sizes: []\n",
        "sweep_gpus0.yaml": "sweep:\n  gpus: [0]\n",
        "sweep_frac2.yaml": "sweep:\n  data_fractions: [2]\n",
        "sweep_nodes0.yaml": "sweep:\n  nodes: 0\n",
        "sweep_name_empty.yaml": 'sweep:\n  name: ""\n',
        "sweep_name_long.yaml": "sweep:\n  name: " + "n" * 300 + "\n",
        "sweep_gpus16.yaml": "sweep:\n  name: big\n  gpus: [16]\n  batch_sizes: [8]\n  data_fractions: [1]\n",
        "sweep_nodes2000.yaml": "sweep:\n  name: big\n  gpus: [4]\n  nodes: [1, 2000]\n  batch_sizes: [8]\n  data_fractions: [1]\n",
        "sweep_batches_str.yaml": "sweep:\n  batch_sizes: [8, many]\n",
        "nul.yaml": "data:\n  root: \"a\\0b\"\n",
        "ok_fraction.yaml": "data:\n  fraction: 1/10\ntrain:\n  lr: !!float 0.2\n",
        "merge.yaml": "train:\n  <<: {lr: 0.25, epochs: 2, momentum: 0.8}\n  epochs: 3\n",
        "deep200.yaml": "train:\n  milestones: " + "[" * 200 + "]" * 200 + "\n",
        "ok_deep_list.yaml": "train:\n  milestones: [0.5, 0.75]\n  lr: 0.1\n",
        "big.yaml": "train:\n  lr: 0.1\n" + "# padding\n" * 120_000,
    }
    # an alias bomb: 10^8 strings if expanded, inside the one value it is given for
    files["bomb.yaml"] = "train:\n  batch_size: [" + ", ".join(levels) + "]\n"
    for name, content in files.items():
        write(h / name, content)
    write(h / "random.bin", RANDOM)
    write(h / "study_like.yaml", (REPO / "profiles" / "study-smoke.yaml").read_text())


def _pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def data_roots(h: Path) -> None:
    data.synthesize(h / "data", n_train=100, n_test=20, seed=0)
    good = h / "data" / data.DIRNAME
    variants = {
        "cifar_meta_types": {"meta": _pickle({"fine_label_names": 5})},
        "cifar_labels_types": {"train": _pickle({"data": np.zeros((2, 3072), np.uint8), "fine_labels": ["a", "b"]})},
        "cifar_wrong_shape": {"train": _pickle({"data": np.zeros((2, 100), np.uint8), "fine_labels": [0, 1]})},
        "cifar_labels_range": {"train": _pickle({"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 100]})},
        "cifar_random": {"train": RANDOM},
        "cifar_code": {"train": _pickle(Evil())},
        "cifar_top_list": {"test": _pickle([1, 2, 3])},
        "cifar_no_labels": {"train": _pickle({"data": np.zeros((2, 3072), np.uint8)})},
        # the real set's layout and class names (words, not class_000): what a download writes
        "real_like": {"meta": _pickle({"fine_label_names": [f"word{i}" for i in range(100)],
                                       "coarse_label_names": [f"group{i}" for i in range(20)]})},
    }
    for name, replaced in variants.items():
        base = h / name / data.DIRNAME
        for f in data.FILES:
            write(base / f, replaced.get(f, (good / f).read_bytes()))
    write(h / "data_file", "not a directory\n")
    (h / "empty_root").mkdir()


def good_run(h: Path) -> Path:
    """A real finished CPU run: its checkpoint is the base the damaged ones are made from."""
    run = h / "good_run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        env.pop(key, None)
    subprocess.run([sys.executable, "-m", "hpc.train", "--config", str(REPO / "profiles" / "smoke.yaml"),
                    "--data-root", str(h / "data"), "--run-dir", str(run), "--max-steps", "2", "--no-profile",
                    "--set", "train.eval=false"], check=True, cwd=REPO, env=env, capture_output=True)
    return run


def checkpoints(h: Path) -> None:
    good = torch.load(good_run(h) / "checkpoints" / "last.pt", weights_only=True)
    config = (h / "good_run" / "config.yaml").read_text()

    def saved(obj, checksum=True) -> bytes:
        """A checkpoint as the toolkit writes one: its checksum made over what it holds (so each case below
        is refused for what it is, not for a checksum left from the good one), or kept as it was."""
        if checksum and isinstance(obj, dict) and "sha256" in obj:
            obj = {**obj, "sha256": state_digest(obj)}
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    flipped = bytearray(saved(good))
    weights = next(v for v in good["model"].values() if v.numel() > 64).numpy().tobytes()
    flipped[bytes(flipped).index(weights) + 17] ^= 0x10  # one bit of one weight

    wrong_shape = dict(good, model={k: torch.zeros(3, 3) if v.ndim else v for k, v in good["model"].items()})
    runs = {
        "ck_empty": b"",
        "ck_random": RANDOM,
        "ck_dict_x": saved({"x": 1}),
        "ck_no_model": saved({k: v for k, v in good.items() if k != "model"}),
        "ck_wrong_shape": saved(wrong_shape),
        "ck_code": pickle.dumps(Evil()),
        "ck_list": saved([1, 2, 3]),
        "ck_negative_step": saved(dict(good, step=-4)),
        "ck_step_str": saved(dict(good, step="4")),
        "ck_rng_junk": saved(dict(good, rng={"torch": torch.zeros(3), "python": [1]})),
        "ck_flipped": bytes(flipped),
        "ck_stale_checksum": saved(dict(good, step=1), checksum=False),
        "ck_no_checksum": saved({k: v for k, v in good.items() if k != "sha256"}),
    }
    for name, content in runs.items():
        write(h / name / "checkpoints" / "last.pt", content)
    (h / "ck_isdir" / "checkpoints" / "last.pt").mkdir(parents=True)
    good_bytes = (h / "good_run" / "checkpoints" / "last.pt").read_bytes()
    for name, text in {"cfg_list": "- 1\n- 2\n", "cfg_binary": RANDOM, "cfg_tag": "train: !!python/name:os.system\n",
                       "cfg_mismatch": config.replace("batch_size: 16", "batch_size: 32")}.items():
        write(h / name / "checkpoints" / "last.pt", good_bytes)
        write(h / name / "config.yaml", text)


def traces(h: Path) -> None:
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}
    good = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        event]}
    write(h / "t_list.json", "[1, 2]")
    write(h / "t_events_obj.json", json.dumps({"traceEvents": 5}))
    write(h / "t_trunc.json", json.dumps(good)[:60])
    write(h / "t_empty.json", b"")
    write(h / "t_random.json", RANDOM)
    write(h / "t_gz_corrupt.json.gz", gzip.compress(json.dumps(good).encode())[:40])
    write(h / "t_no_events.json", json.dumps({"schemaVersion": 1}))
    write(h / "t_events_empty.json", json.dumps({"schemaVersion": 1, "traceEvents": []}))
    write(h / "t_no_objects.json", json.dumps({"schemaVersion": 1, "traceEvents": [1, "x", None]}))
    bad_events = [dict(event, ts="10"), dict(event, dur=1e999), dict(event, name=["a"]), dict(event, pid=[1]),
                  {"ph": "i", "name": "[memory]", "args": [1, 2]},
                  {"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Total Allocated": "lots"}}]
    write(h / "mixed" / "rank0.pt.trace.json", json.dumps(dict(good, traceEvents=good["traceEvents"] + bad_events)))
    # A run whose summary.json has the wrong shape, and sweeps whose index.json does.
    write(h / "run_bad_summary" / "traces" / "rank0.pt.trace.json", json.dumps(good))
    write(h / "run_bad_summary" / "summary.json", "[1, 2, 3]")
    write(h / "run_bad_ranks" / "traces" / "rank0.pt.trace.json", json.dumps(good))
    write(h / "run_bad_ranks" / "summary.json", json.dumps({"world_size": "two", "config": [1],
                                                           "ranks": [{"no_rank": 1}, 5]}))
    write(h / "run_only_junk" / "traces" / "rank0.pt.trace.json", RANDOM)
    write(h / "sweep_index_list" / "index.json", "[]")
    write(h / "sweep_index_junk" / "index.json", RANDOM)
    point = {"data_fraction": 1.0, "batch_size": 8, "gpus": 1, "run_dir": "p0"}
    write(h / "sweep_index_escape" / "index.json", json.dumps({"points": [dict(point, run_dir="../run_bad_summary")]}))
    write(h / "sweep_index_types" / "index.json", json.dumps({"points": [dict(point, batch_size="eight"),
                                                                        dict(point, gpus=True), "p1"]}))
    write(h / "sweep_ok_with_bad_point" / "index.json", json.dumps({"points": [point, dict(point, gpus=None)]}))
    write(h / "sweep_ok_with_bad_point" / "p0" / "traces" / "rank0.pt.trace.json", json.dumps(good))


def make(h: Path) -> Path:
    yaml_files(h)
    data_roots(h)
    checkpoints(h)
    traces(h)
    return h
