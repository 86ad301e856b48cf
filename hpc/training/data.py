"""CIFAR-100 in its standard `cifar-100-python/{train,test,meta}` pickle layout.

- `load_cifar100(root)` reads the real files (or ones `synth` wrote) with a restricted unpickler.
- `python -m hpc.data synth --root DIR` writes that layout with learnable class structure.
- `python -m hpc.data download --root DIR` uses torchvision's downloader (login node with internet).
- `balanced_subset` / `shard_indices` give the study's data fractions and per-rank shards.
- `DeviceBatches` keeps the whole uint8 set on the device and augments there (the fast path);
  `loader_batches` is the classic DataLoader path (workers, pinned memory), as the seed scripts do.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpc.core.cli import Parser, check_output_dir, inspect_path, run, shown
from hpc.core.errors import EXIT_OK, UsageError
from hpc.core.files import write_atomic

DIRNAME = "cifar-100-python"
FILES = ("train", "test", "meta")
MEAN = (0.5071, 0.4865, 0.4409)
STD = (0.2673, 0.2564, 0.2762)
NUM_CLASSES = 100

# --- files ----------------------------------------------------------------------------------------


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """CIFAR's files are pickles; allow only what they contain (numpy arrays), never arbitrary code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = _ArrayOnlyUnpickler(f, encoding="latin1").load()
    except FileNotFoundError:
        raise UsageError(f"{path}: missing (expected the {DIRNAME}/ layout: train, test, meta)") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, OSError) as e:
        raise UsageError(f"{path}: not a readable CIFAR-100 pickle ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{path}: not a CIFAR-100 pickle (top level is {type(obj).__name__}, not a dict)")
    # Python 2 pickles decoded with latin1 give str keys; Python 3 ones may hold bytes keys.
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


@dataclass
class Split:
    images: np.ndarray  # uint8 [N, 32, 32, 3], HWC like torchvision's CIFAR100.data
    labels: np.ndarray  # int64 [N], fine labels 0..99


def _read_split(path: Path) -> Split:
    entry = _read_pickle(path)
    for key in ("data", "fine_labels"):
        if key not in entry:
            raise UsageError(f"{path}: not a CIFAR-100 split (no {key!r} entry)")
    try:
        data = np.asarray(entry["data"])
        labels = np.asarray(entry["fine_labels"], dtype=np.int64)
    except (ValueError, TypeError, OverflowError) as e:
        raise UsageError(f"{path}: 'data'/'fine_labels' are not arrays of numbers ({type(e).__name__})") from None
    if labels.ndim != 1:
        raise UsageError(f"{path}: 'fine_labels' must be a flat list of integers (got shape {list(labels.shape)})")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise UsageError(
            f"{path}: 'data' must be uint8 [N, 3072] matching 'fine_labels' "
            f"(got {data.dtype} {list(data.shape)} and {len(labels)} labels)"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise UsageError(f"{path}: fine_labels outside 0..{NUM_CLASSES - 1}")
    return Split(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels)


def check_root(root: Path) -> None:
    """A data root that exists is a directory (a file there would fail deep inside later), at a path the
    system will look at."""
    for path in (root, root / DIRNAME):
        status = inspect_path(path, "data root")
        if status is not None and not stat.S_ISDIR(status.st_mode):
            raise UsageError(f"data root {shown(str(root))}: {shown(str(path))} is a file, not a directory")


def has_dataset(root: Path) -> bool:
    return all((Path(root) / DIRNAME / name).is_file() for name in FILES)


def is_synthetic(class_names: list[Any]) -> bool:  # read from a file: names of any type, checked
    return bool(class_names) and class_names[0] in (SYNTH_FIRST_CLASS, SYNTH_FIRST_CLASS.encode())


def load_cifar100(root: str | os.PathLike) -> tuple[Split, Split, list[str]]:
    """(train, test, class names) from ROOT/cifar-100-python. UsageError names what is wrong."""
    root = Path(root)
    base = root / DIRNAME
    check_root(root)
    if not base.is_dir():
        raise UsageError(
            f"data root {str(root)!r} has no {DIRNAME}/ directory (write one with "
            f"`python -m hpc.data synth --root {root}` or fetch the real set with "
            f"`python -m hpc.data download --root {root}`)"
        )
    meta = _read_pickle(base / "meta")
    names = meta.get("fine_label_names", [])
    if not isinstance(names, list) or not all(isinstance(n, (str, bytes)) for n in names):
        raise UsageError(f"{base / 'meta'}: fine_label_names must be a list of names, got {type(names).__name__}")
    if len(names) != NUM_CLASSES:
        raise UsageError(f"{base / 'meta'}: expected {NUM_CLASSES} fine_label_names, found {len(names)}")
    return _read_split(base / "train"), _read_split(base / "test"), names


def _write_pickle_atomic(path: Path, obj: dict) -> None:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=2)  # the protocol of the published files
    write_atomic(path, buf.getvalue())


SYNTH_MAX_IMAGES = 1_000_000
SYNTH_FIRST_CLASS = "class_000"  # synthesize's classes are class_000 ... class_099; the real set's are words


