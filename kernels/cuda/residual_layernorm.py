"""Residual add + LayerNorm in CUDA C++: launchers for ``residual_layernorm.cu``.

    residual_layernorm(x, r, w, b)              the reference (v2): (h, y), h = x + r, y = LayerNorm(h)
    residual_layernorm_unfused(x, r, w, b)      v1: an add kernel, then lesson 09's LayerNorm
    ... stats=True returns (h, y, mean, rstd): the float32 statistics LayerNorm's backward needs.

``x`` and ``r`` have one shape (..., cols), float32; ``w``, ``b`` float32 (cols,).
"""
from __future__ import annotations

import functools

import torch

import utils
from kernels._launch import version_index
from kernels.cuda.layernorm import EPS, check_norm_inputs
from utils.inputs import check_input  # noqa: F401

SOURCE = utils.KERNELS_DIR / "cuda" / "residual_layernorm.cu"
THREADS = 64 if utils.SIMULATE else 256
MAX_BLOCKS = 8 if utils.SIMULATE else 132 * 16
F32 = (torch.float32,)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return utils.cuda_kernel(SOURCE, name)


def check_residual_inputs(x, r, w, b, op="residual_layernorm"):
    """(x2, r2, w, b, shape): x and r as contiguous (rows, cols) of one shape, w and b (cols,)."""
    x2, w, b, shape = check_norm_inputs(x, w, b, op=op, dtypes=F32, bias=True)
    check_norm_inputs(r, w, b, op=op, name="r", dtypes=F32)
    if tuple(r.shape) != shape:
        raise ValueError(f"{op}: r has shape {tuple(r.shape)} but x has {shape}: the residual add takes one shape")
    return x2, r.reshape(x2.shape).contiguous(), w, b, shape


def _stats_out(x2):
    rows, cols = x2.shape
    if cols == 0:
        return (torch.full((rows,), float("nan"), device=x2.device),) * 2
    return (torch.empty(rows, dtype=torch.float32, device=x2.device),
            torch.empty(rows, dtype=torch.float32, device=x2.device))


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    """v1: h = x + r (one kernel, h written), then lesson 09's LayerNorm reads h back."""
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    h = torch.empty_like(x2)
    if h.numel():
        n = h.numel()
        kernel("residual_add_kernel")[max(1, min((n + THREADS - 1) // THREADS, MAX_BLOCKS)), THREADS](x2, r2, h, n)
    from kernels.cuda.layernorm import layernorm
    y, mean, rstd = layernorm(h, w, b, eps, stats=True)
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    """v2: one block per row: h = x + r written once, its statistics, y written once."""
    x2, r2, w, b, shape = check_residual_inputs(x, r, w, b)
    rows, cols = x2.shape
    h, y = torch.empty_like(x2), torch.empty_like(x2)
    mean, rstd = _stats_out(x2)
    if rows and cols:
        kernel("residual_layernorm_kernel")[rows, THREADS](x2, r2, w, b, h, y, mean, rstd, cols, float(eps))
    out = (h.reshape(shape), y.reshape(shape))
    return out + (mean, rstd) if stats else out


VERSIONS = version_index(SOURCE, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]


def residual_layernorm_ref(x, r, w, b, eps=EPS):
    """torch's y = LayerNorm(x + r) (the topic's reference; h = x + r is checked beside it), with
    h = x + r rounded to float32 as the kernels store it."""
    h = (x.float() + r.float()).to(x.dtype)
    return torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps)
