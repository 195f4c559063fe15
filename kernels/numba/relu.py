"""ReLU in Numba: ``@cuda.jit`` kernels and their launchers.

Versions (``VERSIONS``, naive to best; ``relu`` is the reference, v3):

    v1  one thread per element, 256 threads per block                                  relu_v1
    v2  grid-stride loop over a capped grid                                            relu_grid_stride
    v3  four elements per thread, loads before stores (more memory requests in flight)   relu_items

and ``relu_backward(grad_out, x)``: grad_out where x > 0, else 0.

``import runtime`` comes first: it decides whether ``numba.cuda`` is the real GPU target or
Numba's CUDA simulator. Tensors reach the kernels as they are, through ``runtime.numba_launch``
(a ``NumbaLauncher`` per kernel: the tensor's pointer, shape and strides, no copy and no
device-array wrapper), so a kernel's writes land in the torch tensor.
"""
from __future__ import annotations

import numpy as np
import torch

import runtime  # before numba: it picks the simulator or the GPU
from kernels._launch import capped_grid, cdiv, inputs_and_output, version_index
from kernels.frames.relu import relu_backward_input

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


def items_kernel(f):
    """The kernel ``y[i] = f(x[i])`` with four elements per thread, all four loads issued
    before the stores, for a device function ``f`` of one float32 (relu's v3, gelu's v2)."""
    @cuda.jit
    def kernel(x_ptr, y_ptr, n):
        # Block b owns the tile [b * 4 * blockDim, (b + 1) * 4 * blockDim); thread t takes
        # elements t, t + blockDim, t + 2 blockDim and t + 3 blockDim of it, so at each step a
        # warp still reads 32 neighbouring floats (coalesced).
        stride = cuda.blockDim.x
        base = cuda.blockIdx.x * (stride * 4) + cuda.threadIdx.x
        if base + 3 * stride < n:
            # A whole tile: all four loads first, so four memory requests are in flight at once
            # (one thread per element has only one, and waits for it before it can do anything).
            a = x_ptr[base]
            b = x_ptr[base + stride]
            c = x_ptr[base + 2 * stride]
            d = x_ptr[base + 3 * stride]
            y_ptr[base] = f(a)
            y_ptr[base + stride] = f(b)
            y_ptr[base + 2 * stride] = f(c)
            y_ptr[base + 3 * stride] = f(d)
        else:
            # The last tile: check every element against n.
            for k in range(4):
                j = base + k * stride
                if j < n:
                    y_ptr[j] = f(x_ptr[j])
    return kernel


@cuda.jit(device=True)
def relu_scalar(v):
    return v if v > ZERO else ZERO


relu_items_kernel = items_kernel(relu_scalar)


@cuda.jit
def relu_backward_kernel(grad_out_ptr, x_ptr, grad_in_ptr, n):
    idx = cuda.grid(1)
    if idx < n:
        grad_in_ptr[idx] = grad_out_ptr[idx] if x_ptr[idx] > ZERO else ZERO


def launch_map(kernel, x: torch.Tensor, op: str, items_per_thread: int = 1, max_numel=None) -> torch.Tensor:
    """y = kernel(x) for a kernel ``(x_ptr, y_ptr, n)`` that maps ``items_per_thread`` elements
    per thread, BLOCK_SIZE threads per block, the grid rounded up (relu's and gelu's)."""
    x, y = inputs_and_output(x, op=op, max_numel=max_numel)
    n = x.numel()
    if n:  # a grid of zero blocks is not a launch
        runtime.numba_launch(kernel, cdiv(n, items_per_thread * BLOCK_SIZE), BLOCK_SIZE, x.view(-1), y.view(-1), n)
    return y


def relu_v1(x: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up."""
    return launch_map(relu_kernel, x, "relu")


def relu_grid_stride(x: torch.Tensor) -> torch.Tensor:
    """A grid of at most one full wave of blocks; each thread loops over the data."""
    x, y = inputs_and_output(x, op="relu")
    n = x.numel()
    if n:
        runtime.numba_launch(relu_grid_stride_kernel, capped_grid(n, BLOCK_SIZE), BLOCK_SIZE, x.view(-1), y.view(-1), n)
    return y


def relu_items(x: torch.Tensor) -> torch.Tensor:
    """Four elements per thread, all four loads issued before the stores."""
    return launch_map(relu_items_kernel, x, "relu", 4)


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dx of ReLU: grad_out where x > 0, else 0 (new tensor, shape of x)."""
    grad_out, x, grad_in = relu_backward_input(grad_out, x)
    n = x.numel()
    if n:
        runtime.numba_launch(relu_backward_kernel, cdiv(n, BLOCK_SIZE), BLOCK_SIZE, grad_out.view(-1), x.view(-1),
                             grad_in.view(-1), n)
    return grad_in


VERSIONS = version_index(__doc__, v1=relu_v1, v2=relu_grid_stride, v3=relu_items)
REFERENCE = "v3"
relu = VERSIONS[REFERENCE][1]
