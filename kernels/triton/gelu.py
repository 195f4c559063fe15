"""GELU (tanh approximation) in Triton.

    gelu(x) = 0.5 * x * (1 + tanh(u)),  u = sqrt(2/pi) * (x + 0.044715 * x^3)

Since 1 + tanh(u) = 2 * sigmoid(2u), this is x * sigmoid(2u) = x / (1 + exp(-2u)): one
``tl.exp`` and one division, with no libdevice ``tanh``, and it never divides inf by inf: for very negative u, exp(-2u)
overflows to inf and the result is x / inf = -0, the right limit. (The textbook form
(exp(2u) - 1) / (exp(2u) + 1) gives inf / inf = nan for u > 44.)

One version (``VERSIONS``):

    v1  one program per 1024 elements, masked tail

a program owns BLOCK_SIZE consecutive elements; the compiler spreads them over its threads
and vectorizes the loads and stores (16-byte accesses).
"""
from __future__ import annotations

import numpy as np
import torch

import runtime  # noqa: F401  (must come before triton: it picks the GPU or the interpreter)
from kernels._launch import inputs_and_output, version_index
from kernels.frames.gelu import BASELINES, gelu_compiled, gelu_ref, gelu_torch, gelu_unfused_torch  # noqa: F401  (the baselines)
from runtime.inputs import INT32_MAX

import triton
import triton.language as tl

BLOCK_SIZE = 1024


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n  # the last program may stick out past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    u = 0.7978845608 * (x + 0.044715 * x * x * x)
    y = x / (1.0 + tl.exp(-2.0 * u))  # = 0.5 * x * (1 + tanh(u))
    tl.store(y_ptr + offsets, y, mask=mask)


def gelu_v1(x: torch.Tensor) -> torch.Tensor:
    """One program per BLOCK_SIZE elements, masked tail."""
    x, y = inputs_and_output(x, op="gelu_v1", max_numel=INT32_MAX)
    n = x.numel()
    if n == 0:
        return y  # an empty grid is not a valid launch
    # exp(-2u) overflowing to inf is expected (see above); the interpreter computes with
    # NumPy, which would warn about it.
    with np.errstate(over="ignore"):
        gelu_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, n, BLOCK_SIZE=BLOCK_SIZE)
    return y


gelu = gelu_v1

VERSIONS = version_index(__doc__, v1=gelu_v1)
REFERENCE = "v1"
