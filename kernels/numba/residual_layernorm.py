"""Residual add + LayerNorm in Numba, as in ``kernels/cuda/residual_layernorm.cu``: v1 an add
kernel then lesson 09's LayerNorm, v2 fused (one block per row).

Versions (``VERSIONS``, naive to best):

    v1  unfused: an add kernel writes h, then lesson 09's LayerNorm reads it back
    v2  fused: one block per row, x and r read once, h and y written once
"""
from __future__ import annotations

import math

import runtime
from kernels._launch import version_index
from kernels.frames.residual_layernorm import EPS, THREADS, fused_frame, grid_for, unfused_frame
from kernels.numba.layernorm import layernorm
from kernels.numba.reduction import block_sum_all

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
    mean = block_sum_all(s, scratch) / cols
    q = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        d = h[row, c] - mean
        q += d * d
    rstd = 1.0 / math.sqrt(block_sum_all(q, scratch) / cols + eps)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        y[row, c] = (h[row, c] - mean) * rstd * w[c] + b[c]
    if cuda.threadIdx.x == 0:
        mean_out[row] = mean
        rstd_out[row] = rstd


def _nb(t):
    return runtime.to_numba(t)


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    def add(x2, r2, h):
        residual_add_kernel[grid_for(h.numel()), THREADS](*(_nb(t.reshape(-1)) for t in (x2, r2, h)))
    return unfused_frame(x, r, w, b, eps, stats, add, layernorm)


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    def launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, eps):
        residual_layernorm_kernel[rows, THREADS](*(_nb(t) for t in (x2, r2, w, b, h, y, mean, rstd)), eps)
    return fused_frame(x, r, w, b, eps, stats, launch)


VERSIONS = version_index(__doc__, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]
