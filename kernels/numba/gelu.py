"""GELU (tanh approximation) in Numba (``numba.cuda.jit``).

    gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

Versions (``VERSIONS``, naive to best):

    v1  one thread per element
    v2  4 elements per thread (coalesced, 4 loads in flight)
        a block's 4 loads spaced blockDim apart (still coalesced) and issued before any
        store, so each thread has 4 loads in flight

On a GPU they run for real; in simulation in Numba's CUDA simulator (``import utils``
chooses before numba is imported).
"""
from __future__ import annotations

import math

import numpy as np

import utils  # must come before numba: it picks the GPU or the simulator
from kernels._launch import cdiv, elementwise_io, version_index
from kernels.cuda.gelu import BASELINES, INT32_MAX, gelu_compiled, gelu_ref, gelu_torch, gelu_unfused_torch  # noqa: F401  (the baselines)

from numba import cuda

THREADS_PER_BLOCK = 256
#: Elements per thread in v2 (its kernel is written out for 4).
ITEMS = 4

# float32 constants: a plain Python float would make Numba compute in float64 (slower,
# and tanh would become the double-precision one).
SQRT_2_OVER_PI = np.float32(0.7978845608)
COEFF = np.float32(0.044715)
HALF = np.float32(0.5)
ONE = np.float32(1.0)


@cuda.jit(device=True)
def gelu_scalar(x):
    u = SQRT_2_OVER_PI * (x + COEFF * x * x * x)
    return HALF * x * (ONE + math.tanh(u))


# v1: one thread per element.
@cuda.jit
def gelu_kernel(x, y, n):
    i = cuda.grid(1)
    if i < n:  # the last block may stick out past the end
        y[i] = gelu_scalar(x[i])


# v2: four elements per thread.
@cuda.jit
def gelu_items_kernel(x, y, n):
    # Block b owns the tile [b * 4 * blockDim, (b + 1) * 4 * blockDim). Thread t takes
    # elements t, t + blockDim, t + 2 blockDim, t + 3 blockDim of it: at each of the 4
    # steps, a warp reads 32 neighbouring floats (coalesced).
    stride = cuda.blockDim.x
    base = cuda.blockIdx.x * (stride * 4) + cuda.threadIdx.x
    if base + 3 * stride < n:
        # Whole tile: all 4 loads first, then the math and the stores, so that the 4
        # memory requests are in flight at the same time.
        a = x[base]
        b = x[base + stride]
        c = x[base + 2 * stride]
        d = x[base + 3 * stride]
        y[base] = gelu_scalar(a)
        y[base + stride] = gelu_scalar(b)
        y[base + 2 * stride] = gelu_scalar(c)
        y[base + 3 * stride] = gelu_scalar(d)
    else:
        # Last tile: check every element against n.
        for k in range(4):
            j = base + k * stride
            if j < n:
                y[j] = gelu_scalar(x[j])


def _launch(kernel, x, items_per_thread, who):
    x, y = elementwise_io(x, op=who, max_numel=INT32_MAX)
    n = x.numel()
    if n:  # a launch with zero blocks is an error
        blocks = cdiv(n, THREADS_PER_BLOCK * items_per_thread)
        # Flat views: the kernels index a 1-D array (same memory as x and y).
        kernel[blocks, THREADS_PER_BLOCK](utils.to_numba(x.view(-1)), utils.to_numba(y.view(-1)), n)
    return y


def gelu_v1(x):
    """v1: one thread per element."""
    return _launch(gelu_kernel, x, 1, "gelu_v1")


def gelu_v2(x):
    """v2: 4 elements per thread, loads issued before stores."""
    return _launch(gelu_items_kernel, x, ITEMS, "gelu_v2")


gelu = gelu_v2

VERSIONS = version_index(__doc__, v1=gelu_v1, v2=gelu_v2)
REFERENCE = "v2"
