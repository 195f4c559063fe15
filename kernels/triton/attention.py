"""Attention ``softmax(Q Kᵀ / √d) V`` in Triton: from three kernels to FlashAttention-2,
forward and backward.

Versions (``VERSIONS``, naive to best):

    v1  naive: three kernels (scores, row softmax, P V), the N x N scores through memory
        attention_naive(q, k, v, causal)
    v2  one query row per program, K and V streamed through the online softmax
        attention_rowwise(q, k, v, causal): the online softmax of lesson 05
    v3  FlashAttention-2: query tiles, tl.dot on tensor cores, exp2, causal tiles skipped, L saved, autotuned
        attention_flash(q, k, v, causal)

    attention(q, k, v, causal=False)          the reference (v3), returns o
    attention_forward(q, k, v, causal)        v3 returning (o, L), L the logsumexp (B, H, Nq)
    attention_backward(q, k, v, o, L, do, causal, dq_mode="separate" | "atomic")
                                              (dq, dk, dv): P recomputed from L, D = rowsum(dO ∘ O)
    AttentionFunction.apply(q, k, v, causal)  the autograd.Function (forward v3, backward above)
    kernels.ops.attention_op(q, k, v, causal) the same as a torch.library op (course::attention),
                                              registered in kernels/ops.py

The two designs of the backward (``BACKWARDS``, the ``dq_mode`` of attention_backward):

    separate  dK/dV per key tile, then dQ per query tile: two kernels, no atomics
    atomic  dK/dV per key tile, dQ added with tl.atomic_add by every key tile: one kernel

q is (B, H, Nq, d), k and v (B, H, Nk, d), float32, float16 or bfloat16 (3-D (B, N, d) is one
head); strides are passed, so the forwards take transposed views without a copy (the backward
copies non-contiguous q, k and v). o has q's dtype. The causal mask is aligned to the bottom
right: query i sees key j when j <= i + Nk - Nq; a query that sees no key gets o = 0 and
L = +inf. Any d up to 256 works (the head dimension is padded to a power of two >= 16 inside
the kernels, with masked loads). float32 inputs use exact fp32 products
(``input_precision="ieee"``); float16/bfloat16 go through the tensor cores with fp32 accumulation,
P and dS rounded to the inputs' dtype before their products, as FlashAttention does.

The tile sizes are autotuned on a GPU (``runtime.triton_compat.autotune``); in simulation the
first config runs: 16 x 16 tiles, the smallest ``tl.dot`` takes, so that the interpreter is quick.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import version_index
from kernels.frames import attention as frame  # the shared input rules; the reference is frame.attention_ref
from runtime.backends.triton.compat import autotune

import triton
import triton.language as tl

LOG2E = 1.4426950408889634   # log2(e): exp(x) = exp2(x * log2(e))
LN2 = 0.6931471805599453     # ln(2)
MAX_D = 256
#: v3 and the backward also take float64 (float64 accumulators): for gradcheck.
WITH_F64 = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
NAIVE_BLOCK = 1024           # v1's softmax: columns per step
ROW_BLOCK_N = 64             # v2: keys per step


def _block_d(d: int) -> int:
    """The head dimension padded to a power of two. On a GPU at least 32: Triton 3.6's ptxas
    crashed (error -11, sm_90a) on the causal forward with 16-wide tiles of d; a head of 16
    then runs as 32 with the upper half masked."""
    return max(16 if runtime.SIMULATE else 32, triton.next_power_of_2(d))


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


# =========================================================================================
# v1, naive: three kernels. S = Q Kᵀ / √d goes to memory (B·H·Nq·Nk floats), comes back for
# the row softmax (which writes P over S), and again for O = P V.
# =========================================================================================
@triton.jit
def attn_scores_kernel(q_ptr, k_ptr, s_ptr, H, Nq, Nk, D, scale, diag,
                       sqb, sqh, sqm, sqd, skb, skh, skn, skd,
                       CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, pid_n, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D), other=0.0)
    kt = tl.load(k_ptr + b.to(tl.int64) * skb + h * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
                 mask=(offs_n[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee") * scale
    else:
        s = tl.dot(q, kt) * scale
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, s, float("-inf"))
    s_row = s_ptr + bh.to(tl.int64) * Nq * Nk
    tl.store(s_row + offs_m[:, None] * Nk + offs_n[None, :], s,
             mask=(offs_m[:, None] < Nq) & (offs_n[None, :] < Nk))


@triton.jit
def attn_softmax_kernel(s_ptr, lse_ptr, Nk, BLOCK: tl.constexpr):
    # One program per row of S: its max and sum (per lane, merged at the end, as in lesson
    # 05's online softmax), then P = exp(S - m) / l written over S, and L = m + log(l).
    row = tl.program_id(0).to(tl.int64)
    s_row = s_ptr + row * Nk
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for start in range(0, Nk, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(s_row + offs, mask=offs < Nk, other=float("-inf"))
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)   # a lane that has only seen -inf
        l = l * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(tl.where(m == float("-inf"), 0.0, l * tl.exp(m - shift)), axis=0)
    seen = row_sum > 0                                         # False: a row with no visible key
    safe_sum = tl.where(seen, row_sum, 1.0)
    inv = tl.where(seen, 1.0 / safe_sum, 0.0)                  # ... whose P is 0
    for start in range(0, Nk, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(s_row + offs, mask=offs < Nk, other=float("-inf"))
        tl.store(s_row + offs, tl.exp(x - shift) * inv, mask=offs < Nk)
    tl.store(lse_ptr + row, tl.where(seen, shift + tl.log(safe_sum), float("inf")))


@triton.jit
def attn_pv_kernel(p_ptr, v_ptr, o_ptr, H, Nq, Nk, D,
                   svb, svh, svn, svd, sob, soh, som, sod,
                   IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    p_rows = p_ptr + bh.to(tl.int64) * Nq * Nk
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start_n in range(0, Nk, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        p = tl.load(p_rows + offs_m[:, None] * Nk + offs_n[None, :],
                    mask=(offs_m[:, None] < Nq) & (offs_n[None, :] < Nk), other=0.0)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd,
                    mask=(offs_n[:, None] < Nk) & (offs_d[None, :] < D), other=0.0)
        if IEEE:
            acc = tl.dot(p, v, acc, input_precision="ieee", out_dtype=acc.dtype)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
    o_base = o_ptr + b.to(tl.int64) * sob + h * soh
    tl.store(o_base + offs_m[:, None] * som + offs_d[None, :] * sod, acc.to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D))


def attention_naive_forward(q, k, v, causal=False):
    """v1 returning (o, L): the scores S (float32, B·H·Nq·Nk) are written, read by the row
    softmax (which writes P over them) and read again for P V."""
    q, k, v, squeeze = frame.check_qkv(q, k, v, op="attention_naive", max_d=MAX_D, contiguous=False)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.empty_result(q, k, v, squeeze)
    bd = _block_d(d)
    ieee = q.dtype == torch.float32 or q.dtype == torch.float64
    s = torch.empty((B, H, nq, nk), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    o = torch.empty((B, H, nq, d), dtype=q.dtype, device=q.device)
    bm = bn = 32 if runtime.SIMULATE else 64
    attn_scores_kernel[(triton.cdiv(nq, bm), triton.cdiv(nk, bn), B * H)](
        q, k, s, H, nq, nk, d, 1.0 / math.sqrt(d), nk - nq, *_strides(q), *_strides(k),
        CAUSAL=bool(causal), IEEE=ieee, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd)
    block = min(NAIVE_BLOCK, triton.next_power_of_2(nk))
    attn_softmax_kernel[(B * H * nq,)](s, lse, nk, BLOCK=block)
    attn_pv_kernel[(triton.cdiv(nq, bm), B * H)](s, v, o, H, nq, nk, d, *_strides(v), *_strides(o),
                                                  IEEE=ieee, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd)
    return frame.finish(o, lse, squeeze)


def attention_naive(q, k, v, causal=False):
    """v1: three kernels, the N x N scores through memory."""
    return attention_naive_forward(q, k, v, causal)[0]


# =========================================================================================
# v2, one query row per program: the online softmax of lesson 05 over the keys. K and V are
# streamed BLOCK_N rows at a time; the program keeps only its running max m, running sum l
# and the output row acc (d floats). Nothing of size N x N is ever stored.
# =========================================================================================
@triton.jit
def attn_row_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, H, Nq, Nk, D, qk_scale, diag,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                    CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    i, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + i * sqm + offs_d * sqd, mask=dmask, other=0.0)
    q = q.to(tl.float32) * qk_scale               # scores in log2 units: exp(x) = exp2(x log2 e)
    k_base = k_ptr + b.to(tl.int64) * skb + h * skh
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    m = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)   # running max
    l = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)                # running sum of exp2(s - m)
    acc = tl.zeros([BLOCK_D], tl.float32)         # running sum of exp2(s - m) * v
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, i + diag + 1)         # keys after i + Nk - Nq are masked: skip them
    for start in range(0, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        k = tl.load(k_base + offs_n[:, None] * skn + offs_d[None, :] * skd,
                    mask=nmask[:, None] & dmask[None, :], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        s = tl.where(nmask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp2(m - m_new)                # rescales what was summed under the old max
        p = tl.exp2(s - m_new)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd,
                    mask=nmask[:, None] & dmask[None, :], other=0.0)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    empty = l == 0.0                              # no visible key (Nq > Nk, causal)
    out = tl.where(empty, 0.0, acc / tl.where(empty, 1.0, l))
    tl.store(o_ptr + b.to(tl.int64) * sob + h * soh + i * som + offs_d * sod, out.to(o_ptr.dtype.element_ty),
             mask=dmask)
    lse = tl.where(empty, float("inf"), (m + tl.log2(tl.where(empty, 1.0, l))) * 0.6931471805599453)
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + i, lse)


def attention_rowwise_forward(q, k, v, causal=False):
    """v2 returning (o, L): one program per (query row, batch x head)."""
    q, k, v, squeeze = frame.check_qkv(q, k, v, op="attention_rowwise", max_d=MAX_D, contiguous=False)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.empty_result(q, k, v, squeeze)
    o = torch.empty((B, H, nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    bn = min(ROW_BLOCK_N, max(16, triton.next_power_of_2(nk)))
    attn_row_kernel[(nq, B * H)](q, k, v, o, lse, H, nq, nk, d, LOG2E / math.sqrt(d), nk - nq,
                                 *_strides(q), *_strides(k), *_strides(v), *_strides(o),
                                 CAUSAL=bool(causal), BLOCK_N=bn, BLOCK_D=_block_d(d))
    return frame.finish(o, lse, squeeze)


def attention_rowwise(q, k, v, causal=False):
    """v2: one query row per program, online softmax."""
    return attention_rowwise_forward(q, k, v, causal)[0]


# =========================================================================================
# v3, FlashAttention-2. A program owns BLOCK_M queries (of one batch and head) and loops over
# the keys BLOCK_N at a time: S = Q Kᵀ on the tensor cores, the running max m and sum l of each
# row, acc rescaled by alpha = exp(m_old - m_new) whenever a tile raises the max, acc += P V.
# At the end o = acc / l and L = m + log(l) is saved for the backward. Everything of size
# N x N stays on chip; Q, K, V are read once per program and O is written once.
#
# exp2 instead of exp: exp(x) = exp2(x · log2 e), and log2(e)/√d is folded into one
# constant (qk_scale), so the scores cost one multiply each; the max and L live in log2
# units until L is stored (times ln 2).
#
# The key loop has two stages. Tiles every query of the program sees in full need no mask
# (stage 1, the fast loop). The tiles on the causal diagonal, and the last tile when Nk is
# not a multiple of BLOCK_N, are masked (stage 2). With the causal mask, tiles above the
# diagonal are not visited at all: half the work.
# =========================================================================================
@triton.jit
def _flash_fwd_stage(acc, l_i, m_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D, Nk, diag,
                     qk_scale, lo, hi, MASKED: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                     EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        kt_ptrs = k_base + offs_n[None, :] * skn + offs_d[:, None] * skd
        v_ptrs = v_base + offs_n[:, None] * svn + offs_d[None, :] * svd
        if MASKED:
            kt = tl.load(kt_ptrs, mask=(offs_n[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
        elif EVEN_D:
            kt = tl.load(kt_ptrs)
        else:
            kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        if IEEE:
            qk = tl.dot(q, kt, input_precision="ieee")
        else:
            qk = tl.dot(q, kt)
        if MASKED:
            keep = offs_n[None, :] < Nk
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no visible key yet has m_new = -inf: shift by 0 there, so that
            # exp2(-inf - 0) = 0 instead of exp2(-inf - (-inf)) = NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(qk - m_shift[:, None])
            alpha = tl.exp2(m_i - m_shift)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < Nk) & (offs_d[None, :] < D), other=0.0)
        elif EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
        if IEEE:
            acc = tl.dot(p, v, acc, input_precision="ieee", out_dtype=acc.dtype)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, H, Nq, Nk, D, qk_scale, diag,
                          sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                          N_KEY, CAUSAL: tl.constexpr, IEEE: tl.constexpr, EVEN_D: tl.constexpr,
                          ACC_DT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = q_ptr + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D), other=0.0)
    k_base = k_ptr + b.to(tl.int64) * skb + h * skh
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    # float32 running statistics and accumulator (float64 for float64 inputs: gradcheck).
    m_i = tl.full([BLOCK_M], float("-inf"), ACC_DT)
    l_i = tl.zeros([BLOCK_M], ACC_DT)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC_DT)
    full = (Nk // BLOCK_N) * BLOCK_N              # keys in whole tiles
    if CAUSAL:
        # Key j is visible to query i when j <= i + diag (diag = Nk - Nq). Every query of this
        # tile sees the keys below start_m + diag + 1 in full; none sees a key past
        # start_m + BLOCK_M - 1 + diag.
        lo = tl.minimum((tl.maximum(start_m + diag + 1, 0) // BLOCK_N) * BLOCK_N, full)
        hi = tl.minimum(Nk, tl.maximum(start_m + BLOCK_M + diag, 0))
    else:
        lo = full
        hi = Nk
    acc, l_i, m_i = _flash_fwd_stage(acc, l_i, m_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D,
                                     Nk, diag, qk_scale, 0, lo, False, CAUSAL, IEEE, EVEN_D, BLOCK_N)
    acc, l_i, m_i = _flash_fwd_stage(acc, l_i, m_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D,
                                     Nk, diag, qk_scale, lo, hi, True, CAUSAL, IEEE, EVEN_D, BLOCK_N)
    empty = l_i == 0.0                            # a query that sees no key
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    o_ptrs = o_ptr + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D))
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, lse.to(tl.float32), mask=offs_m < Nq)


# Tiles (BLOCK_M, BLOCK_N, num_warps, num_stages). In simulation one config runs: 32 x 32 tiles
# (the interpreter pays per operation, so fewer, larger tiles are quicker, and 130 keys still
# take 5 tiles). On a GPU, short sequences run a fixed config (autotuning would time every
# config again for each new length), long ones the autotuner's pick among a few candidates per
# head dimension. The candidates are the configs that compile for an H100 (sm_90) without
# spilling registers, as ptxas reports (Triton's own FlashAttention tutorial explores the same
# ranges); benchmarks/tune/attention_tune.py times a wider set on a GPU.
SIM_TILE = (32, 32, 4, 1)
#: From this length (max(Nq, Nk)) on, and for d <= 128 in float16/bfloat16, a GPU autotunes.
TUNE_MIN_N = 1024
FWD_CANDIDATES = {64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3), (64, 64, 4, 3)],
                  128: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)]}
BWD_KV_CANDIDATES = {64: [(64, 128, 8, 3), (32, 128, 8, 2), (64, 64, 4, 3)],
                     128: [(32, 64, 4, 3), (32, 128, 8, 2), (64, 128, 8, 3)]}
BWD_Q_CANDIDATES = {64: [(128, 64, 8, 3), (128, 32, 4, 3), (128, 32, 8, 2)],
                    128: [(128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 3)]}
#: The atomic design is not autotuned (timing a config runs it, and every run adds into dq).
BWD_ATOMIC_TILE = {64: (64, 64, 8, 3), 128: (64, 64, 8, 3)}


_HEAD_DIMS: dict = {}   # id(config) -> the head dimensions it is a candidate for


def _configs(tiles_by_d):
    out = {}
    for d, tiles in tiles_by_d.items():
        for tile in tiles:
            if tile not in out:
                m, n, w, st = tile
                out[tile] = triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st)
            _HEAD_DIMS.setdefault(id(out[tile]), set()).add(d)
    return list(out.values())


def _prune_by_head_dim(configs, named_args, **kwargs):
    """The candidates of this head dimension (BLOCK_D 16 and 32 take those of 64)."""
    bd = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    want = 64 if bd <= 64 else 128
    return [c for c in configs if want in _HEAD_DIMS.get(id(c), {want})] or configs[:1]


def _tuned(kernel, candidates, key):
    if runtime.SIMULATE:  # runtime.triton_compat.autotune runs the first config: SIM_TILE
        return autotune(configs=_configs({64: [SIM_TILE]}), key=key)(kernel)
    return autotune(configs=_configs(candidates), key=key,
                    prune_configs_by={"early_config_prune": _prune_by_head_dim})(kernel)


def _meta(tile):
    m, n, w, st = tile
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)


def _use_tuned(q, nq, nk, d) -> bool:
    return not runtime.SIMULATE and max(nq, nk) >= TUNE_MIN_N and d <= 128 and q.dtype in (torch.float16,
                                                                                      torch.bfloat16)


def _fixed_tile(q, d):
    """The tile of a launch that is not autotuned: short sequences, float32 and float64 (whose
    exact products run on the CUDA cores and need small tiles not to spill), d > 128."""
    if runtime.SIMULATE:
        return SIM_TILE
    if q.dtype in (torch.float32, torch.float64):
        return (32, 32, 4, 2)
    return (64, 64, 4, 2) if d <= 64 else (32, 64, 4, 2) if d <= 128 else (16, 32, 4, 1)


attn_flash_fwd = _tuned(attn_flash_fwd_kernel, FWD_CANDIDATES, ["N_KEY", "BLOCK_D", "CAUSAL"])


def _launch(tuned, raw, grid_of, args, meta, use_tuned, tile):
    """Run the autotuned kernel, or the plain one with ``tile``. ``grid_of(BLOCK_M, BLOCK_N)``."""
    if use_tuned:
        tuned[lambda m: grid_of(m["BLOCK_M"], m["BLOCK_N"])](*args, **meta)
    else:
        raw[grid_of(tile[0], tile[1])](*args, **meta, **_meta(tile))


def _acc_dt(q):
    """The accumulators' dtype: float32, float64 for float64 inputs (gradcheck)."""
    return tl.float64 if q.dtype == torch.float64 else tl.float32


