"""Vector and matrix addition in CUDA C++: launchers for the kernels of ``add.cu``, whose header
lists the versions.

    add(x, y)       the reference launcher (v2), any shape, same shapes
    add_v1(x, y)    v1
    add_2d(x, y)    2-D matrices, a 2-D grid of 32 x 8 blocks, row strides passed in

Kernels compile on first use (NVRTC on a GPU, the course's emulator on a CPU) and are
cached, so every launcher is self-contained: sizes come from its inputs, nothing else.
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import capped_grid, cdiv, cuda_kernels, inputs_and_output, version_index
from kernels.frames.add import (  # the frame: input rules and reference, shared by the three languages
    MAX_GRID_Y,  # noqa: F401  (importable from here too)
    NO_BROADCAST,  # noqa: F401
    add_2d_input,
    add_ref,  # noqa: F401
    check_grid_rows,
)
from runtime.inputs import INT32_MAX

SOURCE = runtime.KERNELS_DIR / "cuda" / "add.cu"
BLOCK_SIZE = 256
#: 2-D blocks: 32 threads along a row (one warp: a coalesced access), 8 rows.
BLOCK_2D = (32, 8)


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def add_v1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up to whole blocks."""
    # The kernel reads x_ptr[idx] (an int): elements one after the other in memory, at most 2^31 - 1.
    x, y, out = inputs_and_output(x, y, op="add", max_numel=INT32_MAX)
    n = x.numel()
    if n:  # a grid of zero blocks is not a launch
        kernel("add_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, out, n)
    return out


def add_grid_stride(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A grid of at most 16 blocks per SM; each thread loops over the data."""
    x, y, out = inputs_and_output(x, y, op="add")
    n = x.numel()
    if n:
        kernel("add_grid_stride_kernel")[capped_grid(n, BLOCK_SIZE, 16), BLOCK_SIZE](x, y, out, n)
    return out


def add_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Matrix addition with a 2-D grid: thread (col, row) adds one element.

    Views whose columns are adjacent (``m[:, 2:5]``, ``m[1::2]``) are read in place through
    their row stride; any other layout (a transpose) is copied to a contiguous one first.
    """
    x, y, out = add_2d_input(x, y)
    rows, cols = x.shape
    if x.numel() == 0:
        return out
    # The kernel assumes neighbouring columns are neighbouring floats (stride 1); a row
    # stride of at least `cols` (rows do not overlap) is read as it is.
    x = x if x.stride(1) == 1 and x.stride(0) >= cols else x.contiguous()
    y = y if y.stride(1) == 1 and y.stride(0) >= cols else y.contiguous()
    bx, by = BLOCK_2D
    grid = (cdiv(cols, bx), cdiv(rows, by))
    check_grid_rows(rows, grid[1])
    if max(rows, cols, x.stride(0), y.stride(0)) > INT32_MAX:
        raise ValueError("add_2d_kernel takes int sizes and strides: the matrix is too large")
    kernel("add_2d_kernel")[grid, BLOCK_2D](_span(x), _span(y), out, rows, cols,
                                            x.stride(0), y.stride(0), out.stride(0))
    return out


def _span(m: torch.Tensor) -> torch.Tensor:
    """The memory a row-strided matrix covers, as a 1-D contiguous view of the same storage.

    A kernel receives a pointer to the first element; from there, rows start every
    ``stride(0)`` floats. Passing this span (rather than a non-contiguous 2-D view) tells
    the loader, and the emulator's bounds checks, exactly how far the kernel may read.
    """
    if m.is_contiguous():
        return m
    rows, cols = m.shape
    return m.as_strided(((rows - 1) * m.stride(0) + cols,), (1,))


VERSIONS = version_index(SOURCE, v1=add_v1, v2=add_grid_stride)
REFERENCE = "v2"
add = VERSIONS[REFERENCE][1]
