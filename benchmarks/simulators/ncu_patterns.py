"""The launches measured by Nsight Compute on a GPU and by the course's profiler in
simulation: the pattern kernels of ``kernels/cuda/patterns.cu``, the course's reference
CUDA kernels and its reference Triton kernels.

One table, used by the GPU run (``benchmarks/simulators/ncu_run.py``), the comparison
(``benchmarks/simulators/ncu_vs_sim.py``) and its CI test. Each case is one kernel launch: the kernel,
its grid, block and dynamic shared memory, and a function that makes its arguments. Sizes
are small so that the simulation of every case stays fast (2^16 elements, 256 x 256
matrices).

    from benchmarks.simulators.ncu_patterns import CASES, launch
    for case in CASES.values():
        launch(case, case.make_args(device))
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

import utils

N = 1 << 16               # elements of the one-dimensional cases
BLOCK = 256               # threads per block of the one-dimensional cases
ROWS = COLS = 256         # the transposes' matrix
SOFTMAX_ROWS, SOFTMAX_COLS = 64, 1024
F32 = 4                   # bytes per float


@dataclass(frozen=True)
class Case:
    """One kernel launch.

    ``make_args(device)`` returns ``(args, kwargs)`` for the launch (kwargs are Triton's
    constexprs and launch options). ``bytes`` is what the kernel needs to move (each input
    and output byte once), the byte count behind its GB/s. ``exact``: a simple pattern whose
    counters the simulation must reproduce exactly.
    """
    name: str
    backend: str                      # "cuda" or "triton"
    module: str                       # kernels/<backend>/<module>.py
    kernel: str                       # the kernel's name in that module
    grid: tuple
    block: tuple | None               # None for Triton (its num_warps is in kwargs)
    make_args: Callable = field(repr=False)
    bytes: int = 0
    shared: int = 0
    exact: bool = False
    kind: str = "pattern"             # "pattern" or "reference"
    what: str = ""                    # what the case shows, in a few words

    def load(self):
        """The kernel object: a ``utils.cuda_kernel`` kernel or a ``triton.jit`` function."""
        mod = importlib.import_module(f"kernels.{self.backend}.{self.module}")
        if self.backend == "triton":
            return getattr(mod, self.kernel)
        loader = getattr(mod, "kernel", None) or mod._kernel  # gelu.py names its loader _kernel
        return loader(self.kernel)


def launch(case: Case, made) -> None:
    """Launch ``case`` once with the ``(args, kwargs)`` that ``case.make_args`` made."""
    args, kwargs = made
    k = case.load()
    if case.backend == "cuda":
        cfg = (case.grid, case.block, case.shared) if case.shared else (case.grid, case.block)
        k[cfg](*args)
    else:
        k[case.grid](*args, **kwargs)


# ---- argument makers: fresh random inputs, outputs zeroed (deterministic for a seed) ----

def _randn(device, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device)


def _zeros(device, *shape):
    return torch.zeros(*shape, device=device)


def _copy_args(extra_in=0, scale=1, tail=()):
    """x of N * scale + extra_in floats, y of N floats, then n and ``tail``."""
    def make(device):
        return (_randn(device, N * scale + extra_in), _zeros(device, N), N, *tail), {}
    return make


def _soa_args(device):
    return (_randn(device, N, seed=1), _randn(device, N, seed=2), _randn(device, N, seed=3),
            _zeros(device, N), N), {}


def _float4_args(device):
    return (_randn(device, N), _zeros(device, N), N // 4), {}


def _transpose_args(device):
    return (_randn(device, ROWS, COLS), _zeros(device, COLS, ROWS), ROWS, COLS), {}


def _distinct_args(device):
    return (_randn(device, N), _zeros(device, N), N), {}


def _ticket_args(device):
    return (torch.zeros(1, dtype=torch.int32, device=device), torch.zeros(N, dtype=torch.int32, device=device), N), {}


def _partials_args(blocks):
    def make(device):
        return (_randn(device, N), _zeros(device, blocks), N), {}
    return make


def _sum_args(device):
    return (_randn(device, N), _zeros(device, 1), N), {}


def _softmax_args(device):
    return (_randn(device, SOFTMAX_ROWS, SOFTMAX_COLS), _zeros(device, SOFTMAX_ROWS, SOFTMAX_COLS),
            SOFTMAX_COLS), {}


def _triton_unary(block_size, num_warps):
    def make(device):
        return (_randn(device, N), _zeros(device, N), N), dict(BLOCK_SIZE=block_size, num_warps=num_warps)
    return make


def _triton_softmax(device):
    return ((_randn(device, SOFTMAX_ROWS, SOFTMAX_COLS), _zeros(device, SOFTMAX_ROWS, SOFTMAX_COLS), SOFTMAX_COLS),
            dict(BLOCK_SIZE=SOFTMAX_COLS, num_warps=4))


def _triton_partials(blocks, block_size):
    def make(device):
        return (_randn(device, N), _zeros(device, blocks), N), dict(BLOCK_SIZE=block_size, num_warps=4)
    return make


def _cdiv(a, b):
    return (a + b - 1) // b


_GRID1 = (N // BLOCK,)
_TGRID = (COLS // 32, ROWS // 32)
_UNARY = 2 * N * F32      # read x, write y

_LIST = [
    # ---- patterns ----
    Case("copy_coalesced", "cuda", "patterns", "copy_coalesced_kernel", _GRID1, (BLOCK,), _copy_args(),
         _UNARY, exact=True, what="4 sectors per request"),
    Case("copy_strided_2", "cuda", "patterns", "copy_strided_kernel", _GRID1, (BLOCK,),
         _copy_args(scale=2, tail=(2,)), _UNARY, exact=True, what="loads 8 bytes apart: 8 sectors per request"),
    Case("copy_strided_32", "cuda", "patterns", "copy_strided_kernel", _GRID1, (BLOCK,),
         _copy_args(scale=32, tail=(32,)), _UNARY, exact=True, what="loads 128 bytes apart: 32 sectors per request"),
    Case("copy_misaligned", "cuda", "patterns", "copy_misaligned_kernel", _GRID1, (BLOCK,),
         _copy_args(extra_in=1), _UNARY, exact=True, what="loads one float off: 5 sectors per request"),
    Case("aos", "cuda", "patterns", "aos_kernel", _GRID1, (BLOCK,), _copy_args(scale=3),
         4 * N * F32, exact=True, what="array of 12-byte structs: 12 sectors per load request"),
    Case("soa", "cuda", "patterns", "soa_kernel", _GRID1, (BLOCK,), _soa_args,
         4 * N * F32, exact=True, what="struct of arrays: 4 sectors per load request"),
    Case("copy_float4", "cuda", "patterns", "copy_float4_kernel", (N // 4 // BLOCK,), (BLOCK,), _float4_args,
         _UNARY, exact=True, what="16-byte accesses: 16 sectors per request, a quarter of the requests"),
    Case("transpose_naive", "cuda", "patterns", "transpose_naive_kernel", _TGRID, (32, 8), _transpose_args,
         2 * ROWS * COLS * F32, exact=True, what="column stores: 32 sectors per store request"),
    Case("transpose_shared", "cuda", "patterns", "transpose_shared_kernel", _TGRID, (32, 8), _transpose_args,
         2 * ROWS * COLS * F32, exact=True, what="column reads of a 32x32 tile: 32-way bank conflicts"),
    Case("transpose_padded", "cuda", "patterns", "transpose_padded_kernel", _TGRID, (32, 8), _transpose_args,
         2 * ROWS * COLS * F32, exact=True, what="a 33-word row: no bank conflicts"),
    Case("reduce_strided_index", "cuda", "patterns", "reduce_strided_index_kernel", _GRID1, (BLOCK,),
         _partials_args(N // BLOCK), N * F32 + (N // BLOCK) * F32, exact=True,
         what="packed tree, index = 2*s*t: bank conflicts instead of divergence"),
    Case("branch_odd_even", "cuda", "patterns", "branch_odd_even_kernel", _GRID1, (BLOCK,), _copy_args(),
         _UNARY, what="if on threadIdx.x % 2: every warp diverges"),
    Case("branch_half_warp", "cuda", "patterns", "branch_half_warp_kernel", _GRID1, (BLOCK,), _copy_args(),
         _UNARY, what="if on lane < 16: every warp diverges, 16 + 16"),
    Case("branch_warp_aligned", "cuda", "patterns", "branch_warp_aligned_kernel", _GRID1, (BLOCK,), _copy_args(),
         _UNARY, what="if on the warp index: no divergence"),
    Case("atomic_one_address", "cuda", "patterns", "atomic_one_address_kernel", _GRID1, (BLOCK,), _sum_args,
         N * F32 + F32, exact=True, what="every thread atomicAdds into out[0]"),
    Case("atomic_distinct", "cuda", "patterns", "atomic_distinct_kernel", _GRID1, (BLOCK,), _distinct_args,
         3 * N * F32, exact=True, what="thread i atomicAdds into out[i]: no collisions"),
    Case("atomic_ticket", "cuda", "patterns", "atomic_ticket_kernel", _GRID1, (BLOCK,), _ticket_args,
         N * 4 + 4, exact=True, what="an atomicAdd whose old value is used: ATOM, not RED"),
    # ---- the course's reference CUDA kernels ----
    Case("relu", "cuda", "relu", "relu_kernel", _GRID1, (BLOCK,), _copy_args(), _UNARY, kind="reference",
         exact=True, what="relu v1, one thread per element"),
    Case("relu_vec4", "cuda", "relu", "relu_vec4_kernel", (N // 4 // BLOCK,), (BLOCK,), _copy_args(),
         _UNARY, kind="reference", exact=True, what="relu v2, float4"),
    Case("gelu", "cuda", "gelu", "gelu_kernel", _GRID1, (BLOCK,), _copy_args(), _UNARY, kind="reference",
         what="gelu, one thread per element"),
    Case("gelu_vec4", "cuda", "gelu", "gelu_vec4_kernel", (N // 4 // BLOCK,), (BLOCK,), _copy_args(),
         _UNARY, kind="reference", what="gelu, float4"),
    Case("sum_atomic", "cuda", "reduction", "sum_atomic_kernel", _GRID1, (BLOCK,), _sum_args, N * F32 + F32,
         kind="reference", what="reduction v1, one atomicAdd per element"),
    Case("sum_interleaved", "cuda", "reduction", "sum_interleaved_kernel", _GRID1, (BLOCK,), _sum_args,
         N * F32 + F32, shared=BLOCK * F32, kind="reference",
         what="reduction v2, interleaved addressing (t % 2s): divergent warps"),
    Case("sum_sequential", "cuda", "reduction", "sum_sequential_kernel", _GRID1, (BLOCK,), _sum_args,
         N * F32 + F32, shared=BLOCK * F32, kind="reference",
         what="reduction v3, sequential addressing: no divergence, no conflicts"),
    Case("sum_warp", "cuda", "reduction", "sum_warp_kernel", _GRID1, (BLOCK,), _sum_args, N * F32 + F32,
         kind="reference", what="reduction v4, warp shuffles"),
    Case("sum_partials", "cuda", "reduction", "sum_partials_kernel", (16,), (BLOCK,), _partials_args(16),
         N * F32 + 16 * F32, kind="reference", what="reduction v5 first pass, grid-stride float4"),
    Case("softmax_fused", "cuda", "softmax", "softmax_fused4_kernel", (SOFTMAX_ROWS,), (BLOCK,), _softmax_args,
         2 * SOFTMAX_ROWS * SOFTMAX_COLS * F32, kind="reference", what="softmax v2, one row per block"),
    # ---- the course's reference Triton kernels ----
    Case("triton_relu", "triton", "relu", "relu_kernel", (_cdiv(N, 1024),), None, _triton_unary(1024, 4),
         _UNARY, kind="reference", what="Triton relu, 1024 per program"),
    Case("triton_gelu", "triton", "gelu", "gelu_kernel", (_cdiv(N, 1024),), None, _triton_unary(1024, 4),
         _UNARY, kind="reference", what="Triton gelu, 1024 per program"),
    Case("triton_softmax", "triton", "softmax", "softmax_fused_kernel", (SOFTMAX_ROWS,), None, _triton_softmax,
         2 * SOFTMAX_ROWS * SOFTMAX_COLS * F32, kind="reference", what="Triton softmax, one row per program"),
    Case("triton_sum_partials", "triton", "reduction", "sum_partials_kernel", (16,), None,
         _triton_partials(16, 4096), N * F32 + 16 * F32, kind="reference", what="Triton sum, first pass"),
]

#: name -> Case, in launch order (the GPU run maps ncu's launches to cases by this order).
CASES = {c.name: c for c in _LIST}
assert len(CASES) == len(_LIST), "case names must be unique"


def device() -> torch.device:
    return utils.DEVICE
