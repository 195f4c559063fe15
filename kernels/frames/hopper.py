"""The frame of the topic ``hopper`` (lesson 12): C = A @ B^T with both operands K-major, as
nn.Linear computes ``x @ weight.T``: the input rules, the operands as TMA can read them, and the
reference.

    prepare_linear(a, b, op)   checked A (M, K) and B (N, K) in bfloat16, with rows TMA can address,
                               and a new bfloat16 C (M, N)
    padded_rows(t)             t's rows padded with zeros to a multiple of 8 elements (16 bytes)
    hopper_ref(a, b)           A @ B^T in float64 (the graders' reference)
    hopper_torch(a, b)         torch's own (cuBLAS on a GPU): the baseline
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.inputs import INT32_MAX, check_tensor

BF16 = (torch.bfloat16,)


def prepare_linear(a, b, *, op: str):
    """``(a, b, c, M, N, K)``: A (M, K) and B (N, K), bfloat16 on the course's device (or a clear
    error), and a new bfloat16 C (M, N), zero when K == 0. TMA reads rows whose stride is a
    multiple of 16 bytes: when K is not a multiple of 8 the operands are copied into rows padded
    with zeros to the next multiple (the zeros add nothing to a dot product); K is then that."""
    for name, t in (("a", a), ("b", b)):
        check_tensor(t, name, op=op, dtypes=BF16)
        if t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{op}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: C = A @ B^T needs the same K "
                         f"(columns) in both, as nn.Linear's x (M, K) and weight (N, K)")
    M, K = a.shape
    N = b.shape[0]
    if max(a.numel(), b.numel(), M * N) > INT32_MAX:
        raise ValueError(f"{op}: a matrix of more than {INT32_MAX} elements: split the product")
    c = (torch.zeros if K == 0 or M == 0 or N == 0 else torch.empty)((M, N), dtype=torch.bfloat16, device=a.device)
    a, b = a.contiguous(), b.contiguous()
    if K % 8 and K:
        a, b = padded_rows(a), padded_rows(b)
        K = a.shape[1]
    if a.data_ptr() % 16:
        a = a.clone()
    if b.data_ptr() % 16:
        b = b.clone()
    return a, b, c, M, N, K


def padded_rows(t: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """``t`` (rows, K) copied into rows of the next multiple of ``multiple`` elements, zeros after
    K: rows TMA can address (a row stride of a multiple of 16 bytes). A fill and a copy, not a
    computation."""
    rows, k = t.shape
    out = torch.zeros((rows, -(-k // multiple) * multiple), dtype=t.dtype, device=t.device)
    out[:, :k].copy_(t)
    return out


def hopper_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B^T in float64."""
    return a.double() @ b.double().T


def hopper_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch's A @ B^T in bfloat16 (cuBLAS on a GPU)."""
    return F.linear(a, b)
