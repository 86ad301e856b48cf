"""The bad-input battery: every command, every file type, hostile values. Each case asserts exit code
2, exactly one line on stderr, no traceback, the bad value and where it came from named in that
line, and nothing left behind: no new file under the working directory, no hostile file changed (a
damaged checkpoint is never overwritten). All in-process, through the same `hpc.cli.run` path the
commands' `__main__` uses; `test_main_entry_points_*` checks that path once per command as a process.

{H} in a case is the directory of hostile files (tests/unit/hostile.py), {T} the case's own fresh
working directory."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import commands
import hostile
from commands import DIST_KEYS, assert_refused, tree

CONFIG = ("hpc.config",)
SMOKE = str(hostile.REPO / "profiles" / "smoke.yaml")
TRAIN = ("hpc.train", "--config", SMOKE, "--data-root", "{H}/data", "--run-dir", "{T}/run", "--no-profile")
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
         "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_TASKS_PER_NODE": "1(x2)"}
DRY = ("hpc.submit", "--dry-run", "--account", "m1_g", "--config", SMOKE)


def resume(run: str, *needles: str):
    """hpc.train on a hostile run directory; the checkpoint or config.yaml there must stay as it is."""
    return (("hpc.train", "--config", SMOKE, "--data-root", "{H}/data", "--run-dir", "{H}/" + run, "--no-profile",
             "--max-steps", "4", "--set", "train.eval=false"), None, (f"{run}",) + needles)


CASES = {
    # --- config files (hpc.config, and the same reader behind every command) ---------------------
    "config: random bytes": ((*CONFIG, "--config", "{H}/random.bin"), None, ("random.bin", "not a text (UTF-8) file")),
    "config: invalid UTF-8": ((*CONFIG, "--config", "{H}/latin1.yaml"), None, ("latin1.yaml", "UTF-8")),
    "config: a list": ((*CONFIG, "--config", "{H}/list.yaml"), None, ("list.yaml", "got list")),
    "config: a scalar": ((*CONFIG, "--config", "{H}/scalar.yaml"), None, ("scalar.yaml", "got int")),
    "config: python tag": ((*CONFIG, "--config", "{H}/tag.yaml"), None, ("tag.yaml", "not valid YAML", "python/object")),
    "config: duplicate key": ((*CONFIG, "--config", "{H}/dup.yaml"), None, ("dup.yaml", "duplicate key 'lr'", "line 3")),
    "config: duplicate section": ((*CONFIG, "--config", "{H}/dupsection.yaml"), None, ("dupsection.yaml", "duplicate key 'train'")),
    "config: unknown section": ((*CONFIG, "--config", "{H}/unknown_section.yaml"), None, ("unknown_section.yaml", "'trian'")),
    "config: section is a list": ((*CONFIG, "--config", "{H}/section_list.yaml"), None, ("section_list.yaml", "'train' must be a mapping", "[1, 2]")),
    "config: unknown key": ((*CONFIG, "--config", "{H}/unknown_key.yaml"), None, ("unknown_key.yaml", "train.learning_rate")),
    "config: missing file": ((*CONFIG, "--config", "{T}/nope.yaml"), None, ("nope.yaml", "cannot read")),
    "config: a directory": ((*CONFIG, "--config", "{H}"), None, ("is a directory",)),
    "config: nested 3000 deep": ((*CONFIG, "--config", "{H}/deep.yaml"), None, ("deep.yaml",)),
    "config: alias bomb value": ((*CONFIG, "--config", "{H}/bomb.yaml"), None, ("bomb.yaml", "train.batch_size", "expected an integer")),
    "config: cluster section in a run config": ((*CONFIG, "--config", "{H}/cluster_in_run.yaml"), None, ("cluster_in_run.yaml", "'cluster' is not used here")),
    "config: empty data root": ((*CONFIG, "--set", "data.root="), None, ("--set data.root=", "data.root = ''", "must not be empty")),
    "config: NUL in a string": ((*CONFIG, "--config", "{H}/nul.yaml"), None, ("nul.yaml", "data.root", "NUL")),
    # --- values (--set), each key type and range --------------------------------------------------
    **{f"set {v}": ((*CONFIG, "--set", v), None, (f"--set {v}", v.split("=")[0], why)) for v, why in [
        ("train.batch_size=0", "must be > 0"), ("train.batch_size=-5", "must be > 0"),
        ("train.batch_size=abc", "expected an integer"), ("train.batch_size=1.5", "expected an integer"),
        ("train.batch_size=true", "expected an integer"),
        ("train.batch_size=99999999999999999999999", "within"), ("train.batch_size=2000000", "terabytes"),
        ("train.lr=.inf", "a finite number"), ("train.lr=-.inf", "a finite number"), ("train.lr=.nan", "a finite number"),
        ("train.lr=inf", "a number"), ("train.lr=nan", "a number"), ("train.lr=1e400", "a number"),
        ("train.lr=-0.1", "must be > 0"), ("train.lr=0", "must be > 0"), ("train.lr=[0.1]", "a number"),
        ("train.lr_per_256=0", "must be > 0"), ("train.momentum=-1", "must be >= 0"),
        ("train.weight_decay=-1e-4", "must be >= 0"), ("train.warmup_epochs=-1", "must be >= 0"),
        ("train.seed=-1", "must be >= 0"), ("train.seed=4294967296", "32-bit"),
        ("train.epochs=0", "must be > 0"), ("train.max_steps=0", "must be > 0"),
        ("train.grad_accum_steps=0", "must be > 0"), ("train.log_every_steps=0", "must be > 0"),
        ("train.checkpoint_every_steps=-1", "must be >= 0"), ("train.schedule=linear", "must be one of"),
        ("train.milestones=[0.5, 2]", "(0, 1)"), ("train.milestones=5", "a list of float"),
        ("train.amp=fp16", "must be one of"), ("train.device=tpu", "must be one of"),
        ("train.batch_scope=node", "must be one of"), ("train.collective_timeout_s=0", "must be > 0"),
        ("train.collective_timeout_s=10000000000", "a week"), ("train.cuda_memory_fraction=0", "(0, 1]"),
        ("train.cuda_memory_fraction=1.5", "(0, 1]"), ("train.ddp_bucket_cap_mb=0", "must be > 0"),
        ("train.nesterov=maybe", "a boolean"), ("train.eval=1", "a boolean"),
        ("data.fraction=0", "(0, 1]"), ("data.fraction=1.5", "(0, 1]"), ("data.fraction=1/0", "a number"),
        ("data.fraction=abc", "a number"), ("data.fraction=-1/2", "(0, 1]"), ("data.loader=disk", "must be one of"),
        ("data.num_workers=-1", "must be >= 0"), ("data.num_workers=100000", "one process each"),
        ("data.synth_train=10000000000", "3 GB"), ("data.synth_test=0", "must be > 0"),
        ("data.root=[a, b]", "a string"), ("model.arch=resnet9", "unknown arch"), ("model.num_classes=0", "must be > 0"),
        ("model.stem=imagenet", "must be one of"), ("model.channels_last=yes", "a string"),
        ("profiler.active=0", "must be > 0"), ("profiler.wait=-1", "must be >= 0"),
        ("profiler.enabled=maybe", "a boolean"), ("profiler.record_shapes=[]", "a boolean"),
    ]},
    "set: not SECTION.KEY": ((*CONFIG, "--set", "train=5"), None, ("--set train=5", "not SECTION.KEY")),
    "set: unknown section": ((*CONFIG, "--set", "nosection.x=1"), None, ("'nosection.x'", "not SECTION.KEY")),
    "set: unknown key": ((*CONFIG, "--set", "train.nokey=1"), None, ("--set train.nokey=1", "unknown key train.nokey")),
    "set: no equals sign": ((*CONFIG, "--set", "train.batch_size"), None, ("'train.batch_size'", "SECTION.KEY=VALUE")),
    "set: cluster without --profile": ((*CONFIG, "--set", "cluster.gpus_per_node=4"), None, ("--set cluster.gpus_per_node=4", "'cluster' is not used here")),
    "set: sweep without --sweep": ((*CONFIG, "--set", "sweep.name=x"), None, ("--set sweep.name=x", "'sweep' is not used here")),
    "set: huge value is cut": ((*CONFIG, "--set", "train.batch_size=" + "9" * 5000), None, ("--set train.batch_size=999", "expected an integer")),
    # --- cluster profiles and sweeps -----------------------------------------------------------------
    "profile: missing": ((*CONFIG, "--profile", "nonexistent"), None, ("--profile 'nonexistent'", "no packaged profile", "./nonexistent.yaml")),
    "profile: missing file": ((*CONFIG, "--profile", "./nonexistent.yaml"), None, ("nonexistent.yaml", "cannot read")),
    "profile: random bytes": ((*CONFIG, "--profile", "{H}/random.bin"), None, ("random.bin", "UTF-8")),
    "profile: run sections only": ((*CONFIG, "--profile", "{H}/run_only_profile.yaml"), None, ("run_only_profile.yaml", "'train' is not used here")),
    "profile: zero GPUs": ((*CONFIG, "--profile", "{H}/profile_zero_gpus.yaml"), None, ("profile_zero_gpus.yaml", "cluster.gpus_per_node = 0")),
    "profile: --set cluster value": ((*CONFIG, "--profile", "local", "--set", "cluster.max_nodes=0"), None, ("--set cluster.max_nodes=0", "must be > 0")),
    "profile: --exports without --profile": ((*CONFIG, "--exports"), None, ("--exports needs --profile",)),
    "sweep: name escapes": ((*CONFIG, "--sweep", "{H}/sweep_escape.yaml"), None, ("sweep_escape.yaml", "sweep.name", "../../escape")),
    "sweep: empty batch list": ((*CONFIG, "--sweep", "{H}/sweep_empty_batches.yaml"), None, ("sweep_empty_batches.yaml", "sweep.batch_sizes", "must not be empty")),
    "sweep: zero GPUs": ((*CONFIG, "--sweep", "{H}/sweep_gpus0.yaml"), None, ("sweep_gpus0.yaml", "sweep.gpus", "[0]")),
    "sweep: fraction 2": ((*CONFIG, "--sweep", "{H}/sweep_frac2.yaml"), None, ("sweep_frac2.yaml", "sweep.data_fractions")),
    "sweep: zero nodes": ((*CONFIG, "--sweep", "{H}/sweep_nodes0.yaml"), None, ("sweep_nodes0.yaml", "sweep.nodes")),
    "sweep: empty name": ((*CONFIG, "--sweep", "{H}/sweep_name_empty.yaml"), None, ("sweep_name_empty.yaml", "sweep.name", "''")),
    "sweep: 300-byte name": ((*CONFIG, "--sweep", "{H}/sweep_name_long.yaml"), None, ("sweep_name_long.yaml", "sweep.name", "200 bytes")),
    "sweep: a batch size that is a word": ((*CONFIG, "--sweep", "{H}/sweep_batches_str.yaml"), None, ("sweep_batches_str.yaml", "sweep.batch_sizes", "many")),
    "config: unknown flag": ((*CONFIG, "--bogus"), None, ("command line", "--bogus")),
    "config: stray argument": ((*CONFIG, "extra"), None, ("command line", "extra")),
    # --- hpc.train: flags, config sections, data, run directories, checkpoints ------------------------
    "train: --batch-size abc": ((*TRAIN, "--batch-size", "abc"), None, ("command line", "--batch-size", "'abc'")),
    "train: --batch-size 0": ((*TRAIN, "--batch-size", "0"), None, ("--batch-size", "train.batch_size = 0")),
    "train: --lr inf": ((*TRAIN, "--lr", "inf"), None, ("--lr", "'inf'", "finite")),
    "train: --lr nan": ((*TRAIN, "--lr", "nan"), None, ("--lr", "'nan'", "finite")),
    "train: --lr 1e999": ((*TRAIN, "--lr", "1e999"), None, ("--lr", "'1e999'", "finite")),
    "train: --epochs -1": ((*TRAIN, "--epochs", "-1"), None, ("--epochs", "train.epochs = -1")),
    "train: --max-steps 0": ((*TRAIN, "--max-steps", "0"), None, ("--max-steps", "train.max_steps = 0")),
    "train: --seed huge": ((*TRAIN, "--seed", "18446744073709551617"), None, ("--seed", "18446744073709551617", "within")),
    "train: --data-fraction 0": ((*TRAIN, "--data-fraction", "0"), None, ("--data-fraction", "data.fraction = '0'")),
    "train: --data-fraction abc": ((*TRAIN, "--data-fraction", "abc"), None, ("--data-fraction", "'abc'")),
    "train: --arch foo": ((*TRAIN, "--arch", "foo"), None, ("--arch", "'foo'", "unknown arch")),
    "train: --stem x": ((*TRAIN, "--stem", "x"), None, ("--stem", "model.stem = 'x'")),
    "train: --device tpu": ((*TRAIN, "--device", "tpu"), None, ("--device", "'tpu'")),
    "train: --loader disk": ((*TRAIN, "--loader", "disk"), None, ("--loader", "'disk'")),
    "train: --grad-accum-steps 0": ((*TRAIN, "--grad-accum-steps", "0"), None, ("--grad-accum-steps", "= 0")),
    "train: --batch-scope x": ((*TRAIN, "--batch-scope", "x"), None, ("--batch-scope", "'x'")),
    "train: --set cluster.*": ((*TRAIN, "--set", "cluster.gpus_per_node=4"), None, ("--set cluster.gpus_per_node=4", "'cluster' is not used here")),
    "train: --set sweep.*": ((*TRAIN, "--set", "sweep.name=x"), None, ("--set sweep.name=x", "'sweep' is not used here")),
    "train: a sweep file as --config": (("hpc.train", "--config", "{H}/study_like.yaml", "--run-dir", "{T}/run"), None, ("study_like.yaml", "'sweep' is not used here")),
    "train: --config random bytes": (("hpc.train", "--config", "{H}/random.bin", "--run-dir", "{T}/run"), None, ("random.bin", "UTF-8")),
    "train: unknown flag": ((*TRAIN, "--batchsize", "8"), None, ("command line", "--batchsize")),
    "train: batch does not divide into micro-batches": ((*TRAIN, "--batch-size", "10", "--grad-accum-steps", "3"), None, ("train.batch_size = 10", "train.grad_accum_steps = 3")),
    "train: cuda_graph on a CPU": ((*TRAIN, "--device", "cpu", "--set", "train.cuda_graph=true"), None, ("train.cuda_graph", "no CUDA device")),
    "train: --cuda-graph true on a CPU": ((*TRAIN, "--device", "cpu", "--cuda-graph", "true"), None, ("train.cuda_graph = true", "no CUDA device")),
    "train: --cuda-graph sometimes": ((*TRAIN, "--cuda-graph", "sometimes"), None, ("--cuda-graph", "'sometimes'", "auto, true, false")),
    "train: num_classes does not match the data": ((*TRAIN, "--set", "model.num_classes=10"), None, ("model.num_classes = 10", "100 classes", "data")),
    "train: synth_train below one per class": ((*TRAIN[:3], "--data-root", "{T}/new", *TRAIN[5:], "--set", "data.synth_train=50"), None, ("--set data.synth_train=50", ">= 100")),
    "train: data root cannot be written": ((*TRAIN[:3], "--data-root", "/proc/self", *TRAIN[5:]), None, ("'/proc/self'", "cannot write a synthetic set")),
    "train: data root is a file": ((*TRAIN[:3], "--data-root", "{H}/data_file", *TRAIN[5:]), None, ("data_file", "is a file")),
    "train: empty data root, no synthesis": ((*TRAIN[:3], "--data-root", "{H}/empty_root", *TRAIN[5:], "--set", "data.source=cifar100"), None, ("empty_root", "no cifar-100-python/")),
    "train: a synthetic set where CIFAR-100 is asked for": ((*TRAIN[:5], "--set", "data.source=cifar100"), None, ("holds a synthetic set", "data.source: synthetic")),
    "train: the real set where a synthetic one is asked for": ((*TRAIN[:3], "--data-root", "{H}/real_like", *TRAIN[5:]), None, ("data.source = 'synthetic'", "real_like", "holds the real CIFAR-100")),
    **{f"train: data {name}": ((*TRAIN[:3], "--data-root", "{H}/" + name, *TRAIN[5:]), None, (name, why)) for name, why in [
        ("cifar_meta_types", "fine_label_names must be a list"), ("cifar_labels_types", "not arrays of numbers"),
        ("cifar_wrong_shape", "uint8 [N, 3072]"), ("cifar_labels_range", "outside 0..99"),
        ("cifar_random", "not a readable CIFAR-100 pickle"), ("cifar_code", "refusing to load posix.system"),
        ("cifar_top_list", "top level is list"), ("cifar_no_labels", "no 'fine_labels' entry"),
    ]},
    "train: run dir is a file": ((*TRAIN[:5], "--run-dir", "{H}/data_file", "--no-profile"), None, ("--run-dir", "data_file", "is a file")),
    "train: run dir holds other things": ((*TRAIN[:5], "--run-dir", "{H}", "--no-profile"), None, ("--run-dir '{H}'", "holds other files", "not a run")),
    "train: empty checkpoint": resume("ck_empty", "not a checkpoint this toolkit can load"),
    "train: random checkpoint": resume("ck_random", "not a checkpoint this toolkit can load"),
    "train: foreign checkpoint": resume("ck_dict_x", "'model' is missing"),
    "train: checkpoint without model": resume("ck_no_model", "'model' is missing"),
    "train: checkpoint of other shapes": resume("ck_wrong_shape", "does not fit this run's model"),
    "train: checkpoint that runs code": resume("ck_code", "not a checkpoint this toolkit can load"),
    "train: checkpoint is a list": resume("ck_list", "holds a list"),
    "train: checkpoint with negative step": resume("ck_negative_step", "negative"),
    "train: checkpoint step is text": resume("ck_step_str", "'step' is str"),
    "train: checkpoint RNG is junk": resume("ck_rng_junk", "does not fit"),
    "train: checkpoint with one bit of a weight flipped": resume("ck_flipped", "damaged: its contents do not match the checksum"),
    "train: checkpoint whose checksum is another's": resume("ck_stale_checksum", "damaged: its contents do not match"),
    "train: checkpoint without a checksum": resume("ck_no_checksum", "damaged: its contents do not match"),
    "train: checkpoint is a directory": resume("ck_isdir", "not a checkpoint file"),
    "train: saved config is a list": resume("cfg_list", "config.yaml", "damaged"),
    "train: saved config is binary": resume("cfg_binary", "config.yaml", "UTF-8"),
    "train: saved config has a tag": resume("cfg_tag", "config.yaml", "not valid YAML"),
    "train: saved config differs": resume("cfg_mismatch", "train.batch_size = 32, not 16"),
    # --- the distributed environment (hpc.train and hpc.distenv read it alike) -------------------------
    **{f"env {k}": ((*TRAIN,), env, needles) for k, env, needles in [
        ("RANK without WORLD_SIZE", {"RANK": "0"}, ("RANK is set", "WORLD_SIZE")),
        ("WORLD_SIZE=abc", {"RANK": "0", "WORLD_SIZE": "abc"}, ("WORLD_SIZE='abc'", "not an integer")),
        ("WORLD_SIZE=0", {"RANK": "0", "WORLD_SIZE": "0"}, ("WORLD_SIZE=0", "1..")),
        ("RANK=5 of 2", {"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ("rank 5",)),
        ("LOCAL_WORLD_SIZE=0", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "0"}, ("LOCAL_WORLD_SIZE=0",)),
        ("LOCAL_RANK=-1", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"}, ("LOCAL_RANK=-1",)),
        ("MASTER_PORT=70000", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, ("master port 70000",)),
        ("no MASTER_ADDR", {"RANK": "0", "WORLD_SIZE": "2"}, ("MASTER_ADDR",)),
    ]},
    **{f"distenv {k}": (("hpc.distenv",), dict(SLURM, **env), needles) for k, env, needles in [
        ("huge TASKS_PER_NODE repeat", {"SLURM_TASKS_PER_NODE": "1(x99999999999)"}, ("SLURM_TASKS_PER_NODE='1(x99999999999)'", "repeat count")),
        ("TASKS_PER_NODE junk", {"SLURM_TASKS_PER_NODE": "two"}, ("SLURM_TASKS_PER_NODE='two'",)),
        ("STEP_NUM_TASKS below PROCID", {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
                                          "SLURM_STEP_NODELIST": "nid001", "SLURM_PROCID": "3"},
         ("SLURM_PROCID=3", "SLURM_STEP_NUM_TASKS=2")),
        ("NODEID out of range", {"SLURM_NODEID": "4"}, ("SLURM_NODEID=4",)),
        ("bad hostlist", {"SLURM_JOB_NODELIST": "nid[0-", "SLURM_STEP_NODELIST": "nid[0-"}, ("SLURM_STEP_NODELIST",)),
        ("NTASKS=abc", {"SLURM_NTASKS": "abc"}, ("SLURM_NTASKS='abc'",)),
        ("MASTER_PORT=abc", {"MASTER_PORT": "abc"}, ("MASTER_PORT='abc'",)),
    ]},
    # a batch shell whose MASTER_ADDR no interface of this node has (TEST-NET-1, RFC 5737): the port it picks
    # for the job's steps cannot be bound there
    "distenv: MASTER_ADDR not this node's": (("hpc.distenv",), {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "nid001",
                                                               "MASTER_ADDR": "192.0.2.1"},
                                             ("MASTER_ADDR '192.0.2.1'", "not an address of this node")),
    "distenv: hostlist too large": (("hpc.distenv", "--hostlist", "n[0-999999999]"), None, ("n[0-999999999]",)),
    "distenv: hostlist reversed range": (("hpc.distenv", "--hostlist", "n[3-1]"), None, ("n[3-1]",)),
    "distenv: hostlist text after ]": (("hpc.distenv", "--hostlist", "n[1-2]x"), None, ("n[1-2]x", "text after ']'")),
    # --- hpc.submit ---------------------------------------------------------------------------------------
    "submit: empty --name": ((*DRY, "--name", ""), None, ("--name ''", "empty")),
    "submit: --name with a slash": ((*DRY, "--name", "a/b"), None, ("--name 'a/b'", "no '/'")),
    "submit: --name ..": ((*DRY, "--name", ".."), None, ("--name '..'",)),
    "submit: --name too long": ((*DRY, "--name", "n" * 300), None, ("--name 'nnn", "300 bytes")),
    "submit: --name with a newline": ((*DRY, "--name", "a\nb"), None, ("--name 'a\\nb'", "control characters")),
    "submit: --name starting with -": ((*DRY, "--name=-x"), None, ("--name '-x'", "leading '-'")),
    "submit: --nodes 0": ((*DRY, "--nodes", "0"), None, ("--nodes 0", ">= 1")),
    "submit: --nodes 2000": ((*DRY, "--nodes", "2000"), None, ("--nodes 2000", "at most 1536")),
    "submit: --gpus 0": ((*DRY, "--gpus", "0"), None, ("--gpus 0",)),
    "submit: --gpus 9": ((*DRY, "--gpus", "9"), None, ("--gpus 9", "4 GPUs per node")),
    "submit: --time 0": ((*DRY, "--time", "0"), None, ("-t/--time", "'0'", "no time limit")),
    "submit: --time 99999": ((*DRY, "--time", "99999"), None, ("--time 99999", "at most")),
    "submit: --time abc": ((*DRY, "--time", "abc"), None, ("--time", "'abc'")),
    "submit: --account with newline": (("hpc.submit", "--dry-run", "--account", "a\nb"), None, ("--account 'a\\nb'",)),
    "submit: --export not a name": ((*DRY, "--export", "1BAD=x"), None, ("--export '1BAD=x'", "not a variable name")),
    "submit: --export a name not set": ((*DRY, "--export", "NOEQ"), None, ("--export NOEQ", "not set here")),
    "submit: --max-parallel 0": ((*DRY, "--max-parallel", "0"), None, ("--max-parallel 0",)),
    "submit: --runs-dir is a file": ((*DRY, "--runs-dir", "{H}/data_file"), None, ("--runs-dir", "data_file", "is a file")),
    "submit: --runs-dir under a file": ((*DRY, "--runs-dir", "{H}/data_file/sub"), None, ("--runs-dir", "data_file", "is a file")),
    "submit: --profile missing": ((*DRY, "--profile", "{T}/none.yaml"), None, ("none.yaml", "cannot read")),
    "submit: --profile with a bad scheduler": (("hpc.submit", "--account", "m1_g", "--profile", "{H}/profile_bad_scheduler.yaml"), None, ("cluster.scheduler = 'pbs'",)),
    "submit: --sweep is the study's": ((*DRY, "--sweep", "{H}/sweep_gpus16.yaml"), None, ("--sweep", "python -m hpc.study run", "sweep_gpus16.yaml")),
    "study: a sweep of random bytes": (("hpc.study", "run", "{H}/random.bin", "--dry-run", "--account", "m1_g"), None, ("random.bin", "UTF-8")),
    "study: sweep name escapes": (("hpc.study", "run", "{H}/sweep_escape.yaml", "--account", "m1_g", "--local", "--runs-dir", "{T}/runs"), None, ("sweep_escape.yaml", "sweep.name", "'../../escape'")),
    "study: sweep needs 16 GPUs": (("hpc.study", "run", "{H}/sweep_gpus16.yaml", "--dry-run", "--account", "m1_g"), None, ("sweep_gpus16.yaml", "sweep.gpus", "--gpus 16")),
    "study: sweep needs 2000 nodes": (("hpc.study", "run", "{H}/sweep_nodes2000.yaml", "--dry-run", "--account", "m1_g"), None, ("sweep_nodes2000.yaml", "sweep.nodes=2000", "at most 1536")),
    "submit: --set cluster value": ((*DRY, "--set", "cluster.gpus_per_node=0"), None, ("--set cluster.gpus_per_node=0", "must be > 0")),
    "submit: unknown launcher": ((*DRY, "--set", "cluster.launcher=mpirun"), None, ("--set cluster.launcher=mpirun", "'mpirun'", "srun")),
    "study: unknown command": (("hpc.study", "launch", "x.yaml"), None, ("'launch'", "run, status, resubmit")),
    "study: status of a non-sweep": (("hpc.study", "status", "{H}"), None, ("not a sweep directory",)),
    "study: resubmit without a choice": (("hpc.study", "resubmit", "{H}/sweep_dir"), None, ("--failed, --missing",)),
    "submit: --set sweep without --sweep": ((*DRY, "--set", "sweep.name=x"), None, ("--set sweep.name=x", "'sweep' is not used here")),
    "submit: --lr inf": ((*DRY, "--lr", "inf"), None, ("--lr", "finite")),
    "submit: --batch-size x": ((*DRY, "--batch-size", "x"), None, ("command line", "--batch-size", "'x'")),
    "submit: --local on 2 nodes": (("hpc.submit", "--local", "--nodes", "2", "--config", SMOKE), None, ("--nodes 2", "--local")),
    "submit: --set train.batch_size=0": ((*DRY, "--set", "train.batch_size=0"), None, ("--set train.batch_size=0", "must be > 0")),
    "submit: --config a list": (("hpc.submit", "--dry-run", "--account", "m1_g", "--config", "{H}/list.yaml"), None, ("list.yaml", "got list")),
    # --- empty values, which argparse takes as given and the code would read as "not given" ------------
    **{f"empty {m} {flag}": ((m, *pre, flag, ""), None, (f"{flag} ''", "must not be empty")) for m, pre, flag in [
        ("hpc.config", (), "--config"), ("hpc.config", (), "--profile"), ("hpc.config", (), "--sweep"),
        ("hpc.config", (), "--set"), ("hpc.train", (), "--run-dir"), ("hpc.train", (), "--data-root"),
        ("hpc.train", (), "--config"), ("hpc.submit", ("--dry-run",), "--runs-dir"),
        ("hpc.submit", ("--dry-run",), "--profile"),
        ("hpc.submit", ("--dry-run",), "--account"), ("hpc.data", ("check",), "--root"),
        ("hpc.bench", (), "--out"), ("hpc.bench", (), "--only"), ("analysis.bench.speed", ("x.json",), "--json"),
    ]},
    "empty analysis path": (("analysis", ""), None, ("path ''", "must not be empty")),
    "empty tensorboard logdir": (("analysis.tensorboard", ""), None, ("logdir ''", "must not be empty")),
    # --- hpc.data ----------------------------------------------------------------------------------------
    "data: synth too few": (("hpc.data", "synth", "--root", "{T}/d", "--train", "10"), None, ("--train 10", "100..")),
    "data: synth no test images": (("hpc.data", "synth", "--root", "{T}/d", "--test", "0"), None, ("--test 0", "1..")),
    "data: synth too many": (("hpc.data", "synth", "--root", "{T}/d", "--train", "1000000000000"), None, ("--train 1000000000000", "1,000,000")),
    "data: synth negative seed": (("hpc.data", "synth", "--root", "{T}/d", "--seed", "-1"), None, ("--seed -1",)),
    "data: synth into a file": (("hpc.data", "synth", "--root", "{H}/data_file"), None, ("data_file", "is a file")),
    "data: synth --train abc": (("hpc.data", "synth", "--root", "{T}/d", "--train", "abc"), None, ("--train", "'abc'")),
    "data: check meta types": (("hpc.data", "check", "--root", "{H}/cifar_meta_types"), None, ("cifar_meta_types", "fine_label_names")),
    "data: check missing": (("hpc.data", "check", "--root", "{T}/nowhere"), None, ("nowhere", "no cifar-100-python/")),
    "data: check code pickle": (("hpc.data", "check", "--root", "{H}/cifar_code"), None, ("cifar_code", "refusing")),
    # --- hpc.bench: every check before any benchmark runs ---------------------------------------------------
    "bench: unknown --only": (("hpc.bench", "--only", "fastest"), None, ("--only", "fastest")),
    "bench: --steps 0": (("hpc.bench", "--steps", "0"), None, ("--steps 0",)),
    "bench: --warmup -1": (("hpc.bench", "--warmup", "-1"), None, ("--warmup -1",)),
    "bench: --out into a missing dir": (("hpc.bench", "--out", "{T}/no/such/out.json"), None, ("--out", "does not exist")),
    "bench: --out onto a directory": (("hpc.bench", "--out", "{H}"), None, ("--out", "is a directory")),
    "bench: --batch 0": (("hpc.bench", "--batch", "0"), None, ("--batch", "0")),
    "bench: --batch abc": (("hpc.bench", "--batch", "128,abc"), None, ("--batch", "abc")),
    "bench: --memory-grid x": (("hpc.bench", "--memory-grid", "x"), None, ("--memory-grid", "x")),
    "bench: --arch foo": (("hpc.bench", "--arch", "foo"), None, ("--arch", "'foo'")),
    # --- analysis ----------------------------------------------------------------------------------------
    "analysis: missing path": (("analysis", "{T}/nothing"), None, ("nothing", "no such file")),
    **{f"analysis: trace {name}": (("analysis", "{H}/" + name), None, (name, why)) for name, why in [
        ("t_list.json", "not a Chrome trace"), ("t_events_obj.json", "malformed"), ("t_trunc.json", "truncated"),
        ("t_empty.json", "truncated"), ("t_random.json", "not a Chrome trace"), ("t_gz_corrupt.json.gz", "gzip"),
        ("t_no_events.json", "no top-level traceEvents"), ("random.bin", "not a Chrome trace"),
    ]},
    "analysis: run of junk traces": (("analysis", "{H}/run_only_junk"), None, ("run_only_junk", "no usable trace", "rank0.pt.trace.json")),
    "analysis: index.json a list": (("analysis", "{H}/sweep_index_list"), None, ("sweep_index_list", "no usable trace", "'points' list")),
    "analysis: index.json junk": (("analysis", "{H}/sweep_index_junk"), None, ("sweep_index_junk", "no usable trace", "unreadable")),
    "analysis: index.json escapes": (("analysis", "{H}/sweep_index_escape"), None, ("sweep_index_escape", "../run_bad_summary")),
    "analysis: index.json mistyped": (("analysis", "{H}/sweep_index_types"), None, ("sweep_index_types", "batch_size 'eight'")),
    "analysis: --out onto a file": (("analysis", "{H}/mixed", "--out", "{H}/data_file"), None, ("--out", "data_file", "is a file")),
    "analysis: --out under a file": (("analysis", "{H}/mixed", "--out", "{H}/data_file/x"), None, ("--out", "data_file", "is a file")),
    "analysis: --plots on a file": (("analysis", "{H}/t_list.json", "--plots"), None, ("--plots", "t_list.json", "--out")),
    "analysis: --format xml": (("analysis", "{H}/mixed", "--format", "xml"), None, ("--format", "'xml'")),
    "tensorboard: missing logdir": (("analysis.tensorboard", "{T}/none"), None, ("none", "not a directory")),
    "tensorboard: --port 70000": (("analysis.tensorboard", "{H}", "--port", "70000"), None, ("--port 70000",)),
    "tensorboard: --port -1": (("analysis.tensorboard", "{H}", "--port", "-1"), None, ("--port -1",)),
    "tensorboard: --port abc": (("analysis.tensorboard", "{H}", "--port", "abc"), None, ("--port", "'abc'")),
    "tensorboard: --host not here": (("analysis.tensorboard", "{H}", "--host", "192.0.2.1"), None, ("--host '192.0.2.1'", "cannot listen")),
    "analysis.bench.speed: missing trace": (("analysis.bench.speed", "{T}/none.json"), None, ("none.json", "not a trace file")),
    "analysis.bench.speed: --repeat 0": (("analysis.bench.speed", "{H}/t_list.json", "--repeat", "0"), None, ("--repeat 0",)),
    "analysis.bench.speed: --counts with a non-ASCII digit": (("analysis.bench.speed", "--ranks", "{H}/t_list.json", "--counts", "32,²"), None, ("--counts", "'32,²'")),
    "analysis.bench.speed: --counts 1": (("analysis.bench.speed", "--ranks", "{H}/t_list.json", "--counts", "1,32"), None, ("--counts", "'1,32'", "2 or more")),
    "batch: no command": (("hpc.batch", "--name", "x"), None, ("--", "no command after it")),
    "batch: a program not here": (("hpc.batch", "--", "no-such-program-xyz"), None, ("'no-such-program-xyz'", "not found on PATH")),
    "batch: an unknown profile": (("hpc.batch", "--profile", "nope", "--", "true"), None, ("nope",)),
    "batch: a launcher inside the command": (("hpc.batch", "--", "torchrun", "train.py"), None, ("'torchrun'", "a launcher inside the command", "cluster.launcher: torchrun")),
    "submit: a launcher inside the command": (("hpc.submit", "--local", "--gpus", "2", "--", "accelerate", "launch", "train.py"), None, ("'accelerate'", "a launcher inside the command", "ACCELERATE_")),
    "hookcost: --steps 0": (("hpc.bench.hookcost", "--steps", "0"), None, ("--steps", "'0'", "1 or more")),
    "batch: a run dir under a file": (("hpc.batch", "--run-dir", "{H}/data_file/x", "--", "true"), None, ("--run-dir", "data_file")),
    "startuptime: --ranks with a non-ASCII digit": (("hpc.bench.startuptime", "--ranks", "4,²"), None, ("--ranks", "'4,²'")),
    "startuptime: --ranks 0": (("hpc.bench.startuptime", "--ranks", "0,4"), None, ("--ranks", "'0,4'", "1 or more")),
    "analysis.bench.speed: --json into a missing dir": (("analysis.bench.speed", "{H}/t_list.json", "--json", "{T}/no/x.json"), None, ("--json", "does not exist")),
    # --- what the property-based tests found (tests/unit/test_properties_*.py), each as Hypothesis shrank it ---
    "found: a trace whose traceEvents is empty": (("analysis", "{H}/t_events_empty.json"), None, ("t_events_empty.json", "no event to analyse")),
    "found: a trace whose traceEvents holds no objects": (("analysis", "{H}/t_no_objects.json"), None, ("t_no_objects.json", "no event to analyse", "3 item(s)")),
    "found: a profile path with a 300-byte name": (("hpc.config", "--profile", "{T}/" + "x" * 300), None, ("--profile", "xxxx", "File name too long")),
    "found: a profile that is a directory": ((*DRY, "--profile", "{H}/empty_root/"), None, ("--profile", "empty_root", "is a directory")),
    "found: study status of a 300-byte name": (("hpc.study", "status", "{T}/" + "x" * 300), None, ("sweep directory", "File name too long")),
    "found: a data root with a 300-byte name": (("hpc.data", "check", "--root", "{T}/" + "x" * 300), None, ("data root", "File name too long")),
    "found: analysis of a 300-byte name": (("analysis", "{T}/" + "x" * 300), None, ("path", "File name too long")),
    "found: analysis output under /sys": (("analysis", "{H}/mixed", "--out", "/sys/kernel"), None, ("--out", "/sys/kernel", "cannot write in")),
    "found: analysis output under /proc": (("analysis", "{H}/mixed", "--out", "/proc/self/x"), None, ("--out", "/proc/self", "cannot write in")),
    "found: a run dir with a 300-byte name": ((*TRAIN[:5], "--run-dir", "{T}/" + "x" * 300, "--no-profile"), None, ("--run-dir", "longer than 255 bytes")),
    "found: a run dir under /proc": ((*TRAIN[:5], "--run-dir", "/proc/self/run", "--no-profile"), None, ("--run-dir", "/proc/self/run", "cannot write in")),
    "found: a non-finite step time": (("hpc.bench", "--arch", "tiny", "--scaling-step-ms", "nan"), None, ("--scaling-step-ms 'nan'", "finite")),
    "found: an infinite step time": (("hpc.bench", "--arch", "tiny", "--scaling-step-ms=-inf"), None, ("--scaling-step-ms '-inf'", "finite")),
    "found: an int beyond int64 on a job flag": ((*DRY, "--time", "9" * 25), None, ("--time", "within")),
    "found: bench output onto /dev/null": (("hpc.bench", "--out", "/dev/null"), None, ("--out", "/dev/null", "not a regular file")),
    "found: synth into /proc": (("hpc.data", "synth", "--root", "/proc/self/data", "--train", "100", "--test", "1"), None, ("--root", "/proc/self/data", "cannot write in")),
    "found: a fault hook with a typo": ((*TRAIN,), {"HPC_FAULT_INJECT": "oom-at-stp:2"}, ("HPC_FAULT_INJECT", "'oom-at-stp:2'")),
    "found: a fault hook with a line break": ((*TRAIN,), {"HPC_FAULT_INJECT": "fail-at-step:2@batch=16\n"}, ("HPC_FAULT_INJECT", "entry")),
    "found: a fault hook exported with a typo": ((*DRY, "--export", "HPC_FAULT_INJECT=oom@2"), None, ("--export HPC_FAULT_INJECT", "'oom@2'")),
    "found: a config nested 200 deep": ((*CONFIG, "--config", "{H}/deep200.yaml"), None, ("deep200.yaml", "nested more than 100 levels")),
    "found: a tensorboard logdir with a 300-byte name": (("analysis.tensorboard", "{T}/" + "x" * 300), None, ("logdir", "File name too long")),
    "found: a config that is an endless device": ((*CONFIG, "--config", "/dev/zero"), None, ("--config /dev/zero", "not a regular file")),
    "found: a profile that is an endless device": ((*DRY, "--profile", "/dev/full"), None, ("--profile /dev/full", "not a regular file")),
    "found: a config over a mebibyte": ((*CONFIG, "--config", "{H}/big.yaml"), None, ("big.yaml", "more than 1 MiB")),
    "found: '--' as a flag's value": (("hpc.bench", "--steps=--"), None, ("--steps", "expected one value")),
    "found: '--' as a job flag's value": ((*DRY, "--time=--"), None, ("--time", "expected one value")),
    "found: a run dir under a new parent, refused late": ((*TRAIN[:5], "--run-dir", "{T}/new/deeper", "--no-profile", "--set", "model.num_classes=10"), None, ("model.num_classes = 10",)),
    "found: an empty existing run dir, refused late": ((*TRAIN[:5], "--run-dir", "{H}/empty_root", "--no-profile", "--set", "model.num_classes=10"), None, ("model.num_classes = 10",)),
    "found: a cross-field limit names the flag that broke it": ((*CONFIG, "--profile", "local", "--set", "cluster.max_time_limit_min=1"), None, ("cluster.time_limit_min = 60", "from --set cluster.max_time_limit_min=1")),
}

def call(module: str, argv: list[str], env: dict | None, monkeypatch=None) -> tuple[int, str, str]:
    outcome = commands.call(module, argv, env)
    return outcome.code, outcome.stdout, outcome.stderr


@pytest.fixture(scope="session")
def hostile_dir(tmp_path_factory):
    h = hostile.make(tmp_path_factory.mktemp("hostile"))
    return h, tree(h)


def test_at_least_150_cases():
    assert len(CASES) >= 150, len(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, hostile_dir, tmp_path, monkeypatch):
    (module, *args), env, needles = CASES[case]
    h, h_before = hostile_dir
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    fill = {"{H}": str(h), "{T}": str(work)}
    argv = [_fill(a, fill) for a in args]
    outcome = commands.call(module, argv, env)
    assert_refused(outcome, module, *(_fill(needle, fill) for needle in needles))
    assert "weights_only=False" not in outcome.lines[0]
    assert tree(work) == {}, tree(work)  # nothing half-written
    assert tree(h) == h_before  # no hostile file changed or added (damaged checkpoints stay as they are)
    assert not Path("/tmp/hpc-pwned").exists()


def _fill(text: str, fill: dict) -> str:
    for key, value in fill.items():
        text = text.replace(key, value)
    return text


def test_tensorboard_busy_port_is_one_line(hostile_dir, monkeypatch):
    h, _ = hostile_dir
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, stdout, stderr = call("analysis.tensorboard", [str(h), "--port", str(port)], None, monkeypatch)
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1, stderr
    assert f"--port {port}: cannot listen there" in stderr


# --- the valid neighbours: the same files and flags, right, still work -----------------------------------

# Each with the text its value must appear as, unclamped, in the printed config, sbatch text or output.
NEIGHBOURS = {
    "a fraction written 1/10 and a safe !!float tag": (("hpc.config", "--config", "{H}/ok_fraction.yaml"),
                                                       ("fraction: 0.1", "lr: 0.2")),
    "the largest seed": (("hpc.config", "--set", "train.seed=4294967295"), ("seed: 4294967295",)),
    "cuda_memory_fraction 1": (("hpc.config", "--set", "train.cuda_memory_fraction=1"), ("cuda_memory_fraction: 1.0",)),
    "a cluster value with its profile": (("hpc.config", "--profile", "local", "--set", "cluster.max_nodes=1"),
                                         ("\n  max_nodes: 1\n",)),
    "a sweep value with its sweep": (("hpc.config", "--sweep", "{H}/study_like.yaml", "--set", "sweep.name=ok"),
                                     ("sweep:\n  name: ok\n",)),
    "a 200-byte name": (("hpc.submit", "--dry-run", "--account", "m1_g", "--config", SMOKE, "--name", "n" * 200),
                        ("#SBATCH --job-name=" + "n" * 200 + "\n",)),
    "a dotted name": (("hpc.submit", "--dry-run", "--account", "m1_g", "--config", SMOKE, "--name", "a..b"),
                      ("#SBATCH --job-name=a..b\n", "/runs/a..b/%j/")),
    "a cluster value on submit": (("hpc.submit", "--dry-run", "--account", "m1_g", "--config", SMOKE, "--set",
                                   "cluster.qos=debug"), ("#SBATCH --qos=debug\n",)),
    "a hostlist": (("hpc.distenv", "--hostlist", "n[1-2]"), ("n1\nn2\n",)),
    "the data root the checkpoints were made on": (("hpc.data", "check", "--root", "{H}/data"),
                                                   ("{H}/data: 100 train, 20 test, 100 classes",)),
    "a merge key in a config (found by the property tests: refused, with a YAML tag's URI)": (
        ("hpc.config", "--config", "{H}/merge.yaml"), ("lr: 0.25", "epochs: 3", "momentum: 0.8")),
    "a config whose value is a list": (("hpc.config", "--config", "{H}/ok_deep_list.yaml"),
                                       ("milestones: [0.5, 0.75]", "lr: 0.1")),
}


@pytest.mark.parametrize("case", list(NEIGHBOURS))
def test_valid_neighbour_still_works(case, hostile_dir, tmp_path, monkeypatch):
    (module, *args), expected = NEIGHBOURS[case]
    h, _ = hostile_dir
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = call(module, [_fill(a, {"{H}": str(h)}) for a in args], None, monkeypatch)
    assert code == 0 and stderr == "", stderr
    for text in expected:  # as written, not a longer number (0.1 is not 0.15)
        assert re.search(re.escape(_fill(text, {"{H}": str(h)})) + r"(?![\d.])", stdout), (text, stdout[-3000:])


def test_bad_events_are_skipped_and_the_rest_analysed(hostile_dir, monkeypatch):
    h, _ = hostile_dir
    code, stdout, stderr = call("analysis", [str(h / "mixed"), "--format", "json"], None, monkeypatch)
    assert code == 0, stderr
    import json
    (rec,) = json.loads(stdout)["traces"]
    assert rec["bad_events"] == 6 and rec["steps"] == 1 and rec["op_calls"] == {"aten::add": 1}
    assert stderr.strip() == f"analysis: warning: {h / 'mixed' / 'rank0.pt.trace.json'}: 6 event(s) with mistyped fields skipped"


@pytest.mark.parametrize("run, warning", [
    ("run_bad_summary", "summary.json: ignored: Expected `object`, got `array`"),
    ("run_bad_ranks", "summary.json: ignored: world_size 'two': Expected `int | null`, got `str`"),
])
def test_a_summary_of_the_wrong_shape_is_reported_and_the_traces_still_analysed(run, warning, hostile_dir, monkeypatch):
    h, _ = hostile_dir
    code, stdout, stderr = call("analysis", [str(h / run)], None, monkeypatch)
    assert code == 0 and "rank0.pt.trace.json" in stdout, stderr
    assert warning in stderr and "Traceback" not in stderr


def test_one_bad_sweep_point_does_not_lose_the_sweep(hostile_dir, monkeypatch):
    h, _ = hostile_dir
    code, stdout, stderr = call("analysis", [str(h / "sweep_ok_with_bad_point"), "--format", "csv"], None, monkeypatch)
    assert code == 0, stderr
    assert len(stdout.strip().splitlines()) == 2 and "points[1] skipped: gpus 'None': Expected `int`, got `null`" in stderr


# --- each command's real entry point, as a process: the same one line -----------------------------------

@pytest.mark.parametrize("module, args, needle", [
    ("hpc.train", ["--batch-size", "x"], "--batch-size"),
    ("hpc.submit", ["--dry-run", "--name", ""], "--name ''"),
    ("hpc.config", ["--set", "train.lr=.inf"], "finite"),
    ("hpc.data", ["synth", "--root", "d", "--train", "-3"], "--train -3"),
    ("hpc.distenv", ["--hostlist", "n[0-9999999999]"], "n[0-9999999999]"),
    ("hpc.study", ["status", "no-such-sweep"], "no-such-sweep"),
    ("hpc.bench", ["--only", "nothing"], "nothing"),
    ("analysis", ["missing-dir"], "missing-dir"),
    ("analysis.tensorboard", [".", "--port", "99999"], "--port 99999"),
    ("analysis.bench.speed", ["--repeat", "0", "missing.json"], "missing.json"),
])
def test_main_entry_points_give_one_line(module, args, needle, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in DIST_KEYS and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(hostile.REPO)
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith(f"{module}: error: ") and needle in lines[0]
    assert list(tmp_path.iterdir()) == []
