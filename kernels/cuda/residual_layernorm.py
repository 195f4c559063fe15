"""Residual add + LayerNorm in CUDA C++: launchers for ``residual_layernorm.cu``.

    residual_layernorm(x, r, w, b)              the reference (v2): (h, y), h = x + r, y = LayerNorm(h)
    residual_layernorm_unfused(x, r, w, b)      v1: an add kernel, then lesson 09's LayerNorm
    ... stats=True returns (h, y, mean, rstd): the float32 statistics LayerNorm's backward needs.

``x`` and ``r`` have one shape (..., cols), float32; ``w``, ``b`` float32 (cols,).
"""
from __future__ import annotations

import functools

import torch

import runtime
from kernels._launch import cdiv, version_index
from kernels.cuda.layernorm import EPS, check_norm_inputs, layernorm, row_stats

SOURCE = runtime.KERNELS_DIR / "cuda" / "residual_layernorm.cu"
THREADS = 64 if runtime.SIMULATE else 256
MAX_BLOCKS = 8 if runtime.SIMULATE else 132 * 16
F32 = (torch.float32,)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return runtime.cuda_kernel(SOURCE, name)


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


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    """v1: h = x + r (one kernel, h written), then lesson 09's LayerNorm reads h back."""
    def add(x2, r2, h):
        n = h.numel()
        kernel("residual_add_kernel")[grid_for(n), THREADS](x2, r2, h, n)
    return unfused_frame(x, r, w, b, eps, stats, add, layernorm)


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    """v2: one block per row: h = x + r written once, its statistics, y written once."""
    def launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, eps):
        kernel("residual_layernorm_kernel")[rows, THREADS](x2, r2, w, b, h, y, mean, rstd, cols, eps)
    return fused_frame(x, r, w, b, eps, stats, launch)


VERSIONS = version_index(SOURCE, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]


def residual_layernorm_ref(x, r, w, b, eps=EPS):
    """torch's y = LayerNorm(x + r) (the topic's reference; h = x + r is checked beside it), with
    h = x + r rounded to float32 as the kernels store it."""
    h = (x.float() + r.float()).to(x.dtype)
    return torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps)