def _n_key(n: int) -> int:
    """The autotuning key of a length: its power of two (so awkward lengths reuse a tuning)."""
    return triton.next_power_of_2(max(int(n), 1))


def attention_forward(q, k, v, causal=False, out=None):
    """v3 returning (o, L): o of q's dtype, L (B, H, Nq) float32 in natural log. ``out``: an
    ``(o, L)`` to write into instead (o may be a strided view: a training step passes the
    (B, T, H, d) layout its next matmul reads, transposed, so no copy is made)."""
    q, k, v, squeeze = frame.check_qkv(q, k, v, op="attention_flash", dtypes=WITH_F64, max_d=MAX_D, contiguous=False)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.empty_result(q, k, v, squeeze)
    if out is not None:
        o, lse = frame.check_out(out, [(B, H, nq, d), (B, H, nq)], [q.dtype, torch.float32], op="attention_forward")
    else:
        o = torch.empty((B, H, nq, d), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    bd = _block_d(d)

    args = (q, k, v, o, lse, H, nq, nk, d, LOG2E / math.sqrt(d), nk - nq,
            *_strides(q), *_strides(k), *_strides(v), *_strides(o), _n_key(max(nq, nk)))
    meta = dict(CAUSAL=bool(causal), IEEE=q.dtype in (torch.float32, torch.float64), EVEN_D=bd == d,
                ACC_DT=_acc_dt(q), BLOCK_D=bd)
    _launch(attn_flash_fwd, attn_flash_fwd_kernel, lambda bm, bn: (triton.cdiv(nq, bm), B * H), args, meta,
            _use_tuned(q, nq, nk, d), _fixed_tile(q, d))
    return frame.finish(o, lse, squeeze)


def attention_flash(q, k, v, causal=False):
    """v3: FlashAttention-2 forward, returns o."""
    return attention_forward(q, k, v, causal)[0]


# =========================================================================================
# The backward. With P = exp(S - L) recomputed from the saved L (no N x N tensor kept), and
# D = rowsum(dO ∘ O) (= rowsum(P ∘ dP)):
#     dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - D),   dQ = scale · dS K,   dK = scale · dSᵀ Q.
# A program that owns a tile of keys sums dV and dK over all queries in registers, but dQ
# needs a sum over all keys: either every key-tile program adds its share into dQ with
# atomics (dq_mode="atomic"), or a second kernel owns tiles of queries and loops over the
# keys (dq_mode="separate", deterministic, no atomics: the reference).
# =========================================================================================
@triton.jit
def attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, H, Nq, D, sob, soh, som, sod, sdb, sdh, sdm, sdd,
                          ACC_DT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)
    o = tl.load(o_ptr + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                mask=mask, other=0.0)
    do = tl.load(do_ptr + b.to(tl.int64) * sdb + h * sdh + offs_m[:, None] * sdm + offs_d[None, :] * sdd,
                 mask=mask, other=0.0)
    delta = tl.sum(o.to(ACC_DT) * do.to(ACC_DT), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * Nq + offs_m, delta, mask=offs_m < Nq)


