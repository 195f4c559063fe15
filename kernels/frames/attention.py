"""Attention's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules, the
results of inputs that leave a kernel nothing to do, the backward's two designs and the PyTorch
references.

    check_qkv(q, k, v, op=...)                   q, k, v as 4-D tensors (3-D taken as one head), or a clear error
    check_backward_inputs(q, o, lse, do, ...)    o, L and dO of a backward, checked against q
    empty_result, zero_grads                     (o, L) and (dq, dk, dv) when Nq, Nk, d or B * H is 0
    finish, finish_grads                         the results in the shape the inputs came in
    DQ_MODES, check_dq_mode, backward_designs    "separate" or "atomic": where dQ is summed
    causal_mask(nq, nk)                          the bottom-right aligned causal mask
    attention_ref, attention_backward_ref        softmax(q kᵀ / √d) v in PyTorch, and its gradients

Shapes: q (B, H, Nq, d), k and v (B, H, Nk, d); 3-D tensors (B, N, d) are taken as one head.
The causal mask is aligned to the bottom right (FlashAttention's convention): query i sees
key j when j <= i + Nk - Nq. A query that sees no key gets o = 0 and L = +inf.
"""
from __future__ import annotations

import math

import torch

from runtime.inputs import INT32_MAX, check_tensor, dtype_name

HALF = (torch.float16, torch.bfloat16)
ALL = (torch.float32, torch.float16, torch.bfloat16)
FLOATS = ALL + (torch.float64,)


def check_qkv(q, k, v, *, op: str, dtypes=ALL, head_dims=None, max_d: int | None = None,
              contiguous: bool = True):
    """``(q, k, v, squeeze)``: 4-D tensors on the course's device (contiguous copies when
    ``contiguous``), or a clear error; ``squeeze`` says the inputs were 3-D (B, N, d)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, op=op, dtypes=dtypes)
        if t.dim() not in (3, 4):
            raise ValueError(f"{op}: {name} must be 4-D (batch, heads, N, d) or 3-D (batch, N, d), "
                             f"got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{op}: q, k and v must have one dtype, got {dtype_name(q.dtype)}, "
                        f"{dtype_name(k.dtype)} and {dtype_name(v.dtype)}: convert them with .to(q.dtype)")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"{op}: q, k and v must all be 4-D or all 3-D, got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    B, H, nq, d = q.shape
    if tuple(k.shape[:2]) != (B, H) or tuple(v.shape) != tuple(k.shape) or k.shape[3] != d:
        raise ValueError(f"{op}: q must be (B, H, Nq, d) and k, v (B, H, Nk, d) with the same B, H and d; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if head_dims is not None and d not in head_dims and not (q.numel() == 0 or k.numel() == 0):
        raise ValueError(f"{op}: head dimension d = {d} is not supported: this kernel takes d in "
                         f"{', '.join(map(str, head_dims))} (pad q, k and v with zeros up to the next one: "
                         "zero columns change neither the scores nor the output, only the scale 1/sqrt(d) "
                         "must stay that of the true d)")
    if max_d is not None and d > max_d:
        raise ValueError(f"{op}: head dimension d = {d} is larger than this kernel takes ({max_d})")
    if max(q.numel(), k.numel()) > INT32_MAX:
        raise ValueError(f"{op}: a tensor of more than {INT32_MAX} elements: split the batch")
    if contiguous:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return q, k, v, squeeze


def check_backward_inputs(q, o, lse, do, squeeze: bool, *, op: str, same_dtype: bool = False):
    """``(o, lse, do)`` of a backward, checked against the checked q (B, H, Nq, d) of
    ``check_qkv`` (and made 4-D like it when ``squeeze``): o and do tensors of q's shape, of q's
    dtype when ``same_dtype`` (else any float dtype), L (B, H, Nq) of a float dtype, all on the
    course's device (as the forward returns them); or a clear error."""
    for name, t in (("o", o), ("do", do)):
        check_tensor(t, name, op=op, dtypes=(q.dtype,) if same_dtype else FLOATS)
    check_tensor(lse, "lse", op=op, dtypes=FLOATS)
    qshape = (q.shape[0],) + tuple(q.shape[2:]) if squeeze else tuple(q.shape)  # q as it was passed
    for name, t, want in (("o", o, qshape), ("do", do, qshape), ("lse", lse, qshape[:-1])):
        if tuple(t.shape) != want:
            raise ValueError(f"{op}: {name} must have shape {want}, got {tuple(t.shape)}: pass o and lse "
                             "as the forward returned them, and do of o's shape")
    if squeeze:
        o, do, lse = o.unsqueeze(1), do.unsqueeze(1), lse.unsqueeze(1)
    return o, lse, do


