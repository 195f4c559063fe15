"""A copy, ``y[i] = x[i]`` for ``i < n``, as a Numba and as a Triton kernel: the smallest
kernels there are, for the tests that need a launch (recorded, profiled, writing through a
view) but are not about the kernel. Profiling's coalesced baseline is this copy too."""
import utils  # noqa: F401  (before numba/triton: picks the simulator or the GPU)

import triton
import triton.language as tl
from numba import cuda


@cuda.jit
def copy_kernel(x_ptr, y_ptr, n):
    i = cuda.grid(1)
    if i < n:
        y_ptr[i] = x_ptr[i]


@triton.jit
def copy_tl_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
