"""Bias + GELU (tanh approximation) in Numba, as in ``kernels/cuda/bias_gelu.cu``: v1 a
bias-add kernel then lesson 03's GELU, v2 fused; and the backward d(x + b) = dy * gelu'(x + b).

Versions (``VERSIONS``, naive to best):

    v1  unfused: a bias-add kernel, then lesson 03's GELU (x + b makes a round trip through memory)
    v2  fused: gelu(x + b) in one kernel, x read once and y written once
"""
from __future__ import annotations

import math

import torch

import runtime
from kernels._launch import version_index
from kernels.frames.bias_gelu import THREADS, check_bias_backward_inputs, check_bias_inputs, grid_for

from numba import cuda, float32

K0 = float32(0.7978845608)
K1 = float32(0.044715)
HALF = float32(0.5)
ONE = float32(1.0)
THREE = float32(3.0)


@cuda.jit(device=True)
def gelu_f(z):
    return HALF * z * (ONE + math.tanh(K0 * (z + K1 * z * z * z)))


@cuda.jit(device=True)
def gelu_grad_f(z):
    t = math.tanh(K0 * (z + K1 * z * z * z))
    return HALF * (ONE + t) + HALF * z * (ONE - t * t) * K0 * (ONE + THREE * K1 * z * z)


@cuda.jit
def bias_add_kernel(x, b, t):
    cols = x.shape[1]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        t[i // cols, i % cols] = x[i // cols, i % cols] + b[i % cols]


@cuda.jit
def bias_gelu_kernel(x, b, y):
    cols = x.shape[1]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r, c = i // cols, i % cols
        y[r, c] = gelu_f(x[r, c] + b[c])


@cuda.jit
def bias_gelu_backward_kernel(dy, x, b, dx):
    cols = x.shape[1]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r, c = i // cols, i % cols
        dx[r, c] = dy[r, c] * gelu_grad_f(x[r, c] + b[c])


def _nb(t):
    return runtime.to_numba(t)


def bias_gelu_unfused(x, b):
    x, b = check_bias_inputs(x, b, "bias_gelu")
    t = torch.empty_like(x)
    if x.numel():
        bias_add_kernel[grid_for(x.numel()), THREADS](_nb(x), _nb(b), _nb(t))
    from kernels.numba.gelu import gelu
    return gelu(t)


def bias_gelu_fused(x, b):
    x, b = check_bias_inputs(x, b, "bias_gelu")
    y = torch.empty_like(x)
    if x.numel():
        bias_gelu_kernel[grid_for(x.numel()), THREADS](_nb(x), _nb(b), _nb(y))
    return y


def bias_gelu_backward(dy, x, b):
    dy, x, b = check_bias_backward_inputs(dy, x, b)
    dx = torch.empty_like(x)
    if x.numel():
        bias_gelu_backward_kernel[grid_for(x.numel()), THREADS](_nb(dy), _nb(x), _nb(b), _nb(dx))
    return dx


VERSIONS = version_index(__doc__, v1=bias_gelu_unfused, v2=bias_gelu_fused)
REFERENCE = "v2"
bias_gelu = VERSIONS[REFERENCE][1]
