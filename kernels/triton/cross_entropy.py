"""Softmax cross-entropy in Triton, float32 or bfloat16 logits (every sum in float32).

    cross_entropy(logits, targets)      the reference (v2): (mean loss, d loss / d logits)
    cross_entropy_unfused(...)          v1: forward (max pass + sum pass), mean, backward
    cross_entropy_fused(...)            v2: count, then one program per row: the online
                                        logsumexp, then the gradient (Liger Kernel's design)
    cross_entropy_forward / cross_entropy_backward: the two halves, for an autograd function

The formulas and the treatment of ``ignore_index`` are those of ``kernels/cuda/cross_entropy.cu``.

Versions (``VERSIONS``, naive to best):

    v1  unfused: forward (max pass + sum pass), mean, backward: logits read 3 times
    v2  fused: online logsumexp + gradient in one program per row, logits read twice, written once
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import version_index
from kernels.frames.cross_entropy import IGNORE_INDEX, prepare_backward, prepare_forward, prepare_mean_loss

import triton
import triton.language as tl

#: (columns per loop step, warps) by the logits' element size. On a GPU, the fastest of a sweep
#: at 8192 x 50304 on an H200 (benchmarks/tune/gpt_launch_tune.py): float32 8192 x 32 warps,
#: bfloat16 2048 x 8 (Liger Kernel's 32768 x 32 took 1.7x and 2x as long there). In simulation
#: a small block, so that the loop over a row takes several steps at the tests' sizes.
CONFIGS = {4: (256, 4), 2: (256, 4)} if runtime.SIMULATE else {4: (8192, 32), 2: (2048, 8)}
COUNT_BLOCK = 1024


def _block(cols, element_size=4):
    return min(CONFIGS[element_size][0], triton.next_power_of_2(max(int(cols), 1)))


def _launch_config(x):
    """The BLOCK_SIZE and num_warps for the (rows, cols) logits ``x``."""
    return dict(BLOCK_SIZE=_block(x.shape[1], x.element_size()), num_warps=CONFIGS[x.element_size()][1])


@triton.jit
def cross_entropy_count_kernel(t_ptr, rows, ignore_index, count_ptr, BLOCK_SIZE: tl.constexpr):
    """One program: how many targets are not ignore_index (as a float32)."""
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, rows, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        t = tl.load(t_ptr + offs, mask=offs < rows, other=ignore_index)
        acc += tl.where(t != ignore_index, 1.0, 0.0)
    tl.store(count_ptr, tl.sum(acc, axis=0))


# ---------------------------------------------------------------------------------------
# v1: forward (two reads of the row), mean (one program), backward (a third read).
@triton.jit
def cross_entropy_forward_kernel(x_ptr, t_ptr, loss_ptr, lse_ptr, cols, ignore_index, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    m = tl.full([BLOCK_SIZE], float("-inf"), dtype=tl.float32)
    for start in range(0, cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        v = tl.load(x_row + offs, mask=offs < cols, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, v)
    mx = tl.max(m, axis=0)  # subtract the max: every exp in (0, 1]
    s = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        v = tl.load(x_row + offs, mask=offs < cols, other=float("-inf")).to(tl.float32)
        s += tl.exp(v - mx)
    lse = mx + tl.log(tl.sum(s, axis=0))
    tl.store(lse_ptr + row, lse)
    t = tl.load(t_ptr + row)
    valid = (t >= 0) & (t < cols)
    x_t = tl.load(x_row + t, mask=valid & (t != ignore_index), other=float("nan")).to(tl.float32)
    loss = tl.where(t == ignore_index, 0.0, lse - x_t)  # a target outside [0, V): NaN
    tl.store(loss_ptr + row, loss)


@triton.jit
def cross_entropy_mean_kernel(loss_rows_ptr, t_ptr, loss_ptr, scale_ptr, rows, ignore_index,
                              BLOCK_SIZE: tl.constexpr):
    s = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    n = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, rows, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        t = tl.load(t_ptr + offs, mask=offs < rows, other=ignore_index)
        keep = (offs < rows) & (t != ignore_index)
        s += tl.load(loss_rows_ptr + offs, mask=keep, other=0.0)
        n += tl.where(keep, 1.0, 0.0)
    total = tl.sum(s, axis=0)
    count = tl.sum(n, axis=0)
    tl.store(loss_ptr, tl.where(count > 0, total / tl.maximum(count, 1.0), float("nan")))  # 0 / 0, as torch's
    tl.store(scale_ptr, tl.where(count > 0, 1.0 / tl.maximum(count, 1.0), 0.0))


@triton.jit
def cross_entropy_backward_kernel(x_ptr, t_ptr, lse_ptr, dloss_ptr, dloss_stride, g_ptr, cols, ignore_index,
                                  BLOCK_SIZE: tl.constexpr):
    """g = (exp(x - lse) - onehot) * dloss[row * dloss_stride]; g_ptr may be x_ptr (in place)."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    lse = tl.load(lse_ptr + row)
    d = tl.load(dloss_ptr + row * dloss_stride)
    d = tl.where(t == ignore_index, 0.0, d)
    for start in range(0, cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        mask = offs < cols
        v = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
        g = (tl.exp(v - lse) - tl.where(offs == t, 1.0, 0.0)) * d
        tl.store(g_ptr + row * cols + offs, g.to(g_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------
# v2: one program per row. Pass 1 keeps, per lane, the running max m and the sum s of
# exp(x - m), rescaled when m grows (the online softmax): one read of the row. Pass 2 reads
# it again and writes (exp(x - lse) - onehot) / count, over the logits when in place.
@triton.jit
def cross_entropy_fused_kernel(x_ptr, t_ptr, count_ptr, loss_ptr, g_ptr, cols, ignore_index,
                               BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    g_row = g_ptr + row * cols
    t = tl.load(t_ptr + row)
    n = tl.load(count_ptr)
    if t == ignore_index:
        for start in range(0, cols, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            tl.store(g_row + offs, tl.zeros([BLOCK_SIZE], dtype=g_ptr.dtype.element_ty), mask=offs < cols)
    else:
        m = tl.full([BLOCK_SIZE], float("-inf"), dtype=tl.float32)
        s = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for start in range(0, cols, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            v = tl.load(x_row + offs, mask=offs < cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, v)
            # a lane that has seen only -inf: shift by 0, so both exps are exp(-inf) = 0
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.exp(v - shift)
            m = m_new
        mx = tl.max(m, axis=0)
        s_all = tl.sum(s * tl.exp(m - mx), axis=0)
        lse = mx + tl.log(s_all)
        valid = (t >= 0) & (t < cols)
        x_t = tl.load(x_row + t, mask=valid, other=float("nan")).to(tl.float32)  # read before pass 2
        inv = 1.0 / n
        for start in range(0, cols, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            mask = offs < cols
            v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            g = (tl.exp(v - lse) - tl.where(offs == t, 1.0, 0.0)) * inv
            tl.store(g_row + offs, g.to(g_ptr.dtype.element_ty), mask=mask)
        tl.atomic_add(loss_ptr, (lse - x_t) * inv)


@triton.jit
def _nan_if_empty_kernel(count_ptr, loss_ptr):
    if tl.load(count_ptr) == 0:
        tl.store(loss_ptr, float("nan"))  # no row counts: 0 / 0, as torch's mean


def cross_entropy_forward(logits, targets, ignore_index=IGNORE_INDEX):
    logits, targets, ignore_index, loss, lse = prepare_forward(logits, targets, ignore_index)
    rows, cols = logits.shape
    if rows:
        cross_entropy_forward_kernel[(rows,)](logits, targets, loss, lse, cols, ignore_index,
                                              **_launch_config(logits))
    return loss, lse


def _backward(logits, targets, lse, dloss, stride, ignore_index, grad):
    rows, cols = logits.shape
    if rows:
        cross_entropy_backward_kernel[(rows,)](logits, targets, lse, dloss, stride, grad, cols, ignore_index,
                                               **_launch_config(logits))
    return grad


def cross_entropy_backward(logits, targets, lse, dloss, ignore_index=IGNORE_INDEX, inplace=False):
    logits, targets, lse, dloss, ignore_index, grad = prepare_backward(logits, targets, lse, dloss, ignore_index,
                                                                       inplace)
    return _backward(logits, targets, lse, dloss, 1, ignore_index, grad)


def cross_entropy_unfused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v1: forward kernel, one-program mean, backward kernel. Returns (mean loss, d logits)."""
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace)
    rows = logits.shape[0]
    if rows:
        loss_rows, lse = cross_entropy_forward(logits, targets, ignore_index)
        scale = torch.empty(1, dtype=torch.float32, device=logits.device)
        cross_entropy_mean_kernel[(1,)](loss_rows, targets, loss, scale, rows, ignore_index, BLOCK_SIZE=COUNT_BLOCK)
        _backward(logits, targets, lse, scale, 0, ignore_index, grad)
    return loss, grad


def cross_entropy_fused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v2: count kernel, then one program per row (online logsumexp, then the gradient)."""
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace)
    rows, cols = logits.shape
    if rows:
        count = torch.empty(1, dtype=torch.float32, device=logits.device)
        cross_entropy_count_kernel[(1,)](targets, rows, ignore_index, count, BLOCK_SIZE=COUNT_BLOCK)
        cross_entropy_fused_kernel[(rows,)](logits, targets, count, loss, grad, cols, ignore_index,
                                            **_launch_config(logits))
        _nan_if_empty_kernel[(1,)](count, loss)
    return loss, grad


VERSIONS = version_index(__doc__, v1=cross_entropy_unfused, v2=cross_entropy_fused)
REFERENCE = "v2"
cross_entropy = VERSIONS[REFERENCE][1]
