"""``utils.profile``: what a kernel's memory accesses cost, with or without a GPU.

    p = utils.profile(k, grid, block, *args, shared=0)     # k = utils.cuda_kernel(...)
    p = k.profile[grid, block](*args)                       # the same, in launch syntax
    p = utils.profile(numba_kernel, grid, block, *args)     # numba.cuda.jit kernel
    p = utils.profile(triton_kernel, grid, *args, **meta)   # triton.jit kernel
    p                                                       # a short table and sentences
    p.metrics["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"]

The launch really runs, once (its outputs are written). In simulation the counters come from
the emulators (for CUDA C++: every access of every lane, grouped into warp-wide requests, see
docs/cuda-emulator.md, "Profiling"); on a GPU from Nsight Compute (``ncu``). The metrics are
keyed by Nsight Compute's names, so both sides compare directly. Each backend profiles its own
kernels (``runtime/backends/<backend>/``); the result is a `Profile`
(``runtime/backends/profile_report.py``).
"""
from __future__ import annotations

from runtime.backends import backend_of
from runtime.backends.profile_report import MIN_REGISTERS, Profile  # noqa: F401

__all__ = ["profile", "Profile"]


def profile(kernel, grid, *args, shared: int = 0, **kwargs) -> Profile:
    """Run one launch of ``kernel`` and return its `Profile`.

    * ``utils.cuda_kernel`` kernels: ``profile(k, grid, block, *args, shared=0)`` (as
      ``k[grid, block, shared](*args)``); also ``k.profile[grid, block](*args)``.
    * Numba kernels: ``profile(k, grid, block, *args)``; Triton kernels:
      ``profile(k, grid, *args, **meta)`` (grid a tuple or a callable).
    """
    try:
        backend = backend_of(kernel)
    except TypeError:
        raise TypeError(f"profile() takes a kernel made by utils.cuda_kernel, numba.cuda.jit or triton.jit, "
                        f"got {type(kernel).__name__}") from None
    return backend.profile(kernel, grid, *args, shared=shared, **kwargs)
