"""ReLU in CUDA C++: launchers for the kernels of ``relu.cu``.

    relu(x)                     the reference launcher (float4 + scalar tail, grid-stride)
    relu_v1(x)                  one thread per element
    relu_backward(grad_out, x)  grad_out where x > 0, else 0

Kernels compile on first use (NVRTC on a GPU, the course's emulator on a CPU) and are
cached, so a launcher is self-contained: sizes come from its input, nothing else.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

import torch

import utils
from utils.inputs import INT32_MAX, check_input  # noqa: F401  (the shared input rules)

SOURCE = utils.KERNELS_DIR / "cuda" / "relu.cu"
BLOCK_SIZE = 256
INT_MAX = 2**31 - 1


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    """A kernel of relu.cu, compiled once: ``kernel("relu_kernel")[grid, block](...)``."""
    return utils.cuda_kernel(SOURCE, name)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b



@functools.lru_cache(maxsize=None)
def _resident_blocks() -> int:
    """How many BLOCK_SIZE-thread blocks the GPU holds at once: one full wave."""
    if utils.SIMULATE:
        return 8  # the emulator has no SMs; a small grid still makes threads loop
    props = torch.cuda.get_device_properties(utils.DEVICE)
    per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // BLOCK_SIZE
    return props.multi_processor_count * max(per_sm, 1)


def relu_v1(x: torch.Tensor) -> torch.Tensor:
    """One thread per element, 256 threads per block, the grid rounded up."""
    x = check_input(x)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    if n > INT_MAX:
        raise ValueError(f"relu_kernel indexes with int: at most {INT_MAX} elements, got {n}")
    kernel("relu_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, n)
    return y


def relu_vec4(x: torch.Tensor) -> torch.Tensor:
    """float4 loads/stores with a scalar tail; the grid is capped and threads loop."""
    x = check_input(x)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    # float4 accesses need 16-byte aligned addresses. Fresh allocations always are, but a
    # view that starts mid-storage (x[1:]) may not be: then the scalar kernel is correct.
    if x.data_ptr() % 16 or y.data_ptr() % 16:
        if n > INT_MAX:
            raise ValueError(f"misaligned input of {n} elements: make it aligned with x.clone()")
        kernel("relu_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](x, y, n)
        return y
    n4 = n // 4
    # One full wave of blocks (every SM at its thread limit), no more: each thread then
    # loops, and all blocks finish together instead of a last partial wave running alone.
    blocks = max(1, min(cdiv(max(n4, 1), BLOCK_SIZE), _resident_blocks()))
    kernel("relu_vec4_kernel")[blocks, BLOCK_SIZE](x, y, n)
    return y


def relu_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dx of ReLU: grad_out where x > 0, else 0 (new tensor, shape of x)."""
    grad_out = check_input(grad_out, "grad_out")
    x = check_input(x)
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)} but x has {tuple(x.shape)}")
    grad_in = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return grad_in
    if n > INT_MAX:
        raise ValueError(f"relu_backward_kernel indexes with int: at most {INT_MAX} elements, got {n}")
    kernel("relu_backward_kernel")[cdiv(n, BLOCK_SIZE), BLOCK_SIZE](grad_out, x, grad_in, n)
    return grad_in


VERSIONS = OrderedDict(
    v1=("one thread per element, 256 threads per block", relu_v1),
    v2=("float4 loads and stores, scalar tail, grid-stride loop", relu_vec4),
)
REFERENCE = "v2"
relu = VERSIONS[REFERENCE][1]


def relu_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)