@triton.jit
def _bwd_kv_stage(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, sqm, sqd, sdm, sdd,
                  sgm, sgd, offs_n, offs_d, D, Nq, diag, qk_scale, scale, lo, hi,
                  MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        mrow = offs_m < Nq
        qt = tl.load(q_base + offs_m[None, :] * sqm + offs_d[:, None] * sqd,
                     mask=mrow[None, :] & (offs_d[:, None] < D), other=0.0)
        do = tl.load(do_base + offs_m[:, None] * sdm + offs_d[None, :] * sdd,
                     mask=mrow[:, None] & (offs_d[None, :] < D), other=0.0)
        # L in log2 units; +inf past Nq (and for queries that see no key): their P is 0.
        lse2 = tl.load(lse_base + offs_m, mask=mrow, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=mrow, other=0.0)
        if IEEE:
            st = tl.dot(k, qt, input_precision="ieee")          # Sᵀ: (BLOCK_N, BLOCK_M)
        else:
            st = tl.dot(k, qt)
        pt = tl.exp2(st * qk_scale - lse2[None, :])
        if MASKED:
            pt = tl.where(offs_n[:, None] <= offs_m[None, :] + diag, pt, 0.0)
        if IEEE:
            dv = tl.dot(pt, do, dv, input_precision="ieee", out_dtype=dv.dtype)
            dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
        else:
            dv = tl.dot(pt.to(do.dtype), do, dv)
            dpt = tl.dot(v, tl.trans(do))
        dst = pt * (dpt - delta[None, :])                       # dSᵀ
        if IEEE:
            dk = tl.dot(dst, tl.trans(qt), dk, input_precision="ieee", out_dtype=dk.dtype)
        else:
            dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk)
        if ATOMIC_DQ:
            # This program's share of dQ for these queries: scale · dS K, added atomically
            # because the programs of every other key tile add into the same rows.
            if IEEE:
                dq = tl.dot(tl.trans(dst), k, input_precision="ieee") * scale
            else:
                dq = tl.dot(tl.trans(dst.to(k.dtype)), k) * scale
            tl.atomic_add(dq_base + offs_m[:, None] * sgm + offs_d[None, :] * sgd, dq,
                          mask=mrow[:, None] & (offs_d[None, :] < D))
    return dk, dv


