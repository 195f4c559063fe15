"""Residual add + LayerNorm in Triton, as in ``kernels/cuda/residual_layernorm.cu``: v1 an add
kernel then lesson 09's LayerNorm, v2 fused: one program per row, the whole row in one block
(rows up to 16384 columns: GPT widths are 768 to 12288).

Versions (``VERSIONS``, naive to best):

    v1  unfused: an add kernel writes h, then lesson 09's LayerNorm reads it back
    v2  fused: one program per row, x and r read once, h and y written once
"""
from __future__ import annotations

import torch

import utils
from kernels._launch import version_index
from kernels.cuda.residual_layernorm import EPS, _stats_out, check_residual_inputs, residual_layernorm_ref  # noqa: F401  (input rules and references, defined once)

import triton
import triton.language as tl

MAX_COLS = 16384
ADD_BLOCK = 256 if utils.SIMULATE else 1024


@triton.jit
def residual_add_kernel(x_ptr, r_ptr, h_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(h_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(r_ptr + offs, mask=mask), mask=mask)


@triton.jit
def residual_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, cols, eps,
                              BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < cols
    h = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0) + tl.load(r_ptr + row * cols + offs, mask=mask,
                                                                           other=0.0)
    tl.store(h_ptr + row * cols + offs, h, mask=mask)
    mean = tl.sum(h, axis=0) / cols
    d = tl.where(mask, h - mean, 0.0)  # the padding lanes must not add (0 - mean)^2
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(y_ptr + row * cols + offs, d * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    h = torch.empty_like(x2)
    n = h.numel()
    if n:
        residual_add_kernel[(triton.cdiv(n, ADD_BLOCK),)](x2, r2, h, n, BLOCK_SIZE=ADD_BLOCK)
    from kernels.triton.layernorm import layernorm
    y, mean, rstd = layernorm(h, w, b, eps, stats=True)
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    rows, cols = x2.shape
    if cols > MAX_COLS:
        raise ValueError(f"residual_layernorm: rows of {cols} columns do not fit one program (at most {MAX_COLS}): "
                         "use residual_layernorm_unfused (v1)")
    h, y = torch.empty_like(x2), torch.empty_like(x2)
    mean, rstd = _stats_out(x2)
    if rows and cols:
        block = triton.next_power_of_2(cols)
        residual_layernorm_kernel[(rows,)](x2, r2, w, b, h, y, mean, rstd, cols, float(eps), BLOCK_SIZE=block,
                                           num_warps=min(16, max(1, block // 256)))
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


VERSIONS = version_index(__doc__, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]
