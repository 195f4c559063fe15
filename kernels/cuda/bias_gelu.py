"""Bias + GELU (tanh approximation) in CUDA C++: launchers for ``bias_gelu.cu``.

    bias_gelu(x, b)                 the reference (v2): gelu(x + b) in one kernel
    bias_gelu_unfused(x, b)         v1: a bias-add kernel, then lesson 03's GELU kernel
    bias_gelu_backward(dy, x, b)    d(x + b) = dy * gelu'(x + b)

``x`` and ``dy`` are 2-D float32 (rows, cols), ``b`` float32 (cols,).
"""
from __future__ import annotations

import functools
import math

import torch

import runtime
from kernels._launch import version_index
from runtime.inputs import INT32_MAX, check_input, check_tensor  # noqa: F401  (the shared input rules)

SOURCE = runtime.KERNELS_DIR / "cuda" / "bias_gelu.cu"
THREADS = 64 if runtime.SIMULATE else 256
MAX_BLOCKS = 8 if runtime.SIMULATE else 132 * 16


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return runtime.cuda_kernel(SOURCE, name)


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


def bias_gelu_unfused(x, b):
    """v1: t = x + b (one kernel, t written to memory), then GELU(t) with lesson 03's kernel."""
    x, b = check_bias_inputs(x, b, "bias_gelu")
    t = torch.empty_like(x)
    if x.numel():
        kernel("bias_add_kernel")[grid_for(x.numel()), THREADS](x, b, t, x.numel(), x.shape[1])
    from kernels.cuda.gelu import gelu
    return gelu(t)


def bias_gelu_fused(x, b):
    """v2: gelu(x + b) in one kernel: x read once, y written once."""
    x, b = check_bias_inputs(x, b, "bias_gelu")
    y = torch.empty_like(x)
    if x.numel():
        kernel("bias_gelu_kernel")[grid_for(x.numel()), THREADS](x, b, y, x.numel(), x.shape[1])
    return y


def bias_gelu_backward(dy, x, b):
    """d(x + b) = dy * gelu'(x + b), one kernel (the bias gradient is its sum over rows)."""
    dy, x, b = check_bias_backward_inputs(dy, x, b)
    dx = torch.empty_like(x)
    if x.numel():
        kernel("bias_gelu_backward_kernel")[grid_for(x.numel()), THREADS](dy, x, b, dx, x.numel(), x.shape[1])
    return dx


VERSIONS = version_index(SOURCE, v1=bias_gelu_unfused, v2=bias_gelu_fused)
REFERENCE = "v2"
bias_gelu = VERSIONS[REFERENCE][1]


def bias_gelu_ref(x, b):
    return torch.nn.functional.gelu(x.double() + b.double(), approximate="tanh")


def bias_gelu_backward_ref(dy, x, b):
    z = (x.double() + b.double()).requires_grad_(True)
    torch.nn.functional.gelu(z, approximate="tanh").backward(dy.double())
    return z.grad


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
