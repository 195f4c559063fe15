"""ReLU in Numba: ``@cuda.jit`` kernels and their launchers.

Versions (``VERSIONS``, naive to best; ``relu`` is the reference, v3):

    v1  one thread per element, 256 threads per block                                  relu_v1
    v2  grid-stride loop over a capped grid                                            relu_grid_stride
    v3  four elements per thread, loads before stores (more memory requests in flight)   relu_items

and ``relu_backward(grad_out, x)``: grad_out where x > 0, else 0.

``import utils`` comes first: it decides whether ``numba.cuda`` is the real GPU target or
Numba's CUDA simulator. Tensors reach the kernels through ``utils.to_numba`` (same memory,
no copy), so a kernel's writes land in the torch tensor.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

import utils  # before numba: it picks the simulator or the GPU
from kernels._launch import version_index
from kernels.cuda.relu import relu_backward_input
from utils.inputs import INT32_MAX, check_input, check_same_shape  # noqa: F401  (the shared input rules)

from numba import cuda

BLOCK_SIZE = 256
ZERO = np.float32(0.0)  # a float32 constant: a bare 0.0 would make the comparison float64


@cuda.jit
def relu_kernel(x_ptr, y_ptr, n):
    # cuda.grid(1) is blockIdx.x * blockDim.x + threadIdx.x: this thread's element.
    idx = cuda.grid(1)
    if idx < n:  # the last block may run past the end of the data
        v = x_ptr[idx]
        y_ptr[idx] = v if v > ZERO else ZERO


@cuda.jit
def relu_grid_stride_kernel(x_ptr, y_ptr, n):
    # A capped grid of threads walks the data in strides of the whole grid: each step of
    # the loop, consecutive threads touch consecutive elements (coalesced), and no block
    # is launched only to find it has nothing to do.
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        v = x_ptr[i]
        y_ptr[i] = v if v > ZERO else ZERO


@cuda.jit
def relu_items_kernel(x_ptr, y_ptr, n):
    # Four elements per thread. Block b owns the tile [b * 4 * blockDim, (b + 1) * 4 * blockDim);
    # thread t takes elements t, t + blockDim, t + 2 blockDim and t + 3 blockDim of it, so at
    # each step a warp still reads 32 neighbouring floats (coalesced).
    stride = cuda.blockDim.x
    base = cuda.blockIdx.x * (stride * 4) + cuda.threadIdx.x
    if base + 3 * stride < n:
        # A whole tile: all four loads first, so four memory requests are in flight at once
        # (one thread per element has only one, and waits for it before it can do anything).
        a = x_ptr[base]
        b = x_ptr[base + stride]
        c = x_ptr[base + 2 * stride]
        d = x_ptr[base + 3 * stride]
        y_ptr[base] = a if a > ZERO else ZERO
        y_ptr[base + stride] = b if b > ZERO else ZERO
        y_ptr[base + 2 * stride] = c if c > ZERO else ZERO
        y_ptr[base + 3 * stride] = d if d > ZERO else ZERO
    else:
        # The last tile: check every element against n.
        for k in range(4):
            j = base + k * stride
            if j < n:
                v = x_ptr[j]
                y_ptr[j] = v if v > ZERO else ZERO


@cuda.jit
def relu_backward_kernel(grad_out_ptr, x_ptr, grad_in_ptr, n):
    idx = cuda.grid(1)
    if idx < n:
        grad_in_ptr[idx] = grad_out_ptr[idx] if x_ptr[idx] > ZERO else ZERO



@functools.lru_cache(maxsize=None)
def _max_blocks() -> int:
    """One full wave: as many BLOCK_SIZE-thread blocks as the GPU holds at once."""
    if utils.SIMULATE:
        return 4  # the simulator runs every thread in Python: fewer threads, same work
    props = torch.cuda.get_device_properties(utils.DEVICE)
    per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // BLOCK_SIZE
    return props.multi_processor_count * max(per_sm, 1)


def relu_v1(x: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up."""
    x = check_input(x, op="relu")
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    blocks = math.ceil(n / BLOCK_SIZE)
    relu_kernel[blocks, BLOCK_SIZE](utils.to_numba(x.view(-1)), utils.to_numba(y.view(-1)), n)
    return y


def relu_grid_stride(x: torch.Tensor) -> torch.Tensor:
    """A grid of at most a few blocks per SM; each thread loops over the data."""
    x = check_input(x, op="relu")
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    blocks = max(1, min(math.ceil(n / BLOCK_SIZE), _max_blocks()))
    relu_grid_stride_kernel[blocks, BLOCK_SIZE](utils.to_numba(x.view(-1)), utils.to_numba(y.view(-1)), n)
    return y


def relu_items(x: torch.Tensor) -> torch.Tensor:
    """Four elements per thread, all four loads issued before the stores."""
    x = check_input(x, op="relu")
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    blocks = math.ceil(n / (4 * BLOCK_SIZE))
    relu_items_kernel[blocks, BLOCK_SIZE](utils.to_numba(x.view(-1)), utils.to_numba(y.view(-1)), n)
    return y


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dx of ReLU: grad_out where x > 0, else 0 (new tensor, shape of x)."""
    grad_out, x, grad_in = relu_backward_input(grad_out, x)
    n = x.numel()
    if n == 0:
        return grad_in
    blocks = math.ceil(n / BLOCK_SIZE)
    relu_backward_kernel[blocks, BLOCK_SIZE](utils.to_numba(grad_out.view(-1)), utils.to_numba(x.view(-1)),
                                             utils.to_numba(grad_in.view(-1)), n)
    return grad_in


VERSIONS = version_index(__doc__, v1=relu_v1, v2=relu_grid_stride, v3=relu_items)
REFERENCE = "v3"
relu = VERSIONS[REFERENCE][1]