@triton.jit
def attn_bwd_kv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
                       H, Nq, Nk, D, qk_scale, scale, diag,
                       sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                       sgb, sgh, sgm, sgd, N_KEY,
                       CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, IEEE: tl.constexpr, ACC_DT: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program per tile of BLOCK_N keys: dK and dV of those keys, summed over the queries.
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < Nk) & (offs_d[None, :] < D)
    k = tl.load(k_ptr + b.to(tl.int64) * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + b.to(tl.int64) * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC_DT)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC_DT)
    q_base = q_ptr + b.to(tl.int64) * sqb + h * sqh
    do_base = do_ptr + b.to(tl.int64) * sdb + h * sdh
    dq_base = dq_ptr + b.to(tl.int64) * sgb + h * sgh
    lse_base = lse_ptr + bh.to(tl.int64) * Nq
    delta_base = delta_ptr + bh.to(tl.int64) * Nq
    if CAUSAL:
        # Query i sees key j when i >= j - diag. The first query that sees a key of this tile:
        # start_n - diag; every query from start_n + BLOCK_N - 1 - diag on sees all of them.
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M,
                         tl.cdiv(Nq, BLOCK_M) * BLOCK_M)
        mid = tl.maximum(mid, lo)
        dk, dv = _bwd_kv_stage(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, sqm, sqd, sdm, sdd,
                               sgm, sgd, offs_n, offs_d, D, Nq, diag, qk_scale, scale, lo, mid,
                               True, ATOMIC_DQ, IEEE, BLOCK_M)
    else:
        mid = 0
    dk, dv = _bwd_kv_stage(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, sqm, sqd, sdm, sdd,
                           sgm, sgd, offs_n, offs_d, D, Nq, diag, qk_scale, scale, mid, Nq,
                           False, ATOMIC_DQ, IEEE, BLOCK_M)
    out_off = b.to(tl.int64) * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd
    tl.store(dk_ptr + out_off, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + out_off, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_q_stage(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D, Nk, diag,
                 qk_scale, lo, hi, MASKED: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        kmask = (offs_n[None, :] < Nk) & (offs_d[:, None] < D)
        kt = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=kmask, other=0.0)
        vt = tl.load(v_base + offs_n[None, :] * svn + offs_d[:, None] * svd, mask=kmask, other=0.0)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        p = tl.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where((offs_n[None, :] <= offs_m[:, None] + diag) & (offs_n[None, :] < Nk), p, 0.0)
        if IEEE:
            dp = tl.dot(do, vt, input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds, tl.trans(kt), dq, input_precision="ieee", out_dtype=dq.dtype)
        else:
            dp = tl.dot(do, vt)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)
    return dq


