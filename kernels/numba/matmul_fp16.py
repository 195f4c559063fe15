"""Matrix multiplication of float16 (or bfloat16) inputs in Numba (topic ``matmul_fp16``).

    v1  naive: one thread per output, float16 inputs, float32 accumulation (no tensor cores)
        matmul_fp16: float32 sums and C

Numba has no tensor-core API: this is the naive kernel of kernels/numba/matmul.py with
16-bit inputs converted to float32 before each product, the accumulation in float32.
"""
from __future__ import annotations

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index
from kernels.frames.matmul_fp16 import HALF, matmul_fp16_ref, matmul_ref, prepare_operands  # noqa: F401  (the references)

from numba import cuda, float32


@cuda.jit
def matmul_fp16_kernel(a, b, c):
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0.0)  # float32 sums: a float16 sum of K terms would drift (see lesson 06)
        for k in range(a.shape[1]):
            acc += float32(a[row, k]) * float32(b[k, col])
        c[row, col] = acc


def matmul_fp16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: float16 A and B (bfloat16 is converted to float32 first: Numba has no bfloat16)."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_fp16", dtypes=HALF)
    if a.dtype == torch.bfloat16:
        a, b = a.float(), b.float()  # exact: every bfloat16 value is a float32 value
    if c.numel() and K:
        runtime.numba_launch(matmul_fp16_kernel, (cdiv(N, 16), cdiv(M, 16)), (16, 16), a, b, c)
    return c


VERSIONS = version_index(__doc__, v1=matmul_fp16)
REFERENCE = "v1"
