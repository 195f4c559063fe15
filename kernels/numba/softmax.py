"""Softmax over the last dim of a 2-D tensor in Numba (``numba.cuda.jit``).

Versions (``VERSIONS``, naive to best):

    v1  naive: three kernels (max, exp-sum, normalize), x read 3 times             softmax_naive
    v2  fused: one row per block in a local array, warp-shuffle reductions (rows <= 16384)
        softmax_fused
    v3  online: running max + rescaled sum, then the output pass (any row length)   softmax_online
    v4  v2 for rows up to 16384 columns, v3 beyond                                  softmax, the reference
"""
from __future__ import annotations

import math

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index, whole_warps
from kernels.frames.softmax import MAX_THREADS, check_fused_cols, softmax_frame, softmax_ref  # noqa: F401  (the reference, defined once)
from kernels.numba.reduction import block_max_all, block_sum_all, row_max_kernel, warp_sum_all  # noqa: F401  (attention uses warp_sum_all)

from numba import cuda, float32

FULL_MASK = 0xFFFFFFFF
#: Elements per thread v2 keeps in registers: a local array needs a compile-time size.
ITEMS = 16
FUSED_MAX_COLS = ITEMS * MAX_THREADS
#: Threads per block of the row-wise kernels (smaller in simulation: one Python thread each).
ROW_THREADS = 64 if runtime.SIMULATE else 256



# ---------------------------------------------------------------------------------------
# v1, naive: three kernels. The first is lesson 04's row_max_kernel (kernels/numba/reduction.py).
@cuda.jit
def softmax_expsum_kernel(x, row_max, row_sum):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    m = row_max[row]
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        s += math.exp(x[row, c] - m)
    s = block_sum_all(s, scratch)
    if cuda.threadIdx.x == 0:
        row_sum[row] = s


@cuda.jit
def softmax_normalize_kernel(x, row_max, row_sum, y):
    """One thread per element over the flattened matrix. (A 2-D grid with one row per
    blockIdx.y would be simpler, but gridDim.y stops at 65535 rows; gridDim.x goes to 2^31 - 1.)"""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        row = i // cols
        c = i - row * cols
        y[row, c] = math.exp(x[row, c] - row_max[row]) / row_sum[row]


# ---------------------------------------------------------------------------------------
# v2, fused: one block per row, each thread keeps its ITEMS columns (t, t + blockDim,
# t + 2 * blockDim, ...) in a local array between the max, the sum and the write.
@cuda.jit
def softmax_fused_kernel(x, y):
    scratch = cuda.shared.array(32, float32)
    v = cuda.local.array(ITEMS, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    t = cuda.threadIdx.x
    bd = cuda.blockDim.x
    m = float32(-math.inf)
    for k in range(ITEMS):
        c = t + k * bd
        v[k] = x[row, c] if c < cols else float32(-math.inf)  # -inf past the end: not a max
        m = max(m, v[k])
    m = block_max_all(m, scratch)
    s = float32(0.0)
    for k in range(ITEMS):
        c = t + k * bd
        v[k] = math.exp(v[k] - m) if c < cols else float32(0.0)
        s += v[k]
    s = block_sum_all(s, scratch)
    inv = float32(1.0) / s
    for k in range(ITEMS):
        c = t + k * bd
        if c < cols:
            y[row, c] = v[k] * inv


# ---------------------------------------------------------------------------------------
# v3, online: pass 1 keeps a running max m and the sum s of exp(x - m) per thread,
# rescaling s whenever the max grows; the threads' pairs are merged across the block;
# pass 2 writes exp(x - M) / S.
@cuda.jit
def softmax_online_kernel(x, y):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    m = float32(-math.inf)
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        v = x[row, c]
        if v > m:
            s = s * math.exp(m - v) + float32(1.0)  # rescale the old sum to the new max
            m = v
        elif m > -math.inf:  # guards -inf - -inf = NaN when only -inf has been seen
            s += math.exp(v - m)
    row_m = block_max_all(m, scratch)
    s = s * math.exp(m - row_m) if m > -math.inf else float32(0.0)
    inv = float32(1.0) / block_sum_all(s, scratch)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        y[row, c] = math.exp(x[row, c] - row_m) * inv


# ---------------------------------------------------------------------------------------
def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """v1: three kernels."""
    def launch(x, y, rows, cols):
        row_max = torch.empty(rows, dtype=torch.float32, device=x.device)
        row_sum = torch.empty(rows, dtype=torch.float32, device=x.device)
        xa, ya, ma, sa = (runtime.to_numba(t) for t in (x, y, row_max, row_sum))
        threads = whole_warps(cols, ROW_THREADS)
        row_max_kernel[rows, threads](xa, ma)
        softmax_expsum_kernel[rows, threads](xa, ma, sa)
        softmax_normalize_kernel[cdiv(rows * cols, threads), threads](xa, ma, sa, ya)
    return softmax_frame(x, launch)


def softmax_fused(x: torch.Tensor) -> torch.Tensor:
    """v2: one block per row held in registers: one read of x, one write of y."""
    def launch(x, y, rows, cols):
        check_fused_cols(cols, ITEMS, MAX_THREADS)
        runtime.numba_launch(softmax_fused_kernel, rows, whole_warps(cdiv(cols, ITEMS)), x, y)
    return softmax_frame(x, launch)


def softmax_online(x: torch.Tensor) -> torch.Tensor:
    """v3: online softmax, one block per row, any row length."""
    def launch(x, y, rows, cols):
        threads = whole_warps(cdiv(cols, 8)) if not runtime.SIMULATE else whole_warps(cols, ROW_THREADS)
        runtime.numba_launch(softmax_online_kernel, rows, threads, x, y)
    return softmax_frame(x, launch)


def softmax_auto(x: torch.Tensor) -> torch.Tensor:
    """The reference: v2 where the row fits in registers, v3 beyond."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[-1] > FUSED_MAX_COLS:
        return softmax_online(x)
    return softmax_fused(x)


VERSIONS = version_index(__doc__, v1=softmax_naive, v2=softmax_fused, v3=softmax_online, v4=softmax_auto)
REFERENCE = "v4"
softmax = VERSIONS[REFERENCE][1]
