"""Vector and matrix addition in Triton: ``@triton.jit`` kernels and their launchers.

Versions (``VERSIONS``; ``add`` is the reference, v1, any shape):

    v1  1024 elements per program, 4 warps   add_v1
    v2  4096 elements per program, 8 warps   add_v2

and ``add_2d(x, y)``: 2-D matrices, each program adds one 16 x 128 tile.

There is no per-thread view in Triton. A *program* (one per ``program_id``) owns a whole
block of indices, built with ``tl.arange``; a mask switches off the indices past the end.
Triton itself spreads the block over the threads of the program (``num_warps`` warps).
"""
from __future__ import annotations

import torch

import runtime  # (before triton: it switches on the interpreter in simulation)
from kernels._launch import inputs_and_output, version_index
from kernels.frames.add import add_2d_input  # the shared input rules

import triton
import triton.language as tl

MAX_GRID_Y = runtime.config.MAX_GRID[1]  # the limit on the second grid dimension (program_id(1))


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)                      # which block of indices is ours
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n                               # the tail block runs past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_2d_kernel(x_ptr, y_ptr, out_ptr, rows, cols,
                  stride_xr, stride_xc, stride_yr, stride_yc, stride_or, stride_oc,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # A 2-D grid of programs; each owns a BLOCK_R x BLOCK_C tile of the matrix.
    pid_r = tl.program_id(axis=0)
    pid_c = tl.program_id(axis=1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)      # the tile's rows    (BLOCK_R,)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)      # the tile's columns (BLOCK_C,)
    # Broadcasting a column of rows against a row of columns gives the tile's 2-D indices;
    # the strides turn (row, col) into an offset, so strided views work as they are.
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask=mask)
    y = tl.load(y_ptr + r[:, None] * stride_yr + c[None, :] * stride_yc, mask=mask)
    tl.store(out_ptr + r[:, None] * stride_or + c[None, :] * stride_oc, x + y, mask=mask)


def _launch(x: torch.Tensor, y: torch.Tensor, block_size: int, num_warps: int) -> torch.Tensor:
    # offsets index memory directly: inputs_and_output gives contiguous x and y
    x, y, out = inputs_and_output(x, y, op="add")
    n = out.numel()
    if n:  # an empty grid is not a launch
        add_kernel[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps)
    return out


def add_v1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1024 elements per program, 4 warps: 8 elements per thread."""
    return _launch(x, y, 1024, 4)


def add_v2(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """4096 elements per program, 8 warps: fewer, bigger programs."""
    return _launch(x, y, 4096, 8)


def add_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Matrix addition: a 2-D grid of programs, each one 16 x 128 tile; any strides."""
    x, y, out = add_2d_input(x, y)
    rows, cols = x.shape
    if out.numel() == 0:
        return out
    block_r, block_c = 16, 128
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"{cols} columns need {grid[1]} programs along axis 1, more than "
                         f"{MAX_GRID_Y}: use add() on the flattened tensors instead")
    add_2d_kernel[grid](x, y, out, rows, cols,
                        x.stride(0), x.stride(1), y.stride(0), y.stride(1), out.stride(0), out.stride(1),
                        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return out


VERSIONS = version_index(__doc__, v1=add_v1, v2=add_v2)
REFERENCE = "v1"
add = VERSIONS[REFERENCE][1]
