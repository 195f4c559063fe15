"""Reductions in Numba (``numba.cuda.jit``): the sum of a vector and the max of each row.

The same path as the CUDA C++ versions, with Numba's names: ``cuda.shared.array`` for
``__shared__``, ``cuda.syncthreads()`` for ``__syncthreads()``, ``cuda.atomic.add`` for
``atomicAdd`` and ``cuda.shfl_down_sync`` for ``__shfl_down_sync``.

Versions of ``sum`` (``VERSIONS``, naive to best; ``sum`` is the reference, v5):

    v1  cuda.atomic.add per element (non-deterministic)
    v2  shared-memory tree, interleaved addressing, atomic per block (non-deterministic)
    v3  shared-memory tree, sequential addressing, atomic per block (non-deterministic)
    v4  warp-shuffle block reduction, atomic per block (non-deterministic)
    v5  grid-stride + warp shuffles, two passes (deterministic)

and ``row_max(x)``: the max of each row of a 2-D tensor, one block per row. The module also
holds the reductions whose result every thread gets (``block_sum_all``, ...), which the
softmax, layernorm and attention kernels use.

In simulation every CUDA thread is a Python thread, so blocks are small there (64
threads) and the grid-stride version launches only a few blocks.
"""
from __future__ import annotations

import math

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index, whole_warps
from kernels.frames.reduction import num_blocks_grid_stride, row_max_frame, row_max_ref, sum_frame, sum_ref  # noqa: F401  (the references, defined once)

from numba import cuda, float32

#: Threads per block, a power of two and a multiple of 32. Shared arrays need their size
#: at compile time, so it is a module constant.
BLOCK_SIZE = 64 if runtime.SIMULATE else 256
FULL_MASK = 0xFFFFFFFF



# ---------------------------------------------------------------------------------------
@cuda.jit
def sum_atomic_kernel(x, out):
    """v1: one atomic add per element (right, but every thread hits the same address)."""
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])


@cuda.jit
def sum_interleaved_kernel(x, out):
    """v2: shared-memory tree, interleaved addressing, one atomic per block."""
    sdata = cuda.shared.array(BLOCK_SIZE, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    sdata[t] = x[i] if i < x.size else float32(0.0)  # 0 past the end: the identity of +
    cuda.syncthreads()  # every element is in shared memory before anyone reads a neighbour's
    s = 1
    while s < cuda.blockDim.x:
        if t % (2 * s) == 0:
            sdata[t] += sdata[t + s]
        cuda.syncthreads()  # step s is done before step 2s reads its sums
        s *= 2
    if t == 0:
        cuda.atomic.add(out, 0, sdata[0])


@cuda.jit
def sum_sequential_kernel(x, out):
    """v3: shared-memory tree, sequential addressing (the first s threads work)."""
    sdata = cuda.shared.array(BLOCK_SIZE, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    sdata[t] = x[i] if i < x.size else float32(0.0)
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            sdata[t] += sdata[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        cuda.atomic.add(out, 0, sdata[0])


@cuda.jit(device=True)
def warp_sum(v):
    """Lane 0 ends with the sum of the warp's 32 values."""
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL_MASK, v, offset)
        offset //= 2
    return v


@cuda.jit(device=True)
def warp_max(v):
    offset = 16
    while offset > 0:
        v = max(v, cuda.shfl_down_sync(FULL_MASK, v, offset))
        offset //= 2
    return v


@cuda.jit(device=True)
def block_sum(v, scratch):
    """Warp sums, one partial per warp in shared memory, then warp 0 sums those.

    The result is valid in thread 0. ``scratch`` is a shared array of 32 floats.
    """
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    v = warp_sum(v)
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()  # all partials written before warp 0 reads them
    if warp == 0:
        v = scratch[lane] if lane < cuda.blockDim.x // 32 else float32(0.0)
        v = warp_sum(v)
    return v


@cuda.jit(device=True)
def block_max(v, scratch):
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    v = warp_max(v)
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()
    if warp == 0:
        v = scratch[lane] if lane < cuda.blockDim.x // 32 else float32(-math.inf)
        v = warp_max(v)
    return v


# ---------------------------------------------------------------------------------------
# Reductions whose result every thread gets, for the row kernels of softmax, layernorm and
# attention (blockDim.x a multiple of 32, ``scratch`` a shared array of 32 floats). Butterfly
# shuffles (``shfl_xor_sync``) leave the warp's value in every lane. The barriers are those of
# lesson 09: the first keeps a second call from overwriting scratch while a slow warp still
# reads the first call's result (and publishes shared memory the caller wrote before the
# call), the second publishes the warps' partials.
@cuda.jit(device=True)
def warp_sum_all(v):
    offset = 16
    while offset > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, offset)  # butterfly: every lane gets the sum
        offset //= 2
    return v


@cuda.jit(device=True)
def warp_max_all(v):
    offset = 16
    while offset > 0:
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, offset))
        offset //= 2
    return v


