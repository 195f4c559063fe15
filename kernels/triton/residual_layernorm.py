"""Residual add + LayerNorm in Triton, as in ``kernels/cuda/residual_layernorm.cu``: v1 an add
kernel then lesson 09's LayerNorm, v2 fused: one program per row, the whole row in one block
(rows up to 16384 columns: GPT widths are 768 to 12288).

Versions (``VERSIONS``, naive to best):

    v1  unfused: an add kernel writes h, then lesson 09's LayerNorm reads it back
    v2  fused: one program per row, x and r read once, h and y written once
"""
from __future__ import annotations

import runtime
from kernels._launch import version_index
from kernels.frames.residual_layernorm import EPS, fused_frame, unfused_frame
from kernels.triton.layernorm import layernorm

import triton
import triton.language as tl

MAX_COLS = 16384
ADD_BLOCK = 256 if runtime.SIMULATE else 1024


@triton.jit
def residual_add_kernel(x_ptr, r_ptr, h_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(h_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(r_ptr + offs, mask=mask), mask=mask)


@triton.jit
def residual_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, cols, eps,
                              BLOCK_SIZE: tl.constexpr):
    # bfloat16 x and r: the sum and the statistics in float32 (mean_ptr's type), h and y
    # rounded once, as they are stored; the statistics are those of the stored h
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < cols
    st = mean_ptr.dtype.element_ty
    h = (tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
         + tl.load(r_ptr + row * cols + offs, mask=mask, other=0.0)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * cols + offs, h, mask=mask)
    h = h.to(st)
    mean = tl.sum(h, axis=0) / cols
    d = tl.where(mask, h - mean, 0.0)  # the padding lanes must not add (0 - mean)^2
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(st)
    b = tl.load(b_ptr + offs, mask=mask).to(st)
    tl.store(y_ptr + row * cols + offs, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    def add(x2, r2, h):
        residual_add_kernel[(triton.cdiv(h.numel(), ADD_BLOCK),)](x2, r2, h, h.numel(), BLOCK_SIZE=ADD_BLOCK)
    return unfused_frame(x, r, w, b, eps, stats, add, layernorm)


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    def launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, eps):
        block = triton.next_power_of_2(cols)
        residual_layernorm_kernel[(rows,)](x2, r2, w, b, h, y, mean, rstd, cols, eps, BLOCK_SIZE=block,
                                           num_warps=min(16, max(1, block // 256)))
    return fused_frame(x, r, w, b, eps, stats, launch, max_cols=MAX_COLS)


VERSIONS = version_index(__doc__, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]