@triton.jit
def attn_bwd_q_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                      H, Nq, Nk, D, qk_scale, scale, diag,
                      sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd, N_KEY,
                      CAUSAL: tl.constexpr, IEEE: tl.constexpr, ACC_DT: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program per tile of BLOCK_M queries: dQ of those queries, summed over the keys.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mrow = offs_m < Nq
    qmask = mrow[:, None] & (offs_d[None, :] < D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=qmask, other=0.0)
    do = tl.load(do_ptr + b.to(tl.int64) * sdb + h * sdh + offs_m[:, None] * sdm + offs_d[None, :] * sdd,
                 mask=qmask, other=0.0)
    lse2 = tl.load(lse_ptr + bh.to(tl.int64) * Nq + offs_m, mask=mrow, other=float("inf")) * 1.4426950408889634
    delta = tl.load(delta_ptr + bh.to(tl.int64) * Nq + offs_m, mask=mrow, other=0.0)
    k_base = k_ptr + b.to(tl.int64) * skb + h * skh
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC_DT)
    if CAUSAL:
        lo = tl.minimum((tl.maximum(start_m + diag + 1, 0) // BLOCK_N) * BLOCK_N, tl.cdiv(Nk, BLOCK_N) * BLOCK_N)
        hi = tl.minimum(Nk, tl.maximum(start_m + BLOCK_M + diag, 0))
        dq = _bwd_q_stage(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D, Nk, diag,
                          qk_scale, 0, lo, False, IEEE, BLOCK_N)
        dq = _bwd_q_stage(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D, Nk, diag,
                          qk_scale, lo, hi, True, IEEE, BLOCK_N)
    else:
        dq = _bwd_q_stage(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, D, Nk, diag,
                          qk_scale, 0, Nk, False, IEEE, BLOCK_N)
    tl.store(dq_ptr + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=qmask)


attn_bwd_kv = _tuned(attn_bwd_kv_kernel, BWD_KV_CANDIDATES, ["N_KEY", "BLOCK_D", "CAUSAL", "ATOMIC_DQ"])
attn_bwd_q = _tuned(attn_bwd_q_kernel, BWD_Q_CANDIDATES, ["N_KEY", "BLOCK_D", "CAUSAL"])


def _bwd_main(q, k, v, do, lse, delta, dq, dk, dv, causal, use_tuned, tile):
    """The two kernels of the "separate" design (dK/dV per key tile, then dQ per query tile)."""
    B, H, nq, d = q.shape
    nk = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    common = (H, nq, nk, d, LOG2E * scale, scale, nk - nq)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    meta = dict(CAUSAL=bool(causal), IEEE=q.dtype in (torch.float32, torch.float64), ACC_DT=_acc_dt(q),
                BLOCK_D=_block_d(d))
    key = _n_key(max(nq, nk))
    # dq is not written by the first kernel (ATOMIC_DQ=False): its strides are not used.
    _launch(attn_bwd_kv, attn_bwd_kv_kernel, lambda bm, bn: (triton.cdiv(nk, bn), B * H),
            (q, k, v, do, lse, delta, dq, dk, dv, *common, *strides, 0, 0, 0, 0, key), dict(meta, ATOMIC_DQ=False),
            use_tuned, tile)
    _launch(attn_bwd_q, attn_bwd_q_kernel, lambda bm, bn: (triton.cdiv(nq, bm), B * H),
            (q, k, v, do, lse, delta, dq, *common, *strides, key), meta, use_tuned, tile)


def attention_backward(q, k, v, o, lse, do, causal=False, dq_mode="separate", out=None):
    """(dq, dk, dv) of ``o = attention(q, k, v)`` for the upstream gradient ``do``, from the
    forward's o and L. ``dq_mode``: "separate" (a second kernel owns tiles of queries: no
    atomics, deterministic) or "atomic" (every key-tile program adds into dq atomically).
    ``out``: a ``(dq, dk, dv)`` to write into ("separate" only), dq with q's strides and dk,
    dv with k's (a training step passes views of one (B, T, 3, H, d) buffer, the layout of the
    q, k, v it took apart: then q, k and v need not be contiguous)."""
    frame.check_dq_mode(dq_mode)
    # Contiguous q, k and v unless ``out`` is given: the kernels write dq with q's strides and
    # dk, dv with k's (o and do may have any strides: theirs are passed).
    q, k, v, squeeze = frame.check_qkv(q, k, v, op="attention_backward", dtypes=WITH_F64, max_d=MAX_D,
                                       contiguous=out is None)
    o, lse, do = frame.check_backward_inputs(q, o, lse, do, squeeze, op="attention_backward", same_dtype=True)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    lse = lse.float().contiguous()
    if out is not None:
        if dq_mode != "separate":
            raise ValueError("attention_backward: out= is for dq_mode='separate' (the atomic mode sums dq in float32)")
        dq, dk, dv = frame.check_out(out, [tuple(q.shape), tuple(k.shape), tuple(k.shape)], [q.dtype] * 3,
                                     op="attention_backward")
        if dq.stride() != q.stride() or dk.stride() != k.stride() or dv.stride() != k.stride() \
                or v.stride() != k.stride():
            raise ValueError("attention_backward: out= needs dq with q's strides, and v, dk, dv with k's "
                             f"(q {q.stride()}, k {k.stride()}, v {v.stride()}; dq {dq.stride()}, "
                             f"dk {dk.stride()}, dv {dv.stride()})")
    else:
        dk = torch.empty((B, H, nk, d), dtype=q.dtype, device=q.device)
        dv = torch.empty((B, H, nk, d), dtype=q.dtype, device=q.device)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format) if out is None else dq.zero_()
        dk.zero_(), dv.zero_()
        return frame.finish_grads(dq, dk, dv, squeeze)
    bd = _block_d(d)
    ieee = q.dtype in (torch.float32, torch.float64)
    acc_dt = _acc_dt(q)
    delta = torch.empty((B, H, nq), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                        device=q.device)
    pre = 32 if runtime.SIMULATE else 64
    attn_bwd_delta_kernel[(triton.cdiv(nq, pre), B * H)](o, do, delta, H, nq, d, *_strides(o), *_strides(do),
                                                         ACC_DT=acc_dt, BLOCK_M=pre, BLOCK_D=bd)
    use_tuned = _use_tuned(q, nq, nk, d)
    tile = _fixed_tile(q, d)
    if dq_mode == "atomic":
        # Not autotuned: timing a config runs it, and every run adds into dq.
        dq32 = torch.zeros((B, H, nq, d), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                           device=q.device)
        scale = 1.0 / math.sqrt(d)
        bm, bn, w, st = tile if not use_tuned else BWD_ATOMIC_TILE[64 if d <= 64 else 128]
        attn_bwd_kv_kernel[(triton.cdiv(nk, bn), B * H)](
            q, k, v, do, lse, delta, dq32, dk, dv, H, nq, nk, d, LOG2E * scale, scale, nk - nq,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq32), _n_key(max(nq, nk)),
            CAUSAL=bool(causal), ATOMIC_DQ=True, IEEE=ieee, ACC_DT=acc_dt, BLOCK_D=bd, BLOCK_M=bm, BLOCK_N=bn,
            num_warps=w, num_stages=st)
        dq = dq32.to(q.dtype)
    else:
        if out is None:
            dq = torch.empty((B, H, nq, d), dtype=q.dtype, device=q.device)
        _bwd_main(q, k, v, do, lse, delta, dq, dk, dv, causal, use_tuned, tile)
    return frame.finish_grads(dq, dk, dv, squeeze)


