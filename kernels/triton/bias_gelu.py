"""Bias + GELU (tanh approximation) in Triton, as in ``kernels/cuda/bias_gelu.cu``: v1 a
bias-add kernel then lesson 03's GELU, v2 fused; and the backward d(x + b) = dy * gelu'(x + b).

tanh(u) is written with one ``tl.exp`` (as lesson 03's Triton GELU does): 1 + tanh(u) =
2 / (1 + exp(-2u)), so gelu(z) = z / (1 + exp(-2u)), finite for every z.

``column_partials_kernel`` sums rows in parts (the bias's gradient is the column sum of
d(x + b): the written-out training step, ``kernels/gpt_step.py``, adds the parts with lesson
09's ``column_sum_kernel``). Half-precision inputs are computed in float32.

Versions (``VERSIONS``, naive to best):

    v1  unfused: a bias-add kernel, then lesson 03's GELU (x + b makes a round trip through memory)
    v2  fused: gelu(x + b) in one kernel, x read once and y written once
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import version_index
from kernels.frames.bias_gelu import check_bias_backward_inputs, check_bias_inputs

import triton
import triton.language as tl

BLOCK = 256 if runtime.SIMULATE else 1024


@triton.jit
def _sig2u(z):
    """(1 + tanh(u)) / 2 = sigmoid(2u), u = sqrt(2/pi) (z + 0.044715 z^3)."""
    u = 0.7978845608 * (z + 0.044715 * z * z * z)
    return 1.0 / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def bias_add_kernel(x_ptr, b_ptr, t_ptr, n, cols, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    t = tl.load(x_ptr + offs, mask=mask) + tl.load(b_ptr + offs % cols, mask=mask)
    tl.store(t_ptr + offs, t, mask=mask)


@triton.jit
def _wide(v):
    """Half-precision values widened to float32 (float32 and float64 stay as they are): the
    arithmetic of a bfloat16 model runs in float32, only the loads and stores are 2 bytes."""
    if v.dtype.is_fp16() or v.dtype.is_bf16():
        v = v.to(tl.float32)
    return v


@triton.jit
def bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n, cols, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    z = _wide(tl.load(x_ptr + offs, mask=mask)) + _wide(tl.load(b_ptr + offs % cols, mask=mask))
    tl.store(y_ptr + offs, (z * _sig2u(z)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bias_gelu_backward_kernel(dy_ptr, x_ptr, b_ptr, dx_ptr, n, cols, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    z = _wide(tl.load(x_ptr + offs, mask=mask)) + _wide(tl.load(b_ptr + offs % cols, mask=mask))
    s = _sig2u(z)  # (1 + t) / 2, t = tanh(u)
    t = 2.0 * s - 1.0
    d = s + 0.5 * z * (1.0 - t * t) * 0.7978845608 * (1.0 + 3.0 * 0.044715 * z * z)
    tl.store(dx_ptr + offs, (_wide(tl.load(dy_ptr + offs, mask=mask)) * d).to(dx_ptr.dtype.element_ty), mask=mask)


# The bias's gradient: the sum of d(x + b) over the rows, in two steps (a column sum over all
# the rows by one program per column block would leave most SMs idle).
@triton.jit
def column_partials_kernel(x_ptr, out_ptr, rows, cols, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[p, c] = the float32 sum of x[r, c] over the ROWS rows r of part p (grid: parts, column blocks)."""
    p = tl.program_id(0)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rs = p.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    m = (rs[:, None] < rows) & (cs[None, :] < cols)
    v = tl.load(x_ptr + rs[:, None] * cols + cs[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + p.to(tl.int64) * cols + cs, tl.sum(v, axis=0).to(out_ptr.dtype.element_ty), mask=cs < cols)


def bias_gelu_unfused(x, b):
    x, b = check_bias_inputs(x, b, "bias_gelu")
    t = torch.empty_like(x)
    if x.numel():
        bias_add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, b, t, x.numel(), x.shape[1], BLOCK_SIZE=BLOCK)
    from kernels.triton.gelu import gelu
    return gelu(t)


def bias_gelu_fused(x, b):
    x, b = check_bias_inputs(x, b, "bias_gelu")
    y = torch.empty_like(x)
    if x.numel():
        bias_gelu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, b, y, x.numel(), x.shape[1], BLOCK_SIZE=BLOCK)
    return y


def bias_gelu_backward(dy, x, b):
    dy, x, b = check_bias_backward_inputs(dy, x, b)
    dx = torch.empty_like(x)
    if x.numel():
        bias_gelu_backward_kernel[(triton.cdiv(x.numel(), BLOCK),)](dy, x, b, dx, x.numel(), x.shape[1],
                                                                   BLOCK_SIZE=BLOCK)
    return dx


VERSIONS = version_index(__doc__, v1=bias_gelu_unfused, v2=bias_gelu_fused)
REFERENCE = "v2"
bias_gelu = VERSIONS[REFERENCE][1]
