"""AdamW and the global gradient norm in Numba (``numba.cuda.jit``), as in ``kernels/cuda/adamw.cu``:
v1 one kernel per line of the formula, v2 the whole step in one kernel; ``grad_norm`` gives the
norm and the clipping factor, which stays on the device.

Versions (``VERSIONS``, naive to best):

    v1  unfused: decay, moments, update as three kernels (p, m, v read twice)
    v2  fused: the whole step in one kernel, 28 bytes per parameter
"""
from __future__ import annotations

import math

import runtime
from kernels._launch import cdiv, version_index
from kernels.frames.adamw import MAX_BLOCKS, NORM_BLOCKS, adamw_tensors, check_hyper, prepare_grad_norm

from numba import cuda, float32

FULL_MASK = 0xFFFFFFFF
#: Threads per block: one warp in simulation (each simulated thread is a Python thread).
THREADS = 32 if runtime.SIMULATE else 256


def grid_for(n):
    return max(1, min(cdiv(n, THREADS), MAX_BLOCKS))


@cuda.jit
def adamw_decay_kernel(p, decay):
    for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
        p[i] *= decay


@cuda.jit
def adamw_moments_kernel(g, m, v, scale, beta1, beta2):
    s = scale[0]
    for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
        gi = g[i] * s
        m[i] = beta1 * m[i] + (1.0 - beta1) * gi
        v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi


@cuda.jit
def adamw_update_kernel(p, m, v, step_size, inv_sqrt_bc2, eps):
    for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
        p[i] -= step_size * m[i] / (math.sqrt(v[i]) * inv_sqrt_bc2 + eps)


@cuda.jit
def adamw_kernel(p, g, m, v, scale, lr_wd, beta1, beta2, step_size, inv_sqrt_bc2, eps):
    """v2: p, g, m, v read once; p, m, v written once. The decay is decoupled (AdamW)."""
    s = scale[0]
    for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
        gi = g[i] * s
        mi = beta1 * m[i] + (1.0 - beta1) * gi
        vi = beta2 * v[i] + (1.0 - beta2) * gi * gi
        pi = p[i] * (1.0 - lr_wd)
        p[i] = pi - step_size * mi / (math.sqrt(vi) * inv_sqrt_bc2 + eps)
        m[i] = mi
        v[i] = vi


@cuda.jit
def grad_norm_partials_kernel(g, partial, offset):
    scratch = cuda.shared.array(32, float32)
    s = float32(0.0)
    for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
        s += g[i] * g[i]
    o = 16
    while o > 0:
        s += cuda.shfl_xor_sync(FULL_MASK, s, o)
        o //= 2
    lane = cuda.threadIdx.x % 32
    if lane == 0:
        scratch[cuda.threadIdx.x // 32] = s
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        total = float32(0.0)
        for w in range(cuda.blockDim.x // 32):
            total += scratch[w]
        partial[offset + cuda.blockIdx.x] = total


@cuda.jit
def grad_norm_finish_kernel(partial, max_norm, norm, scale):
    """One thread adds the partial sums in order (the same bits every run)."""
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        total = float32(0.0)
        for i in range(partial.shape[0]):
            total += partial[i]
        nrm = math.sqrt(total)
        norm[0] = nrm
        scale[0] = min(1.0, max_norm / (nrm + 1e-6)) if max_norm > 0 else 1.0


def _nb(t):
    return runtime.to_numba(t)


def adamw_unfused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=1e-2, grad_scale=None):
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        pf, gf, mf, vf = (_nb(t.reshape(-1)) for t in (p, g, m, v))
        adamw_decay_kernel[grid_for(n), THREADS](pf, 1.0 - h["lr_wd"])
        adamw_moments_kernel[grid_for(n), THREADS](gf, mf, vf, _nb(s), h["beta1"], h["beta2"])
        adamw_update_kernel[grid_for(n), THREADS](pf, mf, vf, h["step_size"], h["inv_sqrt_bc2"], h["eps"])
    return params


def adamw_fused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=1e-2, grad_scale=None):
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        adamw_kernel[grid_for(n), THREADS](*(_nb(t.reshape(-1)) for t in (p, g, m, v)), _nb(s), h["lr_wd"],
                                           h["beta1"], h["beta2"], h["step_size"], h["inv_sqrt_bc2"], h["eps"])
    return params


VERSIONS = version_index(__doc__, v1=adamw_unfused, v2=adamw_fused)
REFERENCE = "v2"
adamw = VERSIONS[REFERENCE][1]


def grad_norm(grads, max_norm=0.0):
    """(norm, scale), as kernels.cuda.adamw.grad_norm."""
    pieces, partials, norm, scale = prepare_grad_norm(grads, lambda n: min(NORM_BLOCKS, cdiv(n, THREADS)))
    for t, blocks, offset in pieces:
        grad_norm_partials_kernel[blocks, THREADS](_nb(t), _nb(partials), offset)
    grad_norm_finish_kernel[1, 32](_nb(partials), float(max_norm), _nb(norm.reshape(1)), _nb(scale))
    return norm, scale
