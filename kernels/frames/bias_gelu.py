"""Bias + GELU's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules,
the block size and grid of the CUDA C++ and Numba kernels, and the PyTorch references.

    check_bias_inputs(x, b, op)              x 2-D float32 (rows, cols), b (cols,), or a clear error
    check_bias_backward_inputs(dy, x, b)     the same, and dy of x's shape
    THREADS, grid_for(n)                     threads per block, and the blocks of a grid-stride loop
    bias_gelu_ref, bias_gelu_backward_ref    gelu(x + b) in float64, and its gradient by autograd
"""
from __future__ import annotations

import math

import torch

import runtime
from runtime.inputs import INT32_MAX, check_input  # the shared input rules

THREADS = 64 if runtime.SIMULATE else 256
MAX_BLOCKS = 8 if runtime.SIMULATE else 132 * 16


def grid_for(n):
    return max(1, min((n + THREADS - 1) // THREADS, MAX_BLOCKS))


def check_bias_inputs(x, b, op, name="x"):
    x = check_input(x, name, ndim=2, max_numel=INT32_MAX, op=op)
    b = check_input(b, "b", ndim=1, op=op)
    if b.shape[0] != x.shape[1]:
        raise ValueError(f"{op}: b must have shape ({x.shape[1]},), one value per column of {name}, "
                         f"got {tuple(b.shape)}")
    return x, b


def check_bias_backward_inputs(dy, x, b, op="bias_gelu_backward"):
    x, b = check_bias_inputs(x, b, op)
    dy = check_input(dy, "dy", ndim=2, op=op)
    if dy.shape != x.shape:
        raise ValueError(f"{op}: dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    return dy, x, b


def bias_gelu_ref(x, b):
    return torch.nn.functional.gelu(x.double() + b.double(), approximate="tanh")


def bias_gelu_backward_ref(dy, x, b):
    z = (x.double() + b.double()).requires_grad_(True)
    torch.nn.functional.gelu(z, approximate="tanh").backward(dy.double())
    return z.grad


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
