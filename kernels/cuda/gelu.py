"""GELU (tanh approximation) in CUDA C++: launchers for the kernels in ``gelu.cu``, and the
PyTorch baselines the lesson compares them with.

    gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

On a GPU the kernels are compiled with NVRTC and run for real; in simulation the course's
CPU emulator runs them (``runtime.cuda_kernel`` decides). The header of ``gelu.cu`` lists the
versions (``VERSIONS`` below: ``gelu_v1``, ``gelu_v2``).

PyTorch baselines (defined in ``kernels/frames/gelu.py``; the three language modules re-export them):

    gelu_ref             the reference: float64 tanh-GELU, cast back to the input dtype
    gelu_unfused_torch   the formula written op by op: one kernel (and one round trip
                         through memory) per operation
    gelu_torch           F.gelu(x, approximate="tanh"): PyTorch's own fused kernel
    gelu_compiled        torch.compile(gelu_unfused_torch): the compiler fuses the ops
"""
from __future__ import annotations

from pathlib import Path

import torch

import runtime
from kernels._launch import cdiv, inputs_and_output, version_index
from kernels.frames.gelu import (  # noqa: F401  (the reference and the baselines, defined once)
    BASELINES,
    COEFF,
    SQRT_2_OVER_PI,
    gelu_compiled,
    gelu_ref,
    gelu_torch,
    gelu_unfused_torch,
)
from runtime.inputs import INT32_MAX

SOURCE = Path(__file__).with_name("gelu.cu")
#: Threads per block. Any multiple of 32 works; 256 keeps many blocks resident per SM.
BLOCK_SIZE = 256

_compiled = {}


def _kernel(name: str):
    """Compile ``gelu.cu`` once per kernel name (the loader caches builds on disk too)."""
    if name not in _compiled:
        _compiled[name] = runtime.cuda_kernel(str(SOURCE), name)
    return _compiled[name]



# ----------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------
def gelu_v1(x: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element."""
    x, y = inputs_and_output(x, op="gelu_v1", max_numel=INT32_MAX)
    n = x.numel()
    if n:  # a launch with zero blocks is an error in CUDA
        grid = cdiv(n, BLOCK_SIZE)  # enough blocks to cover n; the last one may be partial
        _kernel("gelu_kernel")[grid, BLOCK_SIZE](x, y, n)
    return y


def gelu_v2(x: torch.Tensor) -> torch.Tensor:
    """v2: float4 loads and stores (4 elements per thread) and a scalar tail for n % 4."""
    x, y = inputs_and_output(x, op="gelu_v2", max_numel=INT32_MAX)
    n = x.numel()
    if n == 0:
        return y
    if x.data_ptr() % 16 or y.data_ptr() % 16:
        # A float4 access must be 16-byte aligned. Fresh allocations always are, but a
        # view such as x[1:] starts 4 bytes in: run the scalar kernel on it instead.
        _kernel("gelu_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, n)
        return y
    # One thread per float4 group; at least one block so that the tail (n < 4) is done.
    threads = max(n // 4, 1)
    grid = cdiv(threads, BLOCK_SIZE)
    _kernel("gelu_vec4_kernel")[grid, BLOCK_SIZE](x, y, n)
    return y


gelu = gelu_v2

VERSIONS = version_index(SOURCE, v1=gelu_v1, v2=gelu_v2)
REFERENCE = "v2"
