"""Attention in CUDA C++: launchers for ``attention.cu``, and what every language's attention
launchers share (the input rules, ``check_qkv``, and the PyTorch reference, ``attention_ref``).

Shapes: q (B, H, Nq, d), k and v (B, H, Nk, d); 3-D tensors (B, N, d) are taken as one head.
The causal mask is aligned to the bottom right (FlashAttention's convention): query i sees
key j when j <= i + Nk - Nq. A query that sees no key gets o = 0 and L = +inf.
"""
from __future__ import annotations

import math

import torch

import utils

INT32_MAX = 2**31 - 1
HALF = (torch.float16, torch.bfloat16)
ALL = (torch.float32, torch.float16, torch.bfloat16)
_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
          torch.float64: "float64"}


def dtype_name(dt) -> str:
    return _NAMES.get(dt, str(dt).replace("torch.", ""))


def check_qkv(q, k, v, *, op: str, dtypes=ALL, head_dims=None, max_d: int | None = None,
              contiguous: bool = True):
    """``(q, k, v, squeeze)``: 4-D tensors on the course's device (contiguous copies when
    ``contiguous``), or a clear error; ``squeeze`` says the inputs were 3-D (B, N, d)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            want = " or ".join(dtype_name(d) for d in dtypes)
            raise TypeError(f"{op}: {name} must be {want}, got {dtype_name(t.dtype)}: convert it with "
                            f"{name}.to(torch.{dtype_name(dtypes[0])})")
        if t.device.type != utils.DEVICE.type:
            raise ValueError(f"{op}: {name} is on {t.device}, but the kernels run on {utils.DEVICE}: "
                             f"move it with {name}.to(utils.DEVICE)")
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


def empty_result(q, k, v, squeeze, out_dtype=None):
    """o (zeros: a query that sees no key gets 0) and L (+inf) for inputs with Nq = 0, Nk = 0
    or d = 0 (no work for a kernel)."""
    B, H, nq, d = q.shape
    o = torch.zeros((B, H, nq, d), dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.full((B, H, nq), math.inf if k.shape[2] == 0 else 0.0, dtype=torch.float32, device=q.device)
    if d == 0 and k.shape[2] > 0:
        lse.fill_(math.log(k.shape[2]))   # every score is 0: logsumexp = log(Nk)
    return finish(o, lse, squeeze)


def finish(o, lse, squeeze):
    if squeeze:
        return o.squeeze(1), lse.squeeze(1)
    return o, lse


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


def bench_inputs(B, H, N, d, dtype, device=None, seed=0, requires_grad=False):
    g = torch.Generator(device=device or utils.DEVICE).manual_seed(seed)
    out = []
    for _ in range(3):
        t = torch.randn(B, H, N, d, generator=g, device=device or utils.DEVICE).to(dtype)
        out.append(t.requires_grad_(requires_grad))
    return tuple(out)
