"""Attention in CUDA C++: launchers for ``attention.cu``. What every language's attention
launchers share (the input rules, ``check_qkv``, and the PyTorch reference, ``attention_ref``)
is their frame, ``kernels/frames/attention.py``.

Shapes: q (B, H, Nq, d), k and v (B, H, Nk, d); 3-D tensors (B, N, d) are taken as one head.
The causal mask is aligned to the bottom right (FlashAttention's convention): query i sees
key j when j <= i + Nk - Nq. A query that sees no key gets o = 0 and L = +inf.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, cuda_source, version_index
from kernels.frames.attention import (  # the frame: input rules and references, shared by the three languages
    ALL,  # noqa: F401  (importable from here too)
    DQ_MODES,  # noqa: F401
    FLOATS,  # noqa: F401
    HALF,
    attention_backward_ref,  # noqa: F401
    attention_ref,  # noqa: F401
    backward_designs,
    causal_mask,  # noqa: F401
    check_backward_inputs,
    check_dq_mode,
    check_qkv,
    empty_result,
    finish,
    finish_grads,
    zero_grads,
)
from runtime.inputs import INT32_MAX

SOURCE = runtime.KERNELS_DIR / "cuda" / "attention.cu"
#: v3 (wmma) takes these head dimensions: one kernel each (the fragments are 16 wide).
WMMA_HEAD_DIMS = (16, 32, 64, 128)
WMMA_BM = 64                 # queries per block
ROW_THREADS = 128            # v2: threads per block; d <= 128
BWD_TILE = 32
BWD_THREADS = 256
MAX_D_SIMT = 128             # v2 and the backward keep up to 128 columns per row


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str) -> str:
    """The text of one kernel or helper of attention.cu (its comment block and body)."""
    return cuda_source(name, SOURCE)


def _as_f32(q, k, v):
    return tuple(t.float().contiguous() for t in (q, k, v))


def _shapes(q, k):
    B, H, nq, d = q.shape
    return B, H, nq, k.shape[2], d


def attention_naive_forward(q, k, v, causal=False):
    """v1 returning (o, L): three kernels, the Nq x Nk scores (float32) through memory. Any
    float dtype in (computed in float32), o in the inputs' dtype."""
    q, k, v, squeeze = check_qkv(q, k, v, op="attention_naive (CUDA)")
    B, H, nq, nk, d = _shapes(q, k)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return empty_result(q, k, v, squeeze)
    if B * H * nq * nk > INT32_MAX:
        raise ValueError(f"attention_naive (CUDA): the scores would have {B * H * nq * nk} elements; "
                         "that is what FlashAttention avoids: use v3")
    qf, kf, vf = _as_f32(q, k, v)
    s = torch.empty((B, H, nq, nk), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    o = torch.empty((B, H, nq, d), dtype=torch.float32, device=q.device)
    kernel("attn_scores_kernel")[(cdiv(nk, 32), cdiv(nq, 8), B * H), (32, 8)](
        qf, kf, s, nq, nk, d, 1.0 / math.sqrt(d), nk - nq, int(bool(causal)))
    kernel("attn_softmax_kernel")[B * H * nq, 128](s, lse, nk)
    kernel("attn_pv_kernel")[(cdiv(d, 32), cdiv(nq, 8), B * H), (32, 8)](s, vf, o, nq, nk, d)
    return finish(o.to(q.dtype), lse, squeeze)


def attention_naive(q, k, v, causal=False):
    """v1: three kernels."""
    return attention_naive_forward(q, k, v, causal)[0]


def attention_rowwise_forward(q, k, v, causal=False):
    """v2 returning (o, L): one query row per block, the online softmax over chunks of 128
    keys. Any float dtype in (computed in float32), d <= 128."""
    q, k, v, squeeze = check_qkv(q, k, v, op="attention_rowwise (CUDA)", max_d=MAX_D_SIMT)
    B, H, nq, nk, d = _shapes(q, k)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return empty_result(q, k, v, squeeze)
    qf, kf, vf = _as_f32(q, k, v)
    o = torch.empty((B, H, nq, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    kernel("attn_row_kernel")[(nq, B * H), ROW_THREADS](qf, kf, vf, o, lse, nq, nk, d, 1.0 / math.sqrt(d),
                                                        nk - nq, int(bool(causal)))
    return finish(o.to(q.dtype), lse, squeeze)


def attention_rowwise(q, k, v, causal=False):
    """v2: one query row per block."""
    return attention_rowwise_forward(q, k, v, causal)[0]


def wmma_smem_bytes(d: int) -> int:
    """Shared memory of the v3 kernel (as wmma_smem_bytes in attention.cu)."""
    pad, spad, bn = 8, 4, 64
    return 3 * WMMA_BM * (d + pad) * 2 + 4 * 16 * (max(d, bn) + spad) * 4 + 4 * 16 * (bn + pad) * 2 + 16 * 16 * 4 \
        + 4 * 16 * 4


def attention_flash_forward(q, k, v, causal=False):
    """v3 returning (o, L): FlashAttention-2 on tensor cores (wmma). float16 or bfloat16 q, k, v
    with d in 16, 32, 64, 128; o in the inputs' dtype."""
    q, k, v, squeeze = check_qkv(q, k, v, op="attention_flash (CUDA wmma)", dtypes=HALF, head_dims=WMMA_HEAD_DIMS)
    B, H, nq, nk, d = _shapes(q, k)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return empty_result(q, k, v, squeeze)
    # 16-byte loads: every row must start on a 16-byte boundary (a view at an odd offset is copied).
    q, k, v = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (q, k, v))
    o = torch.empty((B, H, nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    name = f"attn_wmma_kernel<{'__half' if q.dtype == torch.float16 else '__nv_bfloat16'}, {d}>"
    kernel(name)[(cdiv(nq, WMMA_BM), B * H), 128, wmma_smem_bytes(d)](
        q, k, v, o, lse, nq, nk, LOG2E / math.sqrt(d), nk - nq, int(bool(causal)))
    return finish(o, lse, squeeze)


def attention_flash(q, k, v, causal=False):
    """v3: FlashAttention-2 forward on tensor cores."""
    return attention_flash_forward(q, k, v, causal)[0]


LOG2E = 1.4426950408889634


def bwd_smem_bytes(d: int) -> int:
    return 4 * (4 * BWD_TILE * d + 2 * BWD_TILE * (BWD_TILE + 1) + 2 * BWD_TILE)


def attention_backward(q, k, v, o, lse, do, causal=False, dq_mode="separate"):
    """(dq, dk, dv) in float32 SIMT (any float dtype in, gradients in the inputs' dtype), from
    the forward's o and L. ``dq_mode``: "separate" (a second kernel per tile of queries) or
    "atomic" (the key-tile blocks add into dq with atomicAdd)."""
    check_dq_mode(dq_mode)
    q, k, v, squeeze = check_qkv(q, k, v, op="attention_backward (CUDA)", max_d=MAX_D_SIMT)
    o, lse, do = check_backward_inputs(q, o, lse, do, squeeze, op="attention_backward (CUDA)")
    B, H, nq, nk, d = _shapes(q, k)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return zero_grads(q, k, v, squeeze)
    qf, kf, vf = _as_f32(q, k, v)
    of, dof = o.float().contiguous(), do.float().contiguous()
    lsef = lse.float().contiguous()
    delta = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    rows = B * H * nq
    kernel("attn_bwd_delta_kernel")[cdiv(rows, 8), 256](of, dof, delta, rows, d)
    dk = torch.empty((B, H, nk, d), dtype=torch.float32, device=q.device)
    dv = torch.empty((B, H, nk, d), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d)
    smem = bwd_smem_bytes(d)
    if dq_mode == "atomic":
        dq = torch.zeros((B, H, nq, d), dtype=torch.float32, device=q.device)
        kernel("attn_bwd_kv_kernel")[(cdiv(nk, BWD_TILE), B * H), BWD_THREADS, smem](
            qf, kf, vf, dof, lsef, delta, dq, dk, dv, nq, nk, d, scale, nk - nq, int(bool(causal)), 1)
    else:
        dq = torch.empty((B, H, nq, d), dtype=torch.float32, device=q.device)
        kernel("attn_bwd_kv_kernel")[(cdiv(nk, BWD_TILE), B * H), BWD_THREADS, smem](
            qf, kf, vf, dof, lsef, delta, dq, dk, dv, nq, nk, d, scale, nk - nq, int(bool(causal)), 0)
        kernel("attn_bwd_q_kernel")[(cdiv(nq, BWD_TILE), B * H), BWD_THREADS, smem](
            qf, kf, vf, dof, lsef, delta, dq, nq, nk, d, scale, nk - nq, int(bool(causal)))
    return finish_grads(dq, dk, dv, squeeze, q.dtype)


VERSIONS = version_index(SOURCE, v1=attention_naive, v2=attention_rowwise, v3=attention_flash)
REFERENCE = "v3"
attention = VERSIONS[REFERENCE][1]
FORWARDS = OrderedDict(v1=attention_naive_forward, v2=attention_rowwise_forward, v3=attention_flash_forward)
BACKWARDS = version_index(SOURCE, **backward_designs(attention_backward))
