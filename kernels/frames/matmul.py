"""Matrix multiplication's frame, shared by the CUDA C++, Numba and Triton launchers: the input
rules and the PyTorch reference.

    check_operands(a, b, op=..., dtypes=FP32)   A (M, K) and B (K, N), contiguous, or a clear error
    prepare_operands(a, b, op, dtypes=FP32)     the checked operands and a new float32 C (M, N)
    matmul_ref(a, b)                            A @ B (in float32 for half inputs)

``FP32`` and ``HALF`` are the dtypes of the SIMT versions and of the tensor-core ones.
"""
from __future__ import annotations

import torch

from runtime.inputs import INT32_MAX, check_tensor

FP32 = (torch.float32,)
HALF = (torch.float16, torch.bfloat16)


def check_operands(a, b, *, op: str, dtypes=FP32) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K) and B (K, N) as contiguous tensors on the course's device, or a clear error."""
    for name, t in (("a", a), ("b", b)):
        check_tensor(t, name, op=op, dtypes=dtypes)
        if t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                         f"(a has {a.shape[1]} columns, b has {b.shape[0]} rows)")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: a is {a.dtype} but b is {b.dtype}: give both the same dtype")
    if max(a.numel(), b.numel(), a.shape[0] * b.shape[1]) > INT32_MAX:
        raise ValueError(f"{op}: a matrix of more than {INT32_MAX} elements: split the product")
    return a.contiguous(), b.contiguous()


def prepare_operands(a, b, op, dtypes=FP32):
    """``(a, b, c, M, N, K)``: the checked operands (``check_operands``) and a new float32 C
    (M, N), zeroed when K == 0 (zero is the right answer; for K > 0 the kernels write every
    element). The CUDA C++ and Numba launchers start with it."""
    a, b = check_operands(a, b, op=op, dtypes=dtypes)
    M, K = a.shape
    N = b.shape[1]
    c = (torch.zeros if K == 0 else torch.empty)((M, N), dtype=torch.float32, device=a.device)
    return a, b, c, M, N, K


def matmul_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B: in float32 for float16/bfloat16 inputs (as the kernels return it), else in
    the inputs' dtype."""
    if a.dtype in HALF:
        return a.float() @ b.float()
    return a @ b
