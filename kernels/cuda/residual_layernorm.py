"""Residual add + LayerNorm in CUDA C++: launchers for ``residual_layernorm.cu``.

    residual_layernorm(x, r, w, b)              the reference (v2): (h, y), h = x + r, y = LayerNorm(h)
    residual_layernorm_unfused(x, r, w, b)      v1: an add kernel, then lesson 09's LayerNorm
    ... stats=True returns (h, y, mean, rstd): the float32 statistics LayerNorm's backward needs.

``x`` and ``r`` have one shape (..., cols), float32; ``w``, ``b`` float32 (cols,).
"""
from __future__ import annotations

import runtime
from kernels._launch import cdiv, cuda_kernels, version_index
from kernels.cuda.layernorm import layernorm
from kernels.frames.residual_layernorm import (  # the frame: input rules and reference, shared by the three languages
    EPS,
    F32,  # noqa: F401  (importable from here too)
    MAX_BLOCKS,  # noqa: F401
    THREADS,
    check_residual_inputs,  # noqa: F401
    fused_frame,
    grid_for,
    residual_layernorm_ref,  # noqa: F401
    unfused_frame,
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "residual_layernorm.cu"
#: Rows (one a warp) per block of v2.
ROW_WARPS = 2 if runtime.SIMULATE else 8


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def residual_layernorm_unfused(x, r, w, b, eps=EPS, stats=False):
    """v1: h = x + r (one kernel, h written), then lesson 09's LayerNorm reads h back."""
    def add(x2, r2, h):
        n = h.numel()
        kernel("residual_add_kernel")[grid_for(n), THREADS](x2, r2, h, n)
    return unfused_frame(x, r, w, b, eps, stats, add, layernorm)


def residual_layernorm_fused(x, r, w, b, eps=EPS, stats=False):
    """v2: one warp per row: h = x + r written once, its statistics, y written once."""
    def launch(x2, r2, w, b, h, y, mean, rstd, rows, cols, eps):
        kernel("residual_layernorm_kernel")[cdiv(rows, ROW_WARPS), 32 * ROW_WARPS](
            x2, r2, w, b, h, y, mean, rstd, rows, cols, eps)
    return fused_frame(x, r, w, b, eps, stats, launch)


VERSIONS = version_index(SOURCE, v1=residual_layernorm_unfused, v2=residual_layernorm_fused)
REFERENCE = "v2"
residual_layernorm = VERSIONS[REFERENCE][1]