def empty_result(q, k, v, squeeze, out_dtype=None):
    """o (zeros: a query that sees no key gets 0) and L (+inf) for inputs with Nq = 0, Nk = 0
    or d = 0 (no work for a kernel)."""
    B, H, nq, d = q.shape
    o = torch.zeros((B, H, nq, d), dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.full((B, H, nq), math.inf if k.shape[2] == 0 else 0.0, dtype=torch.float32, device=q.device)
    if d == 0 and k.shape[2] > 0:
        lse.fill_(math.log(k.shape[2]))   # every score is 0: logsumexp = log(Nk)
    return finish(o, lse, squeeze)


def check_out(out, shapes, dtypes, *, op: str):
    """The tensors of an ``out=`` argument, each of its shape and dtype, on the course's device;
    or a clear error. (Strides are free: the kernels take them.)"""
    if not isinstance(out, (tuple, list)) or len(out) != len(shapes):
        raise TypeError(f"{op}: out must be a tuple of {len(shapes)} tensors")
    for i, (t, shape, dt) in enumerate(zip(out, shapes, dtypes)):
        check_tensor(t, f"out[{i}]", op=op, dtypes=(dt,))
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{op}: out[{i}] must have shape {tuple(shape)}, got {tuple(t.shape)}")
    return tuple(out)


def finish(o, lse, squeeze):
    if squeeze:
        return o.squeeze(1), lse.squeeze(1)
    return o, lse


def finish_grads(dq, dk, dv, squeeze, dtype=None):
    """(dq, dk, dv) as a backward returns them: in ``dtype`` (the inputs' dtype, where the
    kernels computed in float32; None: as they are) and, when ``check_qkv`` added the head
    dim (``squeeze``), without it."""
    grads = (dq, dk, dv) if dtype is None else (dq.to(dtype), dk.to(dtype), dv.to(dtype))
    return tuple(t.squeeze(1) for t in grads) if squeeze else grads


def zero_grads(q, k, v, squeeze):
    """(dq, dk, dv) for inputs with no work for a kernel (Nq, Nk, d or B * H is 0): zeros."""
    return finish_grads(torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), squeeze)


#: The two designs of every language's attention_backward: where dQ is summed.
DQ_MODES = ("separate", "atomic")


def check_dq_mode(dq_mode) -> None:
    if dq_mode not in DQ_MODES:
        raise ValueError(f"attention_backward: dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")


def backward_designs(backward) -> dict:
    """``{dq_mode: fn(q, k, v, o, L, do, causal=False)}``: a language's
    ``backward(q, k, v, o, L, do, causal, dq_mode)`` with each dq_mode bound, the launchers of
    its ``BACKWARDS`` (named ``attention_backward_separate``, ...)."""
    def design(dq_mode):
        def fn(q, k, v, o, lse, do, causal=False):
            return backward(q, k, v, o, lse, do, causal, dq_mode)
        fn.__name__ = fn.__qualname__ = f"{backward.__name__}_{dq_mode}"
        fn.__module__, fn.__doc__ = backward.__module__, f"{backward.__name__} with dq_mode={dq_mode!r}."
        return fn
    return {dq_mode: design(dq_mode) for dq_mode in DQ_MODES}


def causal_mask(nq: int, nk: int, device=None) -> torch.Tensor:
    """(nq, nk) bool, True where key j is visible to query i (bottom-right aligned)."""
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def attention_ref(q, k, v, causal: bool = False):
    """``softmax(q kᵀ / √d) v`` in PyTorch, in the inputs' dtype (float16/bfloat16 through
    torch's SDPA, float32 or float64 through its math)."""
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    s = (q.double() if q.dtype == torch.float64 else q.float()) @ (
        k.double() if k.dtype == torch.float64 else k.float()).transpose(-1, -2)
    s = s / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)          # a row with no visible key: 0
    return (p @ (v.double() if v.dtype == torch.float64 else v.float())).to(q.dtype)


def attention_backward_ref(q, k, v, do, causal: bool = False):
    """(dq, dk, dv) in float64, by autograd through ``attention_ref`` (for inputs where every
    query sees a key)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_ref(q64, k64, v64, causal).backward(do.detach().double())
    return q64.grad, k64.grad, v64.grad