def prepare_synth_dir(root: Path) -> Path:
    """ROOT/cifar-100-python, made and checked writable (before minutes of image making, not after)."""
    check_root(root)
    base = root / DIRNAME
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"data root {str(root)!r}: cannot write a synthetic set there ({e.strerror or e})") from None
    return base


def synthesize(root: str | os.PathLike, n_train: int = 5000, n_test: int = 1000, seed: int = 0) -> Path:
    """Write ROOT/cifar-100-python/{train,test,meta} in the published format, with learnable classes.

    Each class has a smooth colour pattern (a few random low-frequency sinusoids); an image is its
    class pattern, shifted by a few pixels and brightness-jittered, plus noise. A small CNN learns it
    well above chance (1 %) in a few hundred steps; it is no substitute for the real data's accuracy.
    """
    if n_train < NUM_CLASSES or n_test < 1:
        raise UsageError(
            f"synth: need at least {NUM_CLASSES} training images (one per class) and 1 test image "
            f"(asked {n_train} and {n_test})"
        )
    if max(n_train, n_test) > SYNTH_MAX_IMAGES:
        raise UsageError(
            f"synth: {max(n_train, n_test)} images: at most {SYNTH_MAX_IMAGES:,} "
            "(3 GB; the real training set has 50,000)"
        )
    if not 0 <= seed < 2**32:
        raise UsageError(f"synth: seed {seed}: must be in 0..2**32-1")
    check_root(Path(root))
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:40, 0:40].astype(np.float32) / 40.0
    patterns = np.zeros((NUM_CLASSES, 40, 40, 3), np.float32)
    for c in range(NUM_CLASSES):
        for _ in range(3):
            fy, fx = rng.uniform(0.5, 3.0, size=2)
            phase = rng.uniform(0, 2 * np.pi)
            colour = rng.normal(0, 1, size=3)
            patterns[c] += np.sin(2 * np.pi * (fy * yy + fx * xx) + phase)[..., None] * colour
    patterns /= patterns.reshape(NUM_CLASSES, -1).std(axis=1)[:, None, None, None]

    def make(n: int) -> tuple[np.ndarray, list[int]]:
        labels = np.arange(n) % NUM_CLASSES  # balanced, like the real set
        rng.shuffle(labels)
        out = np.empty((n, 32, 32, 3), np.uint8)
        for i, c in enumerate(labels):
            dy, dx = rng.integers(0, 9, size=2)
            img = 128 + 45 * patterns[c, dy : dy + 32, dx : dx + 32] * rng.uniform(0.7, 1.3)
            img += rng.normal(0, 30, size=img.shape)
            out[i] = np.clip(img, 0, 255).astype(np.uint8)
        return out.transpose(0, 3, 1, 2).reshape(n, 3072), labels.tolist()

    base = prepare_synth_dir(Path(root))
    fine_names = [f"class_{i:03d}" for i in range(NUM_CLASSES)]
    coarse_names = [f"superclass_{i:02d}" for i in range(20)]
    for split, n in (("train", n_train), ("test", n_test)):
        data, labels = make(n)
        _write_pickle_atomic(
            base / split,
            {
                "filenames": [f"synthetic_{split}_{i:06d}.png" for i in range(n)],
                "batch_label": f"{split}ing batch 1 of 1 (synthetic)",
                "fine_labels": labels,
                "coarse_labels": [label // 5 for label in labels],
                "data": data,
            },
        )
    _write_pickle_atomic(base / "meta", {"fine_label_names": fine_names, "coarse_label_names": coarse_names})
    return base


# ----------------------------------------------------------------------------------------------
# Subsets and shards (identical on every rank: they depend only on the seed and epoch)
# ----------------------------------------------------------------------------------------------


def balanced_subset(labels: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Sorted indices of a deterministic, class-balanced `fraction` of the set (at least 1 per class)."""
    if fraction >= 1.0:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed + 7919)
    keep = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        take = max(1, int(round(fraction * len(idx))))
        keep.append(rng.permutation(idx)[:take])
    return np.sort(np.concatenate(keep))


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """This rank's sample order for one epoch, as torch's DistributedSampler(drop_last=False) gives it.

    Shuffle with a generator seeded by seed + epoch (DistributedSampler.set_epoch), pad by repeating
    from the start so every rank gets the same count, then take every world_size-th index.
    """

    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).numpy()
    else:
        order = np.arange(n)
    total = math.ceil(n / world_size) * world_size
    if total > n:
        reps = math.ceil((total - n) / n)
        order = np.concatenate([order] + [order] * reps)[:total]
    return order[rank:total:world_size]


def eval_indices(n: int, rank: int, world_size: int) -> np.ndarray:
    """Exact split of the test set: each image on exactly one rank, none repeated, none dropped."""
    return np.arange(rank, n, world_size)


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------


class DeviceBatches:
    """The whole uint8 set on the device; crop (pad 4) + flip + normalise done there per batch.

    Augmentation randomness is drawn from a generator re-seeded for every batch from
    (seed, epoch, batch index, rank), so a resumed run draws exactly what an uninterrupted one would.
    """

    def __init__(self, split: Split, device: torch.device, channels_last: bool = False):
        self.device = torch.device(device)
        self.images = torch.from_numpy(split.images).to(self.device).permute(0, 3, 1, 2).contiguous()  # N,3,32,32
        self.labels = torch.from_numpy(split.labels).to(self.device)
        self.mean = torch.tensor(MEAN, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=self.device).view(1, 3, 1, 1) * 255
        self.channels_last = channels_last
        self.generator = torch.Generator(device=self.device)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: np.ndarray, augment: bool, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(np.ascontiguousarray(indices)).to(self.device, non_blocking=True)
        x = self.images.index_select(0, idx)
        if augment:
            self.generator.manual_seed(int(seed) if seed is not None else 0)
            b = x.shape[0]
            padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
            offs = torch.randint(0, 9, (2, b), device=self.device, generator=self.generator)
            base = torch.arange(32, device=self.device)
            rows = (offs[0, :, None] + base)[:, None, :, None]  # b,1,32,1
            cols = (offs[1, :, None] + base)[:, None, None, :]  # b,1,1,32
            bi = torch.arange(b, device=self.device)[:, None, None, None]
            ci = torch.arange(3, device=self.device)[None, :, None, None]
            x = padded[bi, ci, rows, cols]
            flip = torch.rand(b, device=self.device, generator=self.generator) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        x = (x.float() - self.mean) / self.std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, self.labels.index_select(0, idx)


def batch_seed(seed: int, epoch: int, batch_index: int, rank: int) -> int:
    digest = hashlib.sha256(f"{seed}/{epoch}/{batch_index}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def loader_batches(
    split: Split,
    indices: np.ndarray,
    batch_size: int,
    augment: bool,
    num_workers: int,
    pin_memory: bool,
    device: torch.device,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The seed scripts' way: torchvision transforms on PIL images in DataLoader workers."""
    import torchvision.transforms as T
    from PIL import Image

    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if augment else []
    transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])

    class _Set(torch.utils.data.Dataset):
        def __len__(self):
            return len(split.labels)

        def __getitem__(self, i):
            return transform(Image.fromarray(split.images[i])), int(split.labels[i])

    loader = torch.utils.data.DataLoader(
        _Set(),
        batch_size=batch_size,
        sampler=list(map(int, indices)),
        num_workers=num_workers,
        pin_memory=pin_memory and torch.device(device).type == "cuda",
        drop_last=False,
        persistent_workers=False,
    )
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m hpc.data", description="CIFAR-100 data utilities.", needs_args=True)
    sub = parser.add_subparsers(dest="cmd", required=True)
    said = "Write a synthetic set in the cifar-100-python layout (the quickstart's, and the tests')."
    p_synth = sub.add_parser("synth", help="write a synthetic set in the cifar-100-python layout", description=said)
    p_synth.add_argument("--root", required=True, help="data root (the layout goes in ROOT/cifar-100-python)")
    p_synth.add_argument("--train", type=int, default=5000, help="training images (default 5000)")
    p_synth.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    p_synth.add_argument("--seed", type=int, default=0, help="seed of the images and labels (default 0)")
    p_dl = sub.add_parser(
        "download",
        help="download the real CIFAR-100 with torchvision (needs internet)",
        description="Download the real CIFAR-100 with torchvision (needs internet: on Perlmutter, a login node).",
    )
    p_dl.add_argument("--root", required=True, help="data root (the set goes in ROOT/cifar-100-python)")
    p_check = sub.add_parser(
        "check", help="load a data root and print its sizes", description="Load a data root and print its sizes."
    )
    p_check.add_argument("--root", required=True, help="the data root to check")
    args = parser.parse_args(argv)

    if args.cmd == "synth":
        for flag, value, least in (("--train", args.train, NUM_CLASSES), ("--test", args.test, 1)):
            if not least <= value <= SYNTH_MAX_IMAGES:
                raise UsageError(f"command line: {flag} {value}: must be in {least}..{SYNTH_MAX_IMAGES:,}")
        if not 0 <= args.seed < 2**32:
            raise UsageError(f"command line: --seed {args.seed}: must be in 0..2**32-1")
        check_output_dir(args.root, "command line: --root")
        base = synthesize(args.root, args.train, args.test, args.seed)
        print(f"wrote {args.train} train / {args.test} test synthetic images to {base}")
    elif args.cmd == "download":
        from torchvision.datasets import CIFAR100

        try:
            for train in (True, False):
                CIFAR100(args.root, train=train, download=True)
        except Exception as e:  # urllib raises many kinds; all mean "could not fetch"
            raise UsageError(
                f"download into {args.root!r} failed ({type(e).__name__}: {e}); "
                "on a compute node without internet, download on a login node"
            ) from None
        print(f"CIFAR-100 ready in {Path(args.root) / DIRNAME}")
    else:
        train_split, test_split, names = load_cifar100(args.root)
        print(f"{args.root}: {len(train_split.labels)} train, {len(test_split.labels)} test, {len(names)} classes")
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The command (`python -m hpc.data`, or its console script): errors as one line, exit 2."""
    return run("hpc.data", main, argv)
