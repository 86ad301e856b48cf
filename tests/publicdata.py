"""Data the public scripts (tests/public/) read, in its own format, where they find it before they would
download it: CI has no internet."""

import struct
from pathlib import Path


def write_mnist(raw: Path, train: int, test: int) -> None:
    """Tiny MNIST files in its own idx format (big-endian magic 2051 for images, 2049 for labels), where
    torchvision's MNIST finds them before it would download: random digits, labels 0-9."""
    import numpy as np

    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
