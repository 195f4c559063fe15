"""AdamW and the global gradient norm in CUDA C++: launchers for ``adamw.cu``.

    adamw(p, g, m, v, step=t, lr=..., ...)   the reference (v2): one fused step, in place
    adamw_unfused(...)                       v1: one kernel per line of the formula
    grad_norm(grads, max_norm=0.0)           -> (norm, scale): the clipping factor stays on the GPU

``p, g, m, v`` are float32 tensors of one shape (a flat buffer holding every parameter of a
model, or one tensor), or four lists of such tensors (one launch per tensor). ``p``, ``m``
and ``v`` are updated in place and must be contiguous. ``step`` is the step number, counted
from 1 (after the increment, as torch.optim.AdamW's state["step"]). ``grad_scale``: an
optional 1-element float32 tensor that multiplies g (the ``scale`` of ``grad_norm``).
"""
from __future__ import annotations

import runtime
from kernels._launch import cdiv, cuda_kernels, version_index
from kernels.frames.adamw import (  # the frame: input rules and references, shared by the three languages
    DEFAULTS,  # noqa: F401  (importable from here too)
    MAX_BLOCKS,
    NORM_BLOCKS,
    adamw_ref,  # noqa: F401
    adamw_tensors,
    check_adamw_inputs,  # noqa: F401
    check_hyper,
    grad_norm_ref,  # noqa: F401
    prepare_grad_norm,
    scale_tensor,  # noqa: F401
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "adamw.cu"
THREADS = 64 if runtime.SIMULATE else 256


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def grid_for(n):
    return max(1, min(cdiv(n, THREADS), MAX_BLOCKS))


def adamw_unfused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=1e-2, grad_scale=None):
    """v1: decay, moments, update: three kernels, p and the moments read twice."""
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        kernel("adamw_decay_kernel")[grid_for(n), THREADS](p, 1.0 - h["lr_wd"], n)
        kernel("adamw_moments_kernel")[grid_for(n), THREADS](g, m, v, s, h["beta1"], h["beta2"], n)
        kernel("adamw_update_kernel")[grid_for(n), THREADS](p, m, v, h["step_size"], h["inv_sqrt_bc2"], h["eps"], n)
    return params


def adamw_fused(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=1e-2, grad_scale=None):
    """v2: the whole step in one kernel per tensor (one launch for a flat buffer)."""
    h = check_hyper(step, lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, n, s in adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
        kernel("adamw_kernel")[grid_for(n), THREADS](p, g, m, v, s, h["lr_wd"], h["beta1"], h["beta2"],
                                                    h["step_size"], h["inv_sqrt_bc2"], h["eps"], n)
    return params


VERSIONS = version_index(SOURCE, v1=adamw_unfused, v2=adamw_fused)
REFERENCE = "v2"
adamw = VERSIONS[REFERENCE][1]


def grad_norm(grads, max_norm=0.0):
    """(norm, scale): the L2 norm of every gradient together (a 0-d tensor) and the clipping
    factor min(1, max_norm / (norm + 1e-6)) as a 1-element tensor (1 when max_norm <= 0), to
    pass to adamw as grad_scale. The partial sums are added in a fixed order: the same bits
    every run."""
    pieces, partials, norm, scale = prepare_grad_norm(grads, lambda n: min(NORM_BLOCKS, cdiv(n, THREADS)))
    for t, blocks, offset in pieces:
        kernel("grad_norm_partials_kernel")[blocks, THREADS](t, t.numel(), partials, offset)
    kernel("grad_norm_finish_kernel")[1, THREADS](partials, partials.numel(), float(max_norm), norm, scale)
    return norm, scale
