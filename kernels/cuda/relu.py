"""ReLU in CUDA C++: launchers for the kernels of ``relu.cu``, whose header lists the versions.

    relu(x)                     the reference launcher (v2)
    relu_v1(x)                  v1
    relu_backward(grad_out, x)  grad_out where x > 0, else 0

Kernels compile on first use (NVRTC on a GPU, the course's emulator on a CPU) and are
cached, so a launcher is self-contained: sizes come from its input, nothing else.
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, inputs_and_output, version_index
from kernels.frames.relu import relu_backward_input, relu_ref  # noqa: F401  (the shared input rules, the reference)
from runtime.inputs import INT32_MAX

SOURCE = runtime.KERNELS_DIR / "cuda" / "relu.cu"
BLOCK_SIZE = 256


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def relu_v1(x: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up."""
    x, y = inputs_and_output(x, op="relu", max_numel=INT32_MAX)  # relu_kernel indexes with int
    n = x.numel()
    if n:
        kernel("relu_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, n)
    return y


def relu_vec4(x: torch.Tensor) -> torch.Tensor:
    """float4 loads/stores with a scalar tail, one float4 per thread."""
    x, y = inputs_and_output(x, op="relu")
    n = x.numel()
    if n == 0:
        return y
    # float4 accesses need 16-byte aligned addresses. Fresh allocations always are, but a
    # view that starts mid-storage (x[1:]) may not be: then the scalar kernel is correct.
    if x.data_ptr() % 16 or y.data_ptr() % 16:
        if n > INT32_MAX:
            raise ValueError(f"misaligned input of {n} elements: make it aligned with x.clone()")
        kernel("relu_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, n)
        return y
    n4 = n // 4
    # One float4 per thread: enough blocks to cover every float4 (measured on an H100, this
    # beat a grid capped at one wave of resident blocks where each thread loops). The
    # kernel's loop still makes any grid correct, which is what the simulator relies on.
    blocks = max(1, cdiv(n4, BLOCK_SIZE))
    kernel("relu_vec4_kernel")[blocks, BLOCK_SIZE](x, y, n)
    return y


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dx of ReLU: grad_out where x > 0, else 0 (new tensor, shape of x)."""
    grad_out, x, grad_in = relu_backward_input(grad_out, x, max_numel=INT32_MAX)  # the kernel indexes with int
    n = x.numel()
    if n:
        kernel("relu_backward_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](grad_out, x, grad_in, n)
    return grad_in


VERSIONS = version_index(SOURCE, v1=relu_v1, v2=relu_vec4)
REFERENCE = "v2"
relu = VERSIONS[REFERENCE][1]
