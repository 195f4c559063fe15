"""GELU (tanh approximation) in Numba (``numba.cuda.jit``).

    gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

Versions (``VERSIONS``, naive to best):

    v1  one thread per element
    v2  4 elements per thread (coalesced, 4 loads in flight)
        a block's 4 loads spaced blockDim apart (still coalesced) and issued before any
        store, so each thread has 4 loads in flight

On a GPU they run for real; in simulation in Numba's CUDA simulator (``import runtime``
chooses before numba is imported).
"""
from __future__ import annotations

import math

import numpy as np

import runtime  # noqa: F401  (must come before numba: it picks the GPU or the simulator)
from kernels._launch import version_index
from kernels.frames.gelu import BASELINES, gelu_compiled, gelu_ref, gelu_torch, gelu_unfused_torch  # noqa: F401  (the baselines)
from kernels.numba.relu import items_kernel, launch_map  # 256 threads per block
from runtime.inputs import INT32_MAX

from numba import cuda

#: Elements per thread in v2 (relu's items_kernel, written out for 4).
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


# v2: four elements per thread, loads before stores: relu's v3 with gelu_scalar.
gelu_items_kernel = items_kernel(gelu_scalar)


def gelu_v1(x):
    """v1: one thread per element."""
    return launch_map(gelu_kernel, x, "gelu_v1", max_numel=INT32_MAX)


def gelu_v2(x):
    """v2: 4 elements per thread, loads issued before stores."""
    return launch_map(gelu_items_kernel, x, "gelu_v2", ITEMS, max_numel=INT32_MAX)


gelu = gelu_v2

VERSIONS = version_index(__doc__, v1=gelu_v1, v2=gelu_v2)
REFERENCE = "v2"
