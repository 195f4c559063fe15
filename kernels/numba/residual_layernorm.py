"""Residual add + LayerNorm in Numba, as in ``kernels/cuda/residual_layernorm.cu``: v1 an add
kernel then lesson 09's LayerNorm, v2 fused (one block per row).

Versions (``VERSIONS``, naive to best):

    v1  unfused: an add kernel writes h, then lesson 09's LayerNorm reads it back
    v2  fused: one block per row, x and r read once, h and y written once
"""
from __future__ import annotations

import math

import torch

import utils
from kernels._launch import version_index
from kernels.cuda.residual_layernorm import (  # noqa: F401  (input rules and references, defined once)
    EPS,
    MAX_BLOCKS,
    THREADS,
    _stats_out,
    check_residual_inputs,
    residual_layernorm_ref,
)
from kernels.numba.cross_entropy import block_sum

from numba import cuda, float32


@cuda.jit
def residual_add_kernel(x, r, h):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        h[i] = x[i] + r[i]


@cuda.jit
def residual_layernorm_kernel(x, r, w, b, h, y, mean_out, rstd_out, eps):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        v = x[row, c] + r[row, c]
        h[row, c] = v  # each thread re-reads only what it wrote itself
        s += v
    mean = block_sum(s, scratch) / cols
    q = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        d = h[row, c] - mean
        q += d * d
    rstd = 1.0 / math.sqrt(block_sum(q, scratch) / cols + eps)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        y[row, c] = (h[row, c] - mean) * rstd * w[c] + b[c]
    if cuda.threadIdx.x == 0:
        mean_out[row] = mean
        rstd_out[row] = rstd


def _nb(t):
    return utils.to_numba(t)


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    h = torch.empty_like(x2)
    n = h.numel()
    if n:
        residual_add_kernel[max(1, min((n + THREADS - 1) // THREADS, MAX_BLOCKS)), THREADS](
            _nb(x2.reshape(-1)), _nb(r2.reshape(-1)), _nb(h.reshape(-1)))
    from kernels.numba.layernorm import layernorm
    y, mean, rstd = layernorm(h, w, b, eps, stats=True)
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    rows, cols = x2.shape
    h, y = torch.empty_like(x2), torch.empty_like(x2)
    mean, rstd = _stats_out(x2)
    if rows and cols:
        residual_layernorm_kernel[rows, THREADS](_nb(x2), _nb(r2), _nb(w), _nb(b), _nb(h), _nb(y), _nb(mean),
                                                 _nb(rstd), float(eps))
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


VERSIONS = version_index(__doc__, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]
