"""Access and branch patterns in CUDA C++ (``patterns.cu``): one kernel per thing the
hardware counts (coalescing, bank conflicts, divergence, atomics).

    kernel("copy_strided_kernel")[grid, block](x, y, n, 32)

``benchmarks/simulators/ncu_patterns.py`` lists how each one is launched and what it should show.
"""
from __future__ import annotations

import runtime
from kernels._launch import cuda_kernels, cuda_source

SOURCE = runtime.KERNELS_DIR / "cuda" / "patterns.cu"
TILE = 32          # patterns.cu's TILE: a transpose block covers a 32 x 32 tile
TILE_ROWS = 8      # ... with 32 x 8 threads
REDUCE_BLOCK = 256  # patterns.cu's REDUCE_BLOCK: reduce_strided_index_kernel's block size


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str) -> str:
    """The text of one kernel of patterns.cu with its comment block."""
    return cuda_source(name, SOURCE)
