"""AdamW and the global gradient norm in Triton, as in ``kernels/cuda/adamw.cu``: v1 one kernel
per line of the formula, v2 the whole step in one kernel; ``grad_norm`` gives the norm and the
clipping factor, which stays on the device.

Versions (``VERSIONS``, naive to best):

    v1  unfused: decay, moments, update as three kernels (p, m, v read twice)
    v2  fused: the whole step in one kernel, 28 bytes per parameter
"""
from __future__ import annotations

import runtime
from kernels._launch import version_index
from kernels.frames.adamw import adamw_tensors, check_hyper, prepare_grad_norm

import triton
import triton.language as tl

BLOCK = 256 if runtime.SIMULATE else 2048
NORM_BLOCK = 256 if runtime.SIMULATE else 8192


@triton.jit
def adamw_decay_kernel(p_ptr, decay, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(p_ptr + offs, tl.load(p_ptr + offs, mask=mask) * decay, mask=mask)


@triton.jit
def adamw_moments_kernel(g_ptr, m_ptr, v_ptr, scale_ptr, beta1, beta2, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask) * tl.load(scale_ptr)
    tl.store(m_ptr + offs, beta1 * tl.load(m_ptr + offs, mask=mask) + (1 - beta1) * g, mask=mask)
    tl.store(v_ptr + offs, beta2 * tl.load(v_ptr + offs, mask=mask) + (1 - beta2) * g * g, mask=mask)


@triton.jit
def adamw_update_kernel(p_ptr, m_ptr, v_ptr, step_size, inv_sqrt_bc2, eps, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    p = tl.load(p_ptr + offs, mask=mask)
    tl.store(p_ptr + offs, p - step_size * m / (tl.sqrt(v) * inv_sqrt_bc2 + eps), mask=mask)


@triton.jit
def adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, scale_ptr, lr_wd, beta1, beta2, step_size, inv_sqrt_bc2, eps, n,
                 BLOCK_SIZE: tl.constexpr):
    """v2: p, g, m, v read once; p, m, v written once. The decay is decoupled (AdamW)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask) * tl.load(scale_ptr)
    m = beta1 * tl.load(m_ptr + offs, mask=mask) + (1 - beta1) * g
    v = beta2 * tl.load(v_ptr + offs, mask=mask) + (1 - beta2) * g * g
    p = tl.load(p_ptr + offs, mask=mask) * (1 - lr_wd)
    tl.store(p_ptr + offs, p - step_size * m / (tl.sqrt(v) * inv_sqrt_bc2 + eps), mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


@triton.jit
def adamw_schedule_kernel(state_ptr, lr, warmup):
    """state = [step, lr] on the device: the step advanced by one and its learning rate (a
    linear warmup over ``warmup`` steps), so that a CUDA Graph of the step replays it as it is."""
    step = tl.load(state_ptr) + 1.0
    tl.store(state_ptr, step)
    tl.store(state_ptr + 1, lr * tl.minimum(1.0, step / warmup))


@triton.jit
def adamw_master_kernel(p_ptr, g_ptr, m_ptr, v_ptr, half_ptr, scale_ptr, state_ptr, weight_decay, beta1, beta2,
                        log2_beta1, log2_beta2, eps, n, HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The written-out training step's AdamW (``kernels/gpt_step.py``): v2's update with the step
    and the learning rate read from the device (``state``), and, with HALF, the half-precision
    copy of the float32 master weights written in the same pass: the copy the next forward's
    matmuls read (mixed precision, as llm.c trains)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    step = tl.load(state_ptr)
    lr = tl.load(state_ptr + 1)
    step_size = lr / (1.0 - tl.exp2(step * log2_beta1))
    inv_sqrt_bc2 = 1.0 / tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
    g = tl.load(g_ptr + offs, mask=mask) * tl.load(scale_ptr)
    m = beta1 * tl.load(m_ptr + offs, mask=mask) + (1 - beta1) * g
    v = beta2 * tl.load(v_ptr + offs, mask=mask) + (1 - beta2) * g * g
    p = tl.load(p_ptr + offs, mask=mask) * (1 - lr * weight_decay)
    p = p - step_size * m / (tl.sqrt(v) * inv_sqrt_bc2 + eps)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if HALF:
        tl.store(half_ptr + offs, p.to(half_ptr.dtype.element_ty), mask=mask)


@triton.jit
def grad_norm_partials_kernel(g_ptr, n, partial_ptr, offset, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    g = tl.load(g_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + offset + tl.program_id(0), tl.sum(g * g, axis=0))


@triton.jit
def grad_norm_finish_kernel(partial_ptr, count, max_norm, norm_ptr, scale_ptr, BLOCK_SIZE: tl.constexpr):
    """One program adds the partial sums in a fixed order (the same bits every run)."""
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, count, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(partial_ptr + offs, mask=offs < count, other=0.0)
    norm = tl.sqrt(tl.sum(acc, axis=0))
    tl.store(norm_ptr, norm)
    clip = tl.minimum(1.0, max_norm / (norm + 1e-6))
    tl.store(scale_ptr, tl.where(max_norm > 0, clip, 1.0))


def adamw_unfused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=1e-2, grad_scale=None):
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        grid = (triton.cdiv(n, BLOCK),)
        adamw_decay_kernel[grid](p, 1.0 - h["lr_wd"], n, BLOCK_SIZE=BLOCK)
        adamw_moments_kernel[grid](g, m, v, s, h["beta1"], h["beta2"], n, BLOCK_SIZE=BLOCK)
        adamw_update_kernel[grid](p, m, v, h["step_size"], h["inv_sqrt_bc2"], h["eps"], n, BLOCK_SIZE=BLOCK)
    return params


def adamw_fused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=1e-2, grad_scale=None):
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        adamw_kernel[(triton.cdiv(n, BLOCK),)](p, g, m, v, s, h["lr_wd"], h["beta1"], h["beta2"], h["step_size"],
                                              h["inv_sqrt_bc2"], h["eps"], n, BLOCK_SIZE=BLOCK)
    return params


VERSIONS = version_index(__doc__, v1=adamw_unfused, v2=adamw_fused)
REFERENCE = "v2"
adamw = VERSIONS[REFERENCE][1]


def grad_norm(grads, max_norm=0.0):
    """(norm, scale), as kernels.cuda.adamw.grad_norm."""
    pieces, partials, norm, scale = prepare_grad_norm(grads, lambda n: triton.cdiv(n, NORM_BLOCK))
    for t, blocks, offset in pieces:
        grad_norm_partials_kernel[(blocks,)](t, t.numel(), partials, offset, BLOCK_SIZE=NORM_BLOCK)
    grad_norm_finish_kernel[(1,)](partials, partials.numel(), float(max_norm), norm, scale, BLOCK_SIZE=1024)
    return norm, scale
