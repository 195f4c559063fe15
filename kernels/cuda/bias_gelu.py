"""Bias + GELU (tanh approximation) in CUDA C++: launchers for ``bias_gelu.cu``.

    bias_gelu(x, b)                 the reference (v2): gelu(x + b) in one kernel
    bias_gelu_unfused(x, b)         v1: a bias-add kernel, then lesson 03's GELU kernel
    bias_gelu_backward(dy, x, b)    d(x + b) = dy * gelu'(x + b)

``x`` and ``dy`` are 2-D float32 (rows, cols), ``b`` float32 (cols,).
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, version_index
from kernels.frames.bias_gelu import (  # the frame: input rules and references, shared by the three languages
    MAX_BLOCKS,
    SQRT_2_OVER_PI,  # noqa: F401
    THREADS,
    bias_gelu_backward_ref,  # noqa: F401
    bias_gelu_ref,  # noqa: F401
    check_bias_backward_inputs,
    check_bias_inputs,
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "bias_gelu.cu"


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


#: Rows a thread loads before computing (BG_ROWS in bias_gelu.cu).
BG_ROWS = 4


def grid_2d(rows, cols):
    """x: blocks across the columns; y: enough blocks down the groups of BG_ROWS rows for about
    MAX_BLOCKS in all (each loops over groups gridDim.y apart; a grid's y is at most 65535)."""
    across = cdiv(cols, THREADS)
    return (across, max(1, min(cdiv(rows, BG_ROWS), 65535, MAX_BLOCKS // across)))


def bias_gelu_unfused(x, b):
    """v1: t = x + b (one kernel, t written to memory), then GELU(t) with lesson 03's kernel."""
    x, b = check_bias_inputs(x, b, "bias_gelu")
    t = torch.empty_like(x)
    if x.numel():
        kernel("bias_add_kernel")[grid_2d(*x.shape), THREADS](x, b, t, *x.shape)
    from kernels.cuda.gelu import gelu
    return gelu(t)


def bias_gelu_fused(x, b):
    """v2: gelu(x + b) in one kernel: x read once, y written once."""
    x, b = check_bias_inputs(x, b, "bias_gelu")
    y = torch.empty_like(x)
    if x.numel():
        kernel("bias_gelu_kernel")[grid_2d(*x.shape), THREADS](x, b, y, *x.shape)
    return y


def bias_gelu_backward(dy, x, b):
    """d(x + b) = dy * gelu'(x + b), one kernel (the bias gradient is its sum over rows)."""
    dy, x, b = check_bias_backward_inputs(dy, x, b)
    dx = torch.empty_like(x)
    if x.numel():
        kernel("bias_gelu_backward_kernel")[grid_2d(*x.shape), THREADS](dy, x, b, dx, *x.shape)
    return dx


VERSIONS = version_index(SOURCE, v1=bias_gelu_unfused, v2=bias_gelu_fused)
REFERENCE = "v2"
bias_gelu = VERSIONS[REFERENCE][1]
