"""Vector and matrix addition in Numba: ``@cuda.jit`` kernels and their launchers.

Versions (``VERSIONS``, naive to best; ``add`` is the reference, v2, any shape):

    v1  one thread per element, 256 threads per block   add_v1
    v2  grid-stride loop over a capped grid             add_grid_stride

and ``add_2d(x, y)``: 2-D matrices, a 2-D grid of 32 x 8 blocks.

``import runtime`` comes first: it decides whether ``numba.cuda`` is the real GPU target or
Numba's CUDA simulator. Tensors reach the kernels through ``runtime.to_numba`` (same memory,
no copy), so a kernel's writes land in the torch tensor.
"""
from __future__ import annotations

import torch

import runtime  # (before numba: it picks the simulator or the GPU)
from kernels._launch import capped_grid, cdiv, inputs_and_output, version_index
from kernels.frames.add import add_2d_input, check_grid_rows  # the shared input rules

from numba import cuda

BLOCK_SIZE = 256
BLOCK_2D = (32, 8)  # 32 threads along a row (a warp: coalesced), 8 rows


@cuda.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n):
    # The same arithmetic as CUDA C++: cuda.grid(1) is a shortcut for it.
    idx = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if idx < n:  # the tail block has threads past the end of the data
        out_ptr[idx] = x_ptr[idx] + y_ptr[idx]


@cuda.jit
def add_grid_stride_kernel(x_ptr, y_ptr, out_ptr, n):
    # A capped grid walks the data in steps of the whole grid: correct for any grid size,
    # and in every step consecutive threads touch consecutive elements (coalesced).
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        out_ptr[i] = x_ptr[i] + y_ptr[i]


@cuda.jit
def add_2d_kernel(x, y, out):
    # cuda.grid(2) returns (x, y) = (column, row): x moves fastest, so a warp's 32 threads
    # read 32 neighbouring floats of one row. Numba arrays carry their shape and strides,
    # so x[row, col] does the row-stride arithmetic that CUDA C++ writes by hand.
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = x[row, col] + y[row, col]


def _flat(t: torch.Tensor):
    return runtime.to_numba(t.view(-1))


def add_v1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up to whole blocks."""
    x, y, out = inputs_and_output(x, y, op="add")
    n = out.numel()
    if n:  # a grid of zero blocks is not a launch
        add_kernel[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](_flat(x), _flat(y), _flat(out), n)
    return out


def add_grid_stride(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A grid of at most 16 blocks per SM; each thread loops over the data."""
    x, y, out = inputs_and_output(x, y, op="add")
    n = out.numel()
    if n:
        add_grid_stride_kernel[capped_grid(n, BLOCK_SIZE, 16), BLOCK_SIZE](_flat(x), _flat(y), _flat(out), n)
    return out


def add_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Matrix addition with a 2-D grid: thread (col, row) adds one element.

    Strided views are copied to contiguous matrices first: Numba's simulator moves whole
    buffers, and one code path for both modes keeps the results the same.
    """
    x, y, out = add_2d_input(x, y)
    rows, cols = x.shape
    if out.numel() == 0:
        return out
    bx, by = BLOCK_2D
    grid = (cdiv(cols, bx), cdiv(rows, by))
    check_grid_rows(rows, grid[1])
    add_2d_kernel[grid, BLOCK_2D](runtime.to_numba(x.contiguous()), runtime.to_numba(y.contiguous()),
                                  runtime.to_numba(out))
    return out


VERSIONS = version_index(__doc__, v1=add_v1, v2=add_grid_stride)
REFERENCE = "v2"
add = VERSIONS[REFERENCE][1]
