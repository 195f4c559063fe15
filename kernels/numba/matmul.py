"""Matrix multiplication C = A @ B in Numba (``numba.cuda.jit``).

Versions (``VERSIONS``, naive to best; ``matmul`` is the reference, v2):

    v1  naive: one thread per output                                                 matmul_naive
    v2  shared-memory tiles: 16 x 16 tiles of A and B, each loaded once per block   matmul_tiled

Both take float32 A (M, K) and B (K, N) on ``runtime.DEVICE`` and return a new float32 C.
In simulation every CUDA thread is a Python thread: keep the matrices small there
(``runtime.SIZES``); the tiles are 16 x 16 so a block is 256 threads.
"""
from __future__ import annotations

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index
from kernels.frames.matmul import matmul_ref, prepare_operands  # noqa: F401  (the shared input rules and reference)

from numba import cuda, float32

#: Tile edge of v2: a compile-time constant, since cuda.shared.array needs a fixed shape.
TILE = 16


@cuda.jit
def matmul_naive_kernel(a, b, c):
    col, row = cuda.grid(2)  # x along a row of C: a warp reads 32 neighbouring floats of B
    M, K = a.shape
    N = b.shape[1]
    if row < M and col < N:
        acc = float32(0.0)
        for k in range(K):
            acc += a[row, k] * b[k, col]
        c[row, col] = acc


@cuda.jit
def matmul_tiled_kernel(a, b, c):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, K = a.shape
    N = b.shape[1]
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # Out-of-range elements are loaded as 0: they add nothing to the sums.
        a_tile[ty, tx] = a[row, k0 + tx] if row < M and k0 + tx < K else float32(0.0)
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < K and col < N else float32(0.0)
        cuda.syncthreads()  # both tiles are complete before anyone reads them
        for k in range(TILE):
            acc += a_tile[ty, k] * b_tile[k, tx]
        cuda.syncthreads()  # everyone is done before the next step overwrites the tiles
    if row < M and col < N:
        c[row, col] = acc


def matmul_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element of C, blocks of 16 x 16 threads."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_naive")
    if c.numel() and K:
        matmul_naive_kernel[(cdiv(N, 16), cdiv(M, 16)), (16, 16)](
            runtime.to_numba(a), runtime.to_numba(b), runtime.to_numba(c))
    return c


def matmul_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: TILE x TILE threads per block, tiles of A and B staged in shared memory."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_tiled")
    if c.numel() and K:
        runtime.numba_launch(matmul_tiled_kernel, (cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE), a, b, c)
    return c


VERSIONS = version_index(__doc__, v1=matmul_naive, v2=matmul_tiled)
REFERENCE = "v2"
matmul = VERSIONS[REFERENCE][1]
