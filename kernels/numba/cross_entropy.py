"""Softmax cross-entropy in Numba (``numba.cuda.jit``), float32 logits.

    cross_entropy(logits, targets)      the reference (v2): (mean loss, d loss / d logits)
    cross_entropy_unfused(...)          v1: forward (max pass + sum pass), mean, backward
    cross_entropy_fused(...)            v2: count, then one kernel per row: online logsumexp, gradient
    cross_entropy_forward / cross_entropy_backward: the two halves, for an autograd function

The formulas and the treatment of ``ignore_index`` are those of ``kernels/cuda/cross_entropy.cu``.

Versions (``VERSIONS``, naive to best):

    v1  unfused: forward (max pass + sum pass), mean, backward: logits read 3 times
    v2  fused: online logsumexp + gradient in one kernel, logits read twice, written once
"""
from __future__ import annotations

import math

import torch

import runtime
from kernels._launch import version_index
from kernels.frames.cross_entropy import IGNORE_INDEX, prepare_backward, prepare_forward, prepare_mean_loss
from kernels.numba.reduction import block_max_all, block_sum_all

from numba import cuda, float32

FULL_MASK = 0xFFFFFFFF
#: Threads per row block: one warp in simulation (each simulated thread is a Python thread).
ROW_THREADS = 32 if runtime.SIMULATE else 1024
F32 = (torch.float32,)


@cuda.jit(device=True)
def lse_merge(m, s, m2, s2):
    """(max, sum of exp(x - max)) of two sets of values together; both empty: unchanged."""
    mn = max(m, m2)
    if mn == -math.inf:
        return m, s
    return mn, s * math.exp(m - mn) + s2 * math.exp(m2 - mn)


@cuda.jit(device=True)
def warp_lse(m, s):
    """(max, sum) of the warp's 32 pairs, in every lane: butterfly shuffles, merged as they go."""
    o = 16
    while o > 0:
        m2 = cuda.shfl_xor_sync(FULL_MASK, m, o)
        s2 = cuda.shfl_xor_sync(FULL_MASK, s, o)
        m, s = lse_merge(m, s, m2, s2)
        o //= 2
    return m, s


@cuda.jit(device=True)
def block_lse(m, s, sm, ss):
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    m, s = warp_lse(m, s)
    if lane == 0:
        sm[warp] = m
        ss[warp] = s
    cuda.syncthreads()
    nw = cuda.blockDim.x // 32
    m = sm[lane] if lane < nw else float32(-math.inf)
    s = ss[lane] if lane < nw else float32(0.0)
    m, s = warp_lse(m, s)
    cuda.syncthreads()
    return m, s


# ---------------------------------------------------------------------------------------
# v1: forward (max, then sum of exp(x - max): two reads), mean, backward (a third read).
@cuda.jit
def cross_entropy_forward_kernel(x, t, loss_rows, lse_out, ignore_index):
    scratch = cuda.shared.array(32, float32)
    r = cuda.blockIdx.x
    cols = x.shape[1]
    m = float32(-math.inf)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        m = max(m, x[r, c])
    m = block_max_all(m, scratch)
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        s += math.exp(x[r, c] - m)
    s = block_sum_all(s, scratch)
    if cuda.threadIdx.x == 0:
        lse = m + math.log(s)
        lse_out[r] = lse
        tr = t[r]
        if tr == ignore_index:
            loss_rows[r] = 0.0
        elif tr < 0 or tr >= cols:
            loss_rows[r] = math.nan  # a target outside [0, V): NaN, not a read outside the row
        else:
            loss_rows[r] = lse - x[r, tr]


@cuda.jit
def cross_entropy_mean_kernel(loss_rows, t, loss, scale, ignore_index):
    """One block: the mean over counted rows, and scale[0] = 1 / count for the backward."""
    scratch = cuda.shared.array(32, float32)
    s = float32(0.0)
    n = float32(0.0)
    for r in range(cuda.threadIdx.x, loss_rows.shape[0], cuda.blockDim.x):
        if t[r] != ignore_index:
            s += loss_rows[r]
            n += 1.0
    s = block_sum_all(s, scratch)
    n = block_sum_all(n, scratch)
    if cuda.threadIdx.x == 0:
        loss[0] = s / n if n > 0 else math.nan
        scale[0] = 1.0 / n if n > 0 else 0.0


@cuda.jit
def cross_entropy_backward_kernel(x, t, lse, dloss, dloss_stride, g, ignore_index):
    """g[r, c] = (exp(x - lse) - onehot) * dloss[r * dloss_stride]; g may be x (in place)."""
    r = cuda.blockIdx.x
    tr = t[r]
    d = float32(0.0) if tr == ignore_index else dloss[r * dloss_stride]
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        p = math.exp(x[r, c] - lse[r])
        g[r, c] = (p - (1.0 if c == tr else 0.0)) * d