def attention_backward_with_delta(q, k, v, lse, do, delta, causal=False):
    """(dq, dk, dv) from a D = rowsum(dO ∘ O) computed elsewhere (lesson 10's exercise computes
    it): the two kernels of the "separate" design, with 4-D contiguous q, k, v, do."""
    B, H, nq, d = q.shape
    nk = k.shape[2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _bwd_main(q, k, v, do, lse.float().contiguous(), delta, dq, dk, dv, causal, _use_tuned(q, nq, nk, d),
              _fixed_tile(q, d))
    return dq, dk, dv


# =========================================================================================
# Autograd: an autograd.Function. The same kernels as a torch.library op with a fake kernel,
# course::attention, are in kernels/ops.py (kernels.ops.attention_op).
# =========================================================================================
class AttentionFunction(torch.autograd.Function):
    """``AttentionFunction.apply(q, k, v, causal)``: v3 forward, the backward above."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        o, lse = attention_forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = bool(causal)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do.contiguous(), ctx.causal)
        return dq, dk, dv, None


VERSIONS = version_index(__doc__, v1=attention_naive, v2=attention_rowwise, v3=attention_flash)
REFERENCE = "v3"
attention = VERSIONS[REFERENCE][1]
#: (o, L) of each version, for tests and the lesson.
FORWARDS = OrderedDict(v1=attention_naive_forward, v2=attention_rowwise_forward, v3=attention_forward)
#: The two designs of the backward: name -> (description, fn(q, k, v, o, L, do, causal)).
BACKWARDS = version_index(__doc__, **frame.backward_designs(attention_backward))
