"""hpc.data: the cifar-100-python format, subsets, DistributedSampler-equivalent shards, exact eval split."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from conftest import assert_one_line_error, run_module
from hpc.training import data


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    data.synthesize(root, n_train=600, n_test=150, seed=3)
    return root


def test_synth_writes_the_published_layout(synth_root):
    base = synth_root / "cifar-100-python"
    assert sorted(p.name for p in base.iterdir()) == ["meta", "test", "train"]
    with open(base / "train", "rb") as f:
        entry = pickle.load(f, encoding="latin1")  # how torchvision reads the real files
    assert set(entry) == {"filenames", "batch_label", "fine_labels", "coarse_labels", "data"}
    assert entry["data"].dtype == np.uint8 and entry["data"].shape == (600, 3072)
    assert len(entry["fine_labels"]) == 600 and max(entry["fine_labels"]) == 99
    assert all(c == f // 5 for f, c in zip(entry["fine_labels"], entry["coarse_labels"]))
    with open(base / "meta", "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    assert len(meta["fine_label_names"]) == 100 and len(meta["coarse_label_names"]) == 20


def test_load_roundtrip_and_class_balance(synth_root):
    train, test, names = data.load_cifar100(synth_root)
    assert train.images.shape == (600, 32, 32, 3) and test.images.shape == (150, 32, 32, 3)
    assert np.bincount(train.labels, minlength=100).tolist() == [6] * 100
    # row-major RGB planes: the red plane of image 0 is its first 1024 bytes
    with open(synth_root / "cifar-100-python" / "train", "rb") as f:
        raw = pickle.load(f, encoding="latin1")["data"]
    assert np.array_equal(train.images[0, :, :, 0].reshape(-1), raw[0, :1024])


def test_restricted_unpickler_refuses_code(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    for name in ("train", "test", "meta"):
        (base / name).write_bytes(pickle.dumps({"data": Evil()}, protocol=2))
    proc = run_module("hpc.data", "check", "--root", str(tmp_path))
    assert_one_line_error(proc, "meta", "refusing to load", ".print")
    assert "owned" not in proc.stdout


@pytest.mark.parametrize("damage,needle", [
    ("truncate", "not a readable CIFAR-100 pickle"),
    ("remove", "missing"),
    ("wrong", "no 'data' entry"),
])
def test_bad_data_files_are_one_line_errors(tmp_path, damage, needle):
    data.synthesize(tmp_path, n_train=100, n_test=10)
    target = tmp_path / "cifar-100-python" / "train"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:5000])
    elif damage == "remove":
        target.unlink()
    else:
        target.write_bytes(pickle.dumps({"labels": [1]}, protocol=2))
    assert_one_line_error(run_module("hpc.data", "check", "--root", str(tmp_path)), str(target), needle)


def test_missing_layout_names_the_root(tmp_path):
    assert_one_line_error(run_module("hpc.data", "check", "--root", str(tmp_path)), str(tmp_path),
                          "no cifar-100-python/")


def test_download_offline_is_a_clear_error(tmp_path):
    proc = run_module("hpc.data", "download", "--root", str(tmp_path), env={"http_proxy": "http://127.0.0.1:9",
                                                                           "https_proxy": "http://127.0.0.1:9"})
    assert_one_line_error(proc, "download into", "failed")


def test_balanced_subset_is_deterministic_and_balanced():
    labels = np.repeat(np.arange(100), 50)
    half = data.balanced_subset(labels, 0.5, seed=1)
    tenth = data.balanced_subset(labels, 0.1, seed=1)
    assert np.array_equal(half, data.balanced_subset(labels, 0.5, seed=1))
    assert np.bincount(labels[half]).tolist() == [25] * 100
    assert np.bincount(labels[tenth]).tolist() == [5] * 100
    assert len(np.unique(half)) == len(half)
    assert np.array_equal(data.balanced_subset(labels, 1.0), np.arange(len(labels)))


@pytest.mark.parametrize("n,world", [(10, 3), (17, 4), (8, 2), (5, 8)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_shards_equal_distributed_sampler(n, world, epoch):
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=11)
        sampler.set_epoch(epoch)
        assert data.shard_indices(n, rank, world, epoch, seed=11).tolist() == list(sampler)


def test_eval_split_counts_each_image_once():
    n, world = 1003, 4
    parts = [data.eval_indices(n, r, world) for r in range(world)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))


def test_device_batches_augment_deterministically(synth_root):
    train, _, _ = data.load_cifar100(synth_root)
    batches = data.DeviceBatches(train, "cpu")
    idx = np.arange(8)
    a, ya = batches.batch(idx, augment=True, seed=5)
    b, _ = batches.batch(idx, augment=True, seed=5)
    c, _ = batches.batch(idx, augment=True, seed=6)
    plain, _ = batches.batch(idx, augment=False)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (8, 3, 32, 32) and ya.tolist() == train.labels[:8].tolist()
    assert abs(float(plain.mean())) < 1.0  # normalised
    # an un-shifted, un-flipped crop reproduces the image: some of the 8 draw offset (4, 4) rarely, so
    # check instead that every crop is a window of the zero-padded image
    padded = torch.nn.functional.pad(batches.images[:8].float(), (4, 4, 4, 4))
    raw = a * batches.std + batches.mean
    for i in range(8):
        found = False
        for img in (raw[i], raw[i].flip(2)):
            for dy in range(9):
                for dx in range(9):
                    if torch.allclose(img, padded[i, :, dy:dy + 32, dx:dx + 32], atol=1e-3):
                        found = True
        assert found
