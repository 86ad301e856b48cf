"""Kernel classes by name: what a device kernel computes (convolution, GEMM, ..., communication)."""

from __future__ import annotations

import functools
import re

KERNEL_CLASSES = ("convolution", "gemm", "normalisation", "elementwise", "reduction", "communication", "other")
# First match wins: cuDNN's convolution kernels often say "gemm" too (implicit GEMM), and its
# batch-norm kernels say "cudnn", so the more specific classes come first.
_CLASS_RULES = [
    ("communication", re.compile(r"nccl|allreduce|all_reduce|allgather|reducescatter|sendrecv")),
    ("normalisation", re.compile(r"batch_?norm|bn_fw|bn_bw|_bn_|layer_?norm|group_?norm|instance_?norm|welford")),
    ("convolution", re.compile(r"conv|fprop|dgrad|wgrad|winograd|implicit_?gemm|cudnn|xmma|precomputed")),
    ("gemm", re.compile(r"gemm|cutlass|cublas|matmul|gemv|\bdot\b")),
    ("reduction", re.compile(r"reduce|reduction|softmax|argmax|sum_kernel|norm_kernel|cross_entropy|nll_loss")),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|pointwise|copy_kernel|fill|foreach|"
            r"add_kernel|mul_kernel|relu|threshold|clamp|where|cat_|index|scatter|gather"
        ),
    ),
]


@functools.lru_cache(maxsize=65536)  # kernel names repeat thousands of times per trace
def classify_kernel(name: str) -> str:
    name = name.lower()  # lower-case patterns on a lowered name: ~6x faster than re.I on long kernel names
    for cls, pattern in _CLASS_RULES:
        if pattern.search(name):
            return cls
    return "other"