@cuda.jit(device=True)
def block_sum_all(v, scratch):
    lane = cuda.threadIdx.x % 32
    v = warp_sum_all(v)
    cuda.syncthreads()  # the previous call's readers are done with scratch
    if lane == 0:
        scratch[cuda.threadIdx.x // 32] = v
    cuda.syncthreads()  # every warp's partial is written before anyone reads them
    v = scratch[lane] if lane < cuda.blockDim.x // 32 else float32(0.0)
    return warp_sum_all(v)


@cuda.jit(device=True)
def block_max_all(v, scratch):
    lane = cuda.threadIdx.x % 32
    v = warp_max_all(v)
    cuda.syncthreads()  # the previous call's readers are done with scratch
    if lane == 0:
        scratch[cuda.threadIdx.x // 32] = v
    cuda.syncthreads()
    v = scratch[lane] if lane < cuda.blockDim.x // 32 else float32(-math.inf)
    return warp_max_all(v)


@cuda.jit
def sum_warp_kernel(x, out):
    """v4: one element per thread, warp-shuffle block reduction, one atomic per block."""
    scratch = cuda.shared.array(32, float32)
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0.0)
    v = block_sum(v, scratch)
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out, 0, v)


@cuda.jit
def sum_partials_kernel(x, partials):
    """v5, pass 1: grid-stride loop in registers, then one partial per block (no atomics)."""
    scratch = cuda.shared.array(32, float32)
    acc = float32(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        acc += x[i]
    acc = block_sum(acc, scratch)
    if cuda.threadIdx.x == 0:
        partials[cuda.blockIdx.x] = acc


@cuda.jit
def sum_final_kernel(partials, out):
    """v5, pass 2: one block sums the partials."""
    scratch = cuda.shared.array(32, float32)
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, partials.size, cuda.blockDim.x):
        acc += partials[i]
    acc = block_sum(acc, scratch)
    if cuda.threadIdx.x == 0:
        out[0] = acc


@cuda.jit
def row_max_kernel(x, out):
    """One block per row of the 2-D array x: running max over the columns, then block_max."""
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    m = float32(-math.inf)
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        m = max(m, x[row, c])
    m = block_max(m, scratch)
    if cuda.threadIdx.x == 0:
        out[row] = m


# ---------------------------------------------------------------------------------------
def _launch_per_element(kernel, x: torch.Tensor) -> torch.Tensor:
    def launch(x, out, n):
        kernel[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](runtime.to_numba(x), runtime.to_numba(out.view(1)))
    return sum_frame(x, launch)


def sum_atomic(x: torch.Tensor) -> torch.Tensor:
    """v1: cuda.atomic.add per element."""
    return _launch_per_element(sum_atomic_kernel, x)


def sum_interleaved(x: torch.Tensor) -> torch.Tensor:
    """v2: shared-memory tree, interleaved addressing."""
    return _launch_per_element(sum_interleaved_kernel, x)


def sum_sequential(x: torch.Tensor) -> torch.Tensor:
    """v3: shared-memory tree, sequential addressing."""
    return _launch_per_element(sum_sequential_kernel, x)


def sum_warp(x: torch.Tensor) -> torch.Tensor:
    """v4: warp shuffles, one atomic per block."""
    return _launch_per_element(sum_warp_kernel, x)


def sum_two_pass(x: torch.Tensor) -> torch.Tensor:
    """v5: grid-stride + warp shuffles, partials, then one block (deterministic)."""
    def launch(x, out, n):
        # A few blocks per SM, each thread summing many elements; no more blocks than needed.
        blocks = num_blocks_grid_stride(n, BLOCK_SIZE, per_thread=8)
        partials = torch.empty(blocks, dtype=torch.float32, device=x.device)
        runtime.numba_launch(sum_partials_kernel, blocks, BLOCK_SIZE, x, partials)
        runtime.numba_launch(sum_final_kernel, 1, BLOCK_SIZE, partials, out.view(1))
    return sum_frame(x, launch)


def row_max(x: torch.Tensor) -> torch.Tensor:
    """The max of each row of a 2-D tensor: shape (rows,). -inf for rows of length 0."""
    def launch(x, out, rows, cols):
        runtime.numba_launch(row_max_kernel, rows, whole_warps(cols, BLOCK_SIZE), x, out)
    return row_max_frame(x, launch)


VERSIONS = version_index(__doc__, v1=sum_atomic, v2=sum_interleaved, v3=sum_sequential, v4=sum_warp, v5=sum_two_pass)
REFERENCE = "v5"
sum = VERSIONS[REFERENCE][1]  # the topic's launcher is called sum