# ---------------------------------------------------------------------------------------
# v2: count the rows that count, then one kernel per row.
@cuda.jit
def cross_entropy_count_kernel(t, ignore_index, count):
    scratch = cuda.shared.array(32, float32)
    n = float32(0.0)
    for r in range(cuda.threadIdx.x, t.shape[0], cuda.blockDim.x):
        if t[r] != ignore_index:
            n += 1.0
    n = block_sum_all(n, scratch)
    if cuda.threadIdx.x == 0:
        count[0] = n


@cuda.jit
def cross_entropy_fused_kernel(x, t, count, loss, g, ignore_index):
    """Pass 1: running max m and sum s of exp(x - m) per thread (rescaled when m grows), merged
    over the block. Pass 2: g = (exp(x - lse) - onehot) / count. One atomic add of loss / count."""
    sm = cuda.shared.array(32, float32)
    ss = cuda.shared.array(32, float32)
    r = cuda.blockIdx.x
    cols = x.shape[1]
    tr = t[r]
    n = count[0]
    if n == 0 and r == 0 and cuda.threadIdx.x == 0:
        loss[0] = math.nan  # no row counts: 0 / 0, as torch's mean
    if tr == ignore_index:  # the same for the whole block: no thread skips a barrier
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            g[r, c] = 0.0
        return
    m = float32(-math.inf)
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        v = x[r, c]
        if v > m:
            s = s * math.exp(m - v) + 1.0
            m = v
        elif v > -math.inf:
            s += math.exp(v - m)
    m, s = block_lse(m, s, sm, ss)
    lse = m + math.log(s)
    x_t = x[r, tr] if 0 <= tr < cols else math.nan
    cuda.syncthreads()  # x[t] is read by every thread before anyone overwrites the row (in place)
    inv = 1.0 / n
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        p = math.exp(x[r, c] - lse)
        g[r, c] = (p - (1.0 if c == tr else 0.0)) * inv
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(loss, 0, (lse - x_t) * inv)


# ---------------------------------------------------------------------------------------
def _nb(t):
    return runtime.to_numba(t)


def cross_entropy_forward(logits, targets, ignore_index=IGNORE_INDEX):
    logits, targets, ignore_index, loss, lse = prepare_forward(logits, targets, ignore_index, F32)
    if logits.shape[0]:
        cross_entropy_forward_kernel[logits.shape[0], ROW_THREADS](_nb(logits), _nb(targets), _nb(loss), _nb(lse),
                                                                   ignore_index)
    return loss, lse


def _backward(logits, targets, lse, dloss, stride, ignore_index, grad):
    if logits.shape[0]:
        cross_entropy_backward_kernel[logits.shape[0], ROW_THREADS](
            _nb(logits), _nb(targets), _nb(lse), _nb(dloss), stride, _nb(grad), ignore_index)
    return grad


def cross_entropy_backward(logits, targets, lse, dloss, ignore_index=IGNORE_INDEX, inplace=False):
    logits, targets, lse, dloss, ignore_index, grad = prepare_backward(logits, targets, lse, dloss, ignore_index,
                                                                       inplace, F32)
    return _backward(logits, targets, lse, dloss, 1, ignore_index, grad)


def cross_entropy_unfused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v1: forward kernel, one-block mean, backward kernel. Returns (mean loss, d logits)."""
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace, F32)
    if logits.shape[0]:
        loss_rows, lse = cross_entropy_forward(logits, targets, ignore_index)
        scale = torch.empty(1, dtype=torch.float32, device=logits.device)
        cross_entropy_mean_kernel[1, ROW_THREADS](_nb(loss_rows), _nb(targets), _nb(loss.reshape(1)), _nb(scale),
                                                  ignore_index)
        _backward(logits, targets, lse, scale, 0, ignore_index, grad)
    return loss, grad


def cross_entropy_fused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v2: count kernel, then one kernel per row (online logsumexp, then the gradient)."""
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace, F32)
    if logits.shape[0]:
        count = torch.empty(1, dtype=torch.float32, device=logits.device)
        cross_entropy_count_kernel[1, ROW_THREADS](_nb(targets), ignore_index, _nb(count))
        cross_entropy_fused_kernel[logits.shape[0], ROW_THREADS](_nb(logits), _nb(targets), _nb(count),
                                                                 _nb(loss.reshape(1)), _nb(grad), ignore_index)
    return loss, grad


VERSIONS = version_index(__doc__, v1=cross_entropy_unfused, v2=cross_entropy_fused)
REFERENCE = "v2"
cross_entropy = VERSIONS[REFERENCE][1]
