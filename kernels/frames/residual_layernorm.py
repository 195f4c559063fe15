"""Residual add + LayerNorm's frame, shared by the CUDA C++, Numba and Triton launchers: the
input rules, what v1 and v2 do around their kernels, the block size and grid of the CUDA C++
and Numba kernels, and the PyTorch reference.

    check_residual_inputs(x, r, w, b)           x and r as (rows, cols) of one shape, w and b (cols,)
    unfused_frame(x, r, w, b, eps, stats, add, layernorm)     v1: h = x + r, then a LayerNorm of h
    fused_frame(x, r, w, b, eps, stats, launch[, max_cols])   v2: one launch writes h, y and the statistics
    grid_for(n)                                 blocks of a grid-stride loop of THREADS threads
    residual_layernorm_ref(x, r, w, b)          torch's LayerNorm(x + r)

``EPS`` is LayerNorm's (``kernels/frames/layernorm.py``).
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv
from kernels.frames.layernorm import EPS, check_norm_inputs, row_stats

THREADS = 64 if runtime.SIMULATE else 256
MAX_BLOCKS = 8 if runtime.SIMULATE else 132 * 16
F32 = (torch.float32,)


def grid_for(n):
    """Blocks of a grid-stride loop over n elements."""
    return max(1, min(cdiv(n, THREADS), MAX_BLOCKS))


def check_residual_inputs(x, r, w, b, op="residual_layernorm"):
    """(x2, r2, w, b, shape): x and r as contiguous (rows, cols) of one shape, w and b (cols,)."""
    x2, w, b, shape = check_norm_inputs(x, w, b, op=op, dtypes=F32, bias=True)
    check_norm_inputs(r, w, b, op=op, name="r", dtypes=F32)
    if tuple(r.shape) != shape:
        raise ValueError(f"{op}: r has shape {tuple(r.shape)} but x has {shape}: the residual add takes one shape")
    return x2, r.reshape(x2.shape).contiguous(), w, b, shape


def _result(h, y, mean, rstd, shape, stats):
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


def unfused_frame(x, r, w, b, eps, stats, add, layernorm):
    """v1 in each language: check, ``add(x2, r2, h)`` writes h = x + r (x and r as (rows, cols);
    skipped for empty input), then ``layernorm`` (lesson 09's, of the same language) reads h
    back. Returns (h, y), or with ``stats`` (h, y, mean, rstd)."""
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    h = torch.empty_like(x2)
    if h.numel():
        add(x2, r2, h)
    y, mean, rstd = layernorm(h, w, b, eps, stats=True)
    return _result(h, y, mean, rstd, shape, stats)


def fused_frame(x, r, w, b, eps, stats, launch, max_cols=None):
    """v2 in each language: check, make h, y and the statistics, call
    ``launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, eps)`` unless the input is empty, and
    return as ``unfused_frame``. ``max_cols``: the longest row the kernel holds."""
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    rows, cols = x2.shape
    if max_cols is not None and cols > max_cols:
        raise ValueError(f"residual_layernorm: rows of {cols} columns do not fit one program (at most {max_cols}): "
                         "use residual_layernorm_unfused (v1)")
    h, y = torch.empty_like(x2), torch.empty_like(x2)
    mean, rstd = row_stats(x2), row_stats(x2)
    if rows and cols:
        launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, float(eps))
    return _result(h, y, mean, rstd, shape, stats)


def residual_layernorm_ref(x, r, w, b, eps=EPS):
    """torch's y = LayerNorm(x + r) (the topic's reference; h = x + r is checked beside it), with
    h = x + r rounded to float32 as the kernels store it."""
    h = (x.float() + r.float()).to(x.dtype)
    return torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps)
