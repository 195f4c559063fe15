"""Attention ``softmax(Q Kᵀ / √d) V`` in Numba (``numba.cuda.jit``), float32, forward and backward.

Versions (``VERSIONS``, naive to best; ``attention(q, k, v, causal=False)`` is the reference, v3):

    v1  naive: three kernels (scores, row softmax, P V), the N x N scores through memory
        attention_naive(q, k, v, causal)
    v2  one query row per block, online softmax over chunks of keys
        attention_rowwise(q, k, v, causal)
    v3  FlashAttention-2: 16 x 16 tiles of queries and keys in shared memory (float32 SIMT)
        attention_flash(q, k, v, causal)

and the backward, ``attention_backward(q, k, v, o, L, do, causal, dq_mode="separate" | "atomic")``,
whose two designs are ``BACKWARDS``:

    separate  dK/dV per key tile, then dQ per query tile: no atomics
    atomic  dK/dV per key tile, dQ added with cuda.atomic.add

q (B, H, Nq, d), k and v (B, H, Nk, d), d <= 128; float32, float16 or bfloat16 in (computed in
float32, o returned in the inputs' dtype). The causal mask is aligned to the bottom right
(query i sees key j when j <= i + Nk - Nq); a query that sees no key gets o = 0, L = +inf.
In simulation every CUDA thread is a Python thread: keep the shapes small there.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index
from kernels.frames import attention as frame  # the shared input rules; the reference is frame.attention_ref

# lesson 05's block reductions, which every thread gets the result of (blockDim.x a multiple of 32)
from kernels.numba.reduction import block_max_all, block_sum_all, warp_max_all, warp_sum_all  # noqa: F401

from numba import cuda, float32

INF = math.inf
MAX_D = 128
#: v2: threads per block (one row per block; at least d of them own an output column).
ROW_THREADS = 128
#: v3 and the backward: tiles of T queries x T keys, T x T threads per block; each thread owns
#: the columns c, c + T, ... (at most MAX_D / T of them).
T = 16
TPAD = T + 1            # a padded row of a T x T tile in shared memory (a constant: Numba needs one)
COLS = MAX_D // T


# ---------------------------------------------------------------------------------------
# v1, naive: S = Q Kᵀ / √d to memory, the row softmax over it (P written over S), O = P V.
# Arrays are 3-D (BH, N, d): blockIdx.z is the batch x head.
@cuda.jit
def attn_scores_kernel(q, k, s, scale, diag, causal):
    j, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    nq, d = q.shape[1], q.shape[2]
    nk = k.shape[1]
    if i < nq and j < nk:
        acc = float32(0.0)
        for c in range(d):
            acc += q[bh, i, c] * k[bh, j, c]
        acc *= scale
        if causal and j > i + diag:
            acc = float32(-INF)
        s[bh, i, j] = acc


@cuda.jit
def attn_softmax_kernel(s, lse):
    scratch = cuda.shared.array(32, float32)
    bh, i = cuda.blockIdx.y, cuda.blockIdx.x
    nk = s.shape[2]
    m = float32(-INF)
    for j in range(cuda.threadIdx.x, nk, cuda.blockDim.x):
        m = max(m, s[bh, i, j])
    m = block_max_all(m, scratch)
    shift = float32(0.0) if m == -INF else m       # a row with no visible key: every p is 0
    l = float32(0.0)
    for j in range(cuda.threadIdx.x, nk, cuda.blockDim.x):
        l += math.exp(s[bh, i, j] - shift)
    l = block_sum_all(l, scratch)
    inv = float32(1.0) / l if l > 0 else float32(0.0)
    for j in range(cuda.threadIdx.x, nk, cuda.blockDim.x):
        s[bh, i, j] = math.exp(s[bh, i, j] - shift) * inv
    if cuda.threadIdx.x == 0:
        lse[bh, i] = shift + math.log(l) if l > 0 else float32(INF)


@cuda.jit
def attn_pv_kernel(p, v, o):
    c, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    nq, nk, d = p.shape[1], p.shape[2], v.shape[2]
    if i < nq and c < d:
        acc = float32(0.0)
        for j in range(nk):
            acc += p[bh, i, j] * v[bh, j, c]
        o[bh, i, c] = acc


# ---------------------------------------------------------------------------------------
# v2, one query row per block: chunks of blockDim.x keys, thread t scores key j0 + t; every
# thread keeps the running max m and sum l, thread t < d owns output column t and rescales it
# by alpha = exp(m_old - m_new) before adding the chunk's p · v (p through shared memory).
@cuda.jit
def attn_row_kernel(q, k, v, o, lse, scale, diag, causal):
    q_s = cuda.shared.array(MAX_D, float32)
    p_s = cuda.shared.array(ROW_THREADS, float32)
    scratch = cuda.shared.array(32, float32)
    t, i, bh = cuda.threadIdx.x, cuda.blockIdx.x, cuda.blockIdx.y
    nk, d = k.shape[1], k.shape[2]
    if t < d:
        q_s[t] = q[bh, i, t] * scale
    cuda.syncthreads()
    hi = min(nk, i + diag + 1) if causal else nk
    m = float32(-INF)
    l = float32(0.0)
    acc = float32(0.0)
    for j0 in range(0, hi, ROW_THREADS):
        j = j0 + t
        s = float32(-INF)
        if j < hi:
            s = float32(0.0)
            for c in range(d):
                s += q_s[c] * k[bh, j, c]
        m_new = max(m, block_max_all(s, scratch))   # finite: the chunk has a visible key
        p = math.exp(s - m_new) if j < hi else float32(0.0)
        p_s[t] = p
        alpha = math.exp(m - m_new)
        l = l * alpha + block_sum_all(p, scratch)  # its barriers also publish p_s
        if t < d:
            acc *= alpha
            for jj in range(min(ROW_THREADS, hi - j0)):
                acc += p_s[jj] * v[bh, j0 + jj, t]
        m = m_new
        cuda.syncthreads()                         # p_s is read by all before the next chunk
    if t < d:
        o[bh, i, t] = acc / l if l > 0 else float32(0.0)
    if t == 0:
        lse[bh, i] = m + math.log(l) if l > 0 else float32(INF)


# ---------------------------------------------------------------------------------------
# Tiles of T keys or T queries to shared memory (v3 and the backward), T x T threads a block.
@cuda.jit(device=True)
def _load_keys(k, v, k_s, v_s, bh, j0, nk, d):
    # Thread (r, c) loads key j0 + r, columns c, c + T, ... of K and V (0 past the end).
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    for cc in range(c, d, T):
        k_s[r, cc] = k[bh, j0 + r, cc] if j0 + r < nk else float32(0.0)
        v_s[r, cc] = v[bh, j0 + r, cc] if j0 + r < nk else float32(0.0)


@cuda.jit(device=True)
def _load_queries(q, do, lse, delta, q_s, do_s, lse_s, delta_s, bh, i0, nq, d):
    # Thread (r, c) loads query i0 + r, columns c, c + T, ... of Q and dO, and column 0 its L
    # and D (past the end: zeros and L = +inf, so that P = 0).
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    i = i0 + r
    for cc in range(c, d, T):
        q_s[r, cc] = q[bh, i, cc] if i < nq else float32(0.0)
        do_s[r, cc] = do[bh, i, cc] if i < nq else float32(0.0)
    if c == 0:
        lse_s[r] = lse[bh, i] if i < nq else float32(INF)
        delta_s[r] = delta[bh, i] if i < nq else float32(0.0)


# ---------------------------------------------------------------------------------------
# v3, FlashAttention-2 with shared-memory tiles: a block of T x T threads owns T queries;
# thread (r, c) = (threadIdx.y, threadIdx.x) scores key j0 + c for query r, then owns the
# output columns c, c + T, ... of query r. Per tile of T keys: K and V tiles to shared memory,
# the T x T scores to shared memory, each row's max and sum (every thread of the row reads
# the row: no extra barrier), P, then acc = acc * alpha + P V.
@cuda.jit
def attn_flash_kernel(q, k, v, o, lse, scale, diag, causal):
    q_s = cuda.shared.array((T, MAX_D), float32)
    k_s = cuda.shared.array((T, MAX_D), float32)
    v_s = cuda.shared.array((T, MAX_D), float32)
    p_s = cuda.shared.array((T, TPAD), float32)
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    bh = cuda.blockIdx.y
    i0 = cuda.blockIdx.x * T
    i = i0 + r
    nq, d = q.shape[1], q.shape[2]
    nk = k.shape[1]
    for cc in range(c, d, T):
        q_s[r, cc] = q[bh, i, cc] * scale if i < nq else float32(0.0)
    acc = cuda.local.array(COLS, float32)
    for u in range(COLS):
        acc[u] = float32(0.0)
    m = float32(-INF)
    l = float32(0.0)
    hi = min(nk, max(i0 + T + diag, 0)) if causal else nk    # tiles past hi: hidden from every row
    for j0 in range(0, hi, T):
        cuda.syncthreads()                         # the previous tiles are no longer read (and q_s is complete)
        _load_keys(k, v, k_s, v_s, bh, j0, nk, d)
        cuda.syncthreads()                         # K and V tiles complete
        j = j0 + c
        s = float32(0.0)
        for cc in range(d):
            s += q_s[r, cc] * k_s[c, cc]
        if j >= nk or (causal and j > i + diag):
            s = float32(-INF)
        p_s[r, c] = s
        cuda.syncthreads()                         # the row's scores are complete
        tile_max = float32(-INF)
        for jj in range(T):
            tile_max = max(tile_max, p_s[r, jj])
        m_new = max(m, tile_max)
        shift = float32(0.0) if m_new == -INF else m_new
        alpha = math.exp(m - shift)
        tile_sum = float32(0.0)
        for jj in range(T):
            tile_sum += math.exp(p_s[r, jj] - shift)
        cuda.syncthreads()                         # every thread of the row has read the scores
        p_s[r, c] = math.exp(s - shift)
        cuda.syncthreads()                         # P is complete
        l = l * alpha + tile_sum
        u = 0
        for cc in range(c, d, T):
            a = acc[u] * alpha
            for jj in range(T):
                a += p_s[r, jj] * v_s[jj, cc]
            acc[u] = a
            u += 1
        m = m_new
    if i < nq:
        u = 0
        for cc in range(c, d, T):
            o[bh, i, cc] = acc[u] / l if l > 0 else float32(0.0)
            u += 1
        if c == 0:
            lse[bh, i] = m + math.log(l) if l > 0 else float32(INF)


# ---------------------------------------------------------------------------------------
# The backward: P = exp(S - L), D = rowsum(dO ∘ O), dV = Pᵀ dO, dS = P ∘ (dO Vᵀ - D),
# dQ = scale dS K, dK = scale dSᵀ Q. Tiles of T queries x T keys, T x T threads.
@cuda.jit
def attn_bwd_delta_kernel(o, do, delta):
    i, bh = cuda.grid(2)
    if i < o.shape[1] and bh < o.shape[0]:
        acc = float32(0.0)
        for c in range(o.shape[2]):
            acc += o[bh, i, c] * do[bh, i, c]
        delta[bh, i] = acc


@cuda.jit(device=True)
def _p_and_ds(q_s, k_s, v_s, do_s, lse_s, delta_s, p_s, ds_s, i0, j0, nq, nk, d, scale, diag, causal):
    # Thread (r, c): query i0 + r and key j0 + c.
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    i, j = i0 + r, j0 + c
    s = float32(0.0)
    dp = float32(0.0)
    for cc in range(d):
        s += q_s[r, cc] * k_s[c, cc]
        dp += do_s[r, cc] * v_s[c, cc]
    visible = i < nq and j < nk and not (causal and j > i + diag)
    p = math.exp(s * scale - lse_s[r]) if visible else float32(0.0)
    p_s[r, c] = p
    ds_s[r, c] = p * (dp - delta_s[r])


@cuda.jit
def attn_bwd_kv_kernel(q, k, v, do, lse, delta, dq, dk, dv, scale, diag, causal, dq_atomic):
    # A block per tile of T keys. Thread (r, c) owns key j0 + r, columns c, c + T, ... of dK, dV.
    k_s = cuda.shared.array((T, MAX_D), float32)
    v_s = cuda.shared.array((T, MAX_D), float32)
    q_s = cuda.shared.array((T, MAX_D), float32)
    do_s = cuda.shared.array((T, MAX_D), float32)
    p_s = cuda.shared.array((T, TPAD), float32)
    ds_s = cuda.shared.array((T, TPAD), float32)
    lse_s = cuda.shared.array(T, float32)
    delta_s = cuda.shared.array(T, float32)
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    bh = cuda.blockIdx.y
    j0 = cuda.blockIdx.x * T
    nq, d = q.shape[1], q.shape[2]
    nk = k.shape[1]
    _load_keys(k, v, k_s, v_s, bh, j0, nk, d)
    dk_acc = cuda.local.array(COLS, float32)
    dv_acc = cuda.local.array(COLS, float32)
    for u in range(COLS):
        dk_acc[u] = float32(0.0)
        dv_acc[u] = float32(0.0)
    first = max(0, (j0 - diag) // T * T) if causal else 0    # earlier queries see none of these keys
    for i0 in range(first, nq, T):
        cuda.syncthreads()                         # the previous tiles are no longer read
        i = i0 + r
        _load_queries(q, do, lse, delta, q_s, do_s, lse_s, delta_s, bh, i0, nq, d)
        cuda.syncthreads()
        _p_and_ds(q_s, k_s, v_s, do_s, lse_s, delta_s, p_s, ds_s, i0, j0, nq, nk, d, scale, diag, causal)
        cuda.syncthreads()                         # P and dS complete
        u = 0
        for cc in range(c, d, T):
            a = float32(0.0)
            b = float32(0.0)
            for ii in range(T):
                a += p_s[ii, r] * do_s[ii, cc]
                b += ds_s[ii, r] * q_s[ii, cc]
            dv_acc[u] += a
            dk_acc[u] += b
            u += 1
        if dq_atomic and i < nq:
            # Thread (r, c) adds into query i0 + r: every key tile adds into these rows.
            for cc in range(c, d, T):
                a = float32(0.0)
                for jj in range(T):
                    a += ds_s[r, jj] * k_s[jj, cc]
                cuda.atomic.add(dq, (bh, i, cc), a * scale)
    j = j0 + r
    if j < nk:
        u = 0
        for cc in range(c, d, T):
            dk[bh, j, cc] = dk_acc[u] * scale
            dv[bh, j, cc] = dv_acc[u]
            u += 1


@cuda.jit
def attn_bwd_q_kernel(q, k, v, do, lse, delta, dq, scale, diag, causal):
    # A block per tile of T queries; thread (r, c) owns query i0 + r, columns c, c + T, ... of dQ.
    k_s = cuda.shared.array((T, MAX_D), float32)
    v_s = cuda.shared.array((T, MAX_D), float32)
    q_s = cuda.shared.array((T, MAX_D), float32)
    do_s = cuda.shared.array((T, MAX_D), float32)
    p_s = cuda.shared.array((T, TPAD), float32)
    ds_s = cuda.shared.array((T, TPAD), float32)
    lse_s = cuda.shared.array(T, float32)
    delta_s = cuda.shared.array(T, float32)
    c, r = cuda.threadIdx.x, cuda.threadIdx.y
    bh = cuda.blockIdx.y
    i0 = cuda.blockIdx.x * T
    i = i0 + r
    nq, d = q.shape[1], q.shape[2]
    nk = k.shape[1]
    _load_queries(q, do, lse, delta, q_s, do_s, lse_s, delta_s, bh, i0, nq, d)
    dq_acc = cuda.local.array(COLS, float32)
    for u in range(COLS):
        dq_acc[u] = float32(0.0)
    hi = min(nk, max(i0 + T + diag, 0)) if causal else nk
    for j0 in range(0, hi, T):
        cuda.syncthreads()
        _load_keys(k, v, k_s, v_s, bh, j0, nk, d)
        cuda.syncthreads()
        _p_and_ds(q_s, k_s, v_s, do_s, lse_s, delta_s, p_s, ds_s, i0, j0, nq, nk, d, scale, diag, causal)
        cuda.syncthreads()
        u = 0
        for cc in range(c, d, T):
            a = float32(0.0)
            for jj in range(T):
                a += ds_s[r, jj] * k_s[jj, cc]
            dq_acc[u] += a
            u += 1
    if i < nq:
        u = 0
        for cc in range(c, d, T):
            dq[bh, i, cc] = dq_acc[u] * scale
            u += 1


# ---------------------------------------------------------------------------------------
def _prepare(q, k, v, op):
    q, k, v, squeeze = frame.check_qkv(q, k, v, op=op, max_d=MAX_D)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    flat = tuple(t.float().reshape(B * H, t.shape[2], d).contiguous() for t in (q, k, v))
    return q, k, v, squeeze, B, H, nq, nk, d, flat


def _outputs(B, H, nq, d, device):
    o = torch.empty((B * H, nq, d), dtype=torch.float32, device=device)
    lse = torch.empty((B * H, nq), dtype=torch.float32, device=device)
    return o, lse


def _finish(q, o, lse, B, H, nq, d, squeeze):
    return frame.finish(o.reshape(B, H, nq, d).to(q.dtype), lse.reshape(B, H, nq), squeeze)


def attention_naive_forward(q, k, v, causal=False):
    """v1 returning (o, L)."""
    q, k, v, squeeze, B, H, nq, nk, d, (qf, kf, vf) = _prepare(q, k, v, "attention_naive (Numba)")
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.empty_result(q, k, v, squeeze)
    o, lse = _outputs(B, H, nq, d, q.device)
    s = torch.empty((B * H, nq, nk), dtype=torch.float32, device=q.device)
    qa, ka, va, sa, oa, la = (runtime.to_numba(t) for t in (qf, kf, vf, s, o, lse))
    attn_scores_kernel[(cdiv(nk, 16), cdiv(nq, 8), B * H), (16, 8)](qa, ka, sa, 1.0 / math.sqrt(d), nk - nq,
                                                                       bool(causal))
    attn_softmax_kernel[(nq, B * H), 32](sa, la)
    attn_pv_kernel[(cdiv(d, 16), cdiv(nq, 8), B * H), (16, 8)](sa, va, oa)
    return _finish(q, o, lse, B, H, nq, d, squeeze)


def attention_naive(q, k, v, causal=False):
    """v1: three kernels."""
    return attention_naive_forward(q, k, v, causal)[0]


def _forward_one_kernel(kernel, queries_per_block, threads, q, k, v, causal, op):
    """(o, L) of v2 and v3, one kernel each: a block per ``queries_per_block`` queries of a head."""
    q, k, v, squeeze, B, H, nq, nk, d, (qf, kf, vf) = _prepare(q, k, v, op)
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.empty_result(q, k, v, squeeze)
    o, lse = _outputs(B, H, nq, d, q.device)
    runtime.numba_launch(kernel, (cdiv(nq, queries_per_block), B * H), threads, qf, kf, vf, o, lse,
                         1.0 / math.sqrt(d), nk - nq, bool(causal))
    return _finish(q, o, lse, B, H, nq, d, squeeze)


def attention_rowwise_forward(q, k, v, causal=False):
    """v2 returning (o, L): one query row per block."""
    return _forward_one_kernel(attn_row_kernel, 1, ROW_THREADS, q, k, v, causal, "attention_rowwise (Numba)")


def attention_rowwise(q, k, v, causal=False):
    """v2: one query row per block, online softmax."""
    return attention_rowwise_forward(q, k, v, causal)[0]


def attention_flash_forward(q, k, v, causal=False):
    """v3 returning (o, L): FlashAttention-2 with shared-memory tiles (float32), T queries a block."""
    return _forward_one_kernel(attn_flash_kernel, T, (T, T), q, k, v, causal, "attention_flash (Numba)")


def attention_flash(q, k, v, causal=False):
    """v3: FlashAttention-2 with shared-memory tiles."""
    return attention_flash_forward(q, k, v, causal)[0]


def attention_backward(q, k, v, o, lse, do, causal=False, dq_mode="separate"):
    """(dq, dk, dv): ``dq_mode`` "separate" (a second kernel per tile of queries) or "atomic"
    (the key-tile blocks add into dq with cuda.atomic.add)."""
    frame.check_dq_mode(dq_mode)
    q, k, v, squeeze, B, H, nq, nk, d, (qf, kf, vf) = _prepare(q, k, v, "attention_backward (Numba)")
    o, lse, do = frame.check_backward_inputs(q, o, lse, do, squeeze, op="attention_backward (Numba)")
    if nq == 0 or nk == 0 or d == 0 or B * H == 0:
        return frame.zero_grads(q, k, v, squeeze)
    of = o.float().reshape(B * H, nq, d).contiguous()
    dof = do.float().reshape(B * H, nq, d).contiguous()
    lsef = lse.float().reshape(B * H, nq).contiguous()
    delta = torch.empty((B * H, nq), dtype=torch.float32, device=q.device)
    dk = torch.empty((B * H, nk, d), dtype=torch.float32, device=q.device)
    dv = torch.empty((B * H, nk, d), dtype=torch.float32, device=q.device)
    dq = (torch.zeros if dq_mode == "atomic" else torch.empty)((B * H, nq, d), dtype=torch.float32, device=q.device)
    qa, ka, va, oa, doa, la, da, dqa, dka, dva = (runtime.to_numba(t) for t in
                                                  (qf, kf, vf, of, dof, lsef, delta, dq, dk, dv))
    attn_bwd_delta_kernel[(cdiv(nq, 32), B * H), (32, 1)](oa, doa, da)
    scale, diag = 1.0 / math.sqrt(d), nk - nq
    attn_bwd_kv_kernel[(cdiv(nk, T), B * H), (T, T)](qa, ka, va, doa, la, da, dqa, dka, dva, scale, diag,
                                                       bool(causal), dq_mode == "atomic")
    if dq_mode == "separate":
        attn_bwd_q_kernel[(cdiv(nq, T), B * H), (T, T)](qa, ka, va, doa, la, da, dqa, scale, diag, bool(causal))
    return frame.finish_grads(*(t.reshape(B, H, -1, d) for t in (dq, dk, dv)), squeeze, q.dtype)


VERSIONS = version_index(__doc__, v1=attention_naive, v2=attention_rowwise, v3=attention_flash)
REFERENCE = "v3"
attention = VERSIONS[REFERENCE][1]
FORWARDS = OrderedDict(v1=attention_naive_forward, v2=attention_rowwise_forward, v3=attention_flash_forward)
BACKWARDS = version_index(__doc__, **frame.backward_designs(attention_backward))
