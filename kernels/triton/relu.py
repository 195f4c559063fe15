"""ReLU in Triton: ``@triton.jit`` kernels and their launchers.

Versions (``VERSIONS``; ``relu`` is the reference, v1):

    v1  1024 elements per program, 4 warps   relu_v1
    v2  4096 elements per program, 8 warps   relu_v2

and ``relu_backward(grad_out, x)``: grad_out where x > 0, else 0.

A Triton program handles a whole BLOCK_SIZE-wide slice of the data at once: ``tl.arange``
gives the offsets of the slice, a mask switches off the lanes past the end. Triton picks
the vector width of loads and stores itself (16-byte accesses when it can prove alignment).
"""
from __future__ import annotations

import torch

import runtime  # noqa: F401  (before triton: it switches on the interpreter in simulation)
from kernels._launch import inputs_and_output, version_index
from kernels.frames.relu import relu_backward_input

import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)                       # which slice this program handles
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n                                # the last slice may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def relu_backward_kernel(grad_out_ptr, x_ptr, grad_in_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    g = tl.load(grad_out_ptr + offsets, mask=mask)
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(grad_in_ptr + offsets, tl.where(x > 0.0, g, 0.0), mask=mask)



def _launch(x: torch.Tensor, block_size: int, num_warps: int) -> torch.Tensor:
    x, y = inputs_and_output(x, op="relu")
    n = x.numel()
    if n:  # an empty grid is not a launch
        relu_kernel[(triton.cdiv(n, block_size),)](x, y, n, BLOCK_SIZE=block_size, num_warps=num_warps)
    return y


def relu_v1(x: torch.Tensor) -> torch.Tensor:
    """1024 elements per program, 4 warps: 8 elements (two 16-byte vectors) per thread."""
    return _launch(x, 1024, 4)


def relu_v2(x: torch.Tensor) -> torch.Tensor:
    """4096 elements per program, 8 warps: fewer, bigger programs."""
    return _launch(x, 4096, 8)


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dx of ReLU: grad_out where x > 0, else 0 (new tensor, shape of x)."""
    grad_out, x, grad_in = relu_backward_input(grad_out, x)
    n = x.numel()
    if n:
        relu_backward_kernel[(triton.cdiv(n, 1024),)](grad_out, x, grad_in, n, BLOCK_SIZE=1024)
    return grad_in


VERSIONS = version_index(__doc__, v1=relu_v1, v2=relu_v2)
REFERENCE = "v1"
relu = VERSIONS[REFERENCE][1]
