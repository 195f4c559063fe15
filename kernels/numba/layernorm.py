"""LayerNorm and RMSNorm in Numba (``numba.cuda.jit``), float32.

Forward (``VERSIONS``; ``f(x, w, b, eps=1e-5, stats=False)`` -> y, or (y, mean, rstd)):

    v1  a block per row, three passes over the row from memory                    layernorm_block
    v2  a block per row held in registers (a local array): x read once            layernorm_reg
    v3  the reference: a warp per row up to 1024 columns, v2 up to 16384, v1 beyond; tensors passed straight in
        layernorm: a warp per row (8 rows a block); launched by ``runtime.NumbaLauncher`` (tensors
        handed to the compiled kernel as pointer, shape and strides: no device-array wrapper,
        no argument typing per call)

Backward (``BACKWARD_VERSIONS``; ``f(dy, x, w, mean, rstd)`` -> (dx, dw, db)):

    atomic  dx per row, dw/db by cuda.atomic.add
    partials  two stages: dx and per-block dw/db partials, then a column-sum kernel
              (a persistent grid computes dx and each block's dw/db partial sums, its own
              row of a buffer, then a second kernel adds the partials)
"""
from __future__ import annotations

import torch

import runtime  # must come before numba: it picks the simulator or the GPU
from kernels._launch import cdiv, version_index
from kernels.frames.layernorm import EPS, norm_backward, norm_forward
from kernels.numba.reduction import block_sum_all, warp_sum_all

from numba import cuda, float32

ITEMS = 32
MAX_THREADS = 1024
#: 512 threads of 32 values (see layernorm_reg_kernel's register cap).
REG_THREADS = 512
REG_MAX_COLS = ITEMS * REG_THREADS
#: v3's warp-per-row kernel: 32 values a lane, rows up to 1024 columns, WARP_ROWS rows a block.
WARP_ITEMS = 32
WARP_MAX_COLS = 32 * WARP_ITEMS
WARP_ROWS = 2 if runtime.SIMULATE else 8
#: Threads per block of the row kernels (fewer in simulation: one Python thread each).
ROW_THREADS = 64 if runtime.SIMULATE else 256


# ---------------------------------------------------------------------------------------
# v1: three passes: mean, then the variance from (x - mean)^2, then normalize.
@cuda.jit
def layernorm_block_kernel(x, w, b, y, mean_out, rstd_out, eps):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    inv = float32(1.0) / float32(cols)  # float32: x / cols would promote to float64
    s = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        s += x[row, c]
    mean = block_sum_all(s, scratch) * inv
    q = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        d = x[row, c] - mean
        q += d * d
    rstd = float32(1.0) / (block_sum_all(q, scratch) * inv + eps) ** float32(0.5)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        y[row, c] = (x[row, c] - mean) * rstd * w[c] + b[c]
    if cuda.threadIdx.x == 0:
        mean_out[row] = mean
        rstd_out[row] = rstd


# v2: each thread keeps its columns t, t + blockDim, ... in a local array (registers).
# 32 values a thread and up to 512 threads: capped at 128 registers a thread, so that 512
# threads fit an SM's 65536 registers (uncapped, the launch fails with
# CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on an H100). The simulator takes no register cap.
@cuda.jit(**({} if runtime.SIMULATE else {"max_registers": 128}))
def layernorm_reg_kernel(x, w, b, y, mean_out, rstd_out, eps):
    scratch = cuda.shared.array(32, float32)
    v = cuda.local.array(ITEMS, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    inv = float32(1.0) / float32(cols)  # float32: x / cols would promote to float64
    t, bd = cuda.threadIdx.x, cuda.blockDim.x
    s = float32(0.0)
    for k in range(ITEMS):
        c = t + k * bd
        v[k] = x[row, c] if c < cols else float32(0.0)
        s += v[k]
    mean = block_sum_all(s, scratch) * inv
    q = float32(0.0)
    for k in range(ITEMS):
        if t + k * bd < cols:
            d = v[k] - mean
            q += d * d
    rstd = float32(1.0) / (block_sum_all(q, scratch) * inv + eps) ** float32(0.5)
    for k in range(ITEMS):
        c = t + k * bd
        if c < cols:
            y[row, c] = (v[k] - mean) * rstd * w[c] + b[c]
    if t == 0:
        mean_out[row] = mean
        rstd_out[row] = rstd


# v3 for short rows: a warp per row, reductions by shuffles only (no shared memory, no
# barrier); lane l keeps columns l, l + 32, ... of its row in a local array.
@cuda.jit
def layernorm_warp_kernel(x, w, b, y, mean_out, rstd_out, eps):
    v = cuda.local.array(WARP_ITEMS, float32)
    lane = cuda.threadIdx.x % 32
    row = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    if row >= x.shape[0]:
        return  # a whole warp leaves together: the shuffles below stay full
    cols = x.shape[1]
    inv = float32(1.0) / float32(cols)
    s = float32(0.0)
    for k in range(WARP_ITEMS):
        c = lane + 32 * k
        v[k] = x[row, c] if c < cols else float32(0.0)
        s += v[k]
    mean = warp_sum_all(s) * inv
    q = float32(0.0)
    for k in range(WARP_ITEMS):
        if lane + 32 * k < cols:
            d = v[k] - mean
            q += d * d
    rstd = float32(1.0) / (warp_sum_all(q) * inv + eps) ** float32(0.5)
    for k in range(WARP_ITEMS):
        c = lane + 32 * k
        if c < cols:
            y[row, c] = (v[k] - mean) * rstd * w[c] + b[c]
    if lane == 0:
        mean_out[row] = mean
        rstd_out[row] = rstd


# ---------------------------------------------------------------------------------------
# Backward of one row (dx), returning nothing: both row sums first, then dx.
@cuda.jit(device=True)
def _row_sums(dy, x, w, row, mean, rstd, scratch):
    s1 = float32(0.0)
    s2 = float32(0.0)
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        g = dy[row, c] * w[c]
        s1 += g * (x[row, c] - mean) * rstd
        s2 += g
    # block_sum_all begins with a barrier: the second sum cannot overwrite scratch early
    inv = float32(1.0) / float32(x.shape[1])
    c1 = block_sum_all(s1, scratch) * inv
    c2 = block_sum_all(s2, scratch) * inv
    return c1, c2


@cuda.jit
def layernorm_bwd_atomic_kernel(dy, x, w, mean_in, rstd_in, dx, dw, db):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    mean, rstd = mean_in[row], rstd_in[row]
    c1, c2 = _row_sums(dy, x, w, row, mean, rstd, scratch)
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        xhat = (x[row, c] - mean) * rstd
        dx[row, c] = (dy[row, c] * w[c] - xhat * c1 - c2) * rstd
        cuda.atomic.add(dw, c, dy[row, c] * xhat)
        cuda.atomic.add(db, c, dy[row, c])


@cuda.jit
def layernorm_bwd_partials_kernel(dy, x, w, mean_in, rstd_in, dx, pdw, pdb):
    # stage 1: block k owns row k of pdw/pdb; column c is always thread c % blockDim's
    scratch = cuda.shared.array(32, float32)
    k = cuda.blockIdx.x
    cols = x.shape[1]
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        pdw[k, c] = float32(0.0)
        pdb[k, c] = float32(0.0)
    for row in range(k, x.shape[0], cuda.gridDim.x):
        mean, rstd = mean_in[row], rstd_in[row]
        c1, c2 = _row_sums(dy, x, w, row, mean, rstd, scratch)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            xhat = (x[row, c] - mean) * rstd
            dx[row, c] = (dy[row, c] * w[c] - xhat * c1 - c2) * rstd
            pdw[k, c] += dy[row, c] * xhat
            pdb[k, c] += dy[row, c]


@cuda.jit
def column_sum_kernel(p, out):
    # stage 2: a thread per column adds the partials of every block
    c = cuda.grid(1)
    if c < p.shape[1]:
        s = float32(0.0)
        for k in range(p.shape[0]):
            s += p[k, c]
        out[c] = s


# ---------------------------------------------------------------------------------------
# RMSNorm
@cuda.jit
def rmsnorm_kernel(x, w, y, rstd_out, eps):
    scratch = cuda.shared.array(32, float32)
    row = cuda.blockIdx.x
    cols = x.shape[1]
    inv = float32(1.0) / float32(cols)  # float32: x / cols would promote to float64
    q = float32(0.0)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        q += x[row, c] * x[row, c]
    rstd = float32(1.0) / (block_sum_all(q, scratch) * inv + eps) ** float32(0.5)
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        y[row, c] = x[row, c] * rstd * w[c]
    if cuda.threadIdx.x == 0:
        rstd_out[row] = rstd


@cuda.jit
def rmsnorm_bwd_partials_kernel(dy, x, w, rstd_in, dx, pdw):
    scratch = cuda.shared.array(32, float32)
    k = cuda.blockIdx.x
    cols = x.shape[1]
    inv = float32(1.0) / float32(cols)  # float32: x / cols would promote to float64
    for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
        pdw[k, c] = float32(0.0)
    for row in range(k, x.shape[0], cuda.gridDim.x):
        rstd = rstd_in[row]
        s = float32(0.0)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            s += dy[row, c] * w[c] * x[row, c] * rstd
        c1 = block_sum_all(s, scratch) * inv
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            xhat = x[row, c] * rstd
            dx[row, c] = (dy[row, c] * w[c] - xhat * c1) * rstd
            pdw[k, c] += dy[row, c] * xhat


# ---------------------------------------------------------------------------------------
def _warps(n):
    return min(MAX_THREADS, max(32, cdiv(n, 32) * 32))


def _row_threads(cols):
    return min(ROW_THREADS, _warps(cols))


def _forward(kernel, threads_of, x, w, b, eps, stats, op):
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        args = [runtime.to_numba(t) for t in (x, w, b, y, mean, rstd)]
        kernel[rows, threads_of(cols)](*args, float32(eps))
    return norm_forward(x, w, b, eps, stats, op=op, launch=launch)


def layernorm_block(x, w, b, eps=EPS, stats=False):
    """v1: a block per row, three passes over the row."""
    return _forward(layernorm_block_kernel, _row_threads, x, w, b, eps, stats, "layernorm_block")


def layernorm_reg(x, w, b, eps=EPS, stats=False):
    """v2: the row in registers, at most 16384 columns."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols > REG_MAX_COLS:
        raise ValueError(f"layernorm_reg holds a row in registers, at most {REG_MAX_COLS} columns; got {cols}")
    return _forward(layernorm_reg_kernel, _reg_threads, x, w, b, eps, stats, "layernorm_reg")


_launch_warp = runtime.NumbaLauncher(layernorm_warp_kernel)
_launch_reg = runtime.NumbaLauncher(layernorm_reg_kernel)
_launch_block = runtime.NumbaLauncher(layernorm_block_kernel)


def _reg_threads(cols):
    return _warps(cdiv(cols, ITEMS)) if not runtime.SIMULATE else max(_warps(cdiv(cols, ITEMS)), 32)


def layernorm(x, w, b, eps=EPS, stats=False):
    """The reference: a warp per row up to 1024 columns, a block per row in registers up to
    16384, three passes beyond; the launch through ``runtime.NumbaLauncher``."""
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        if cols <= WARP_MAX_COLS:
            _launch_warp(cdiv(rows, WARP_ROWS), 32 * WARP_ROWS, x, w, b, y, mean, rstd, float32(eps))
        elif cols <= REG_MAX_COLS:
            _launch_reg(rows, _reg_threads(cols), x, w, b, y, mean, rstd, float32(eps))
        else:
            _launch_block(rows, _row_threads(cols), x, w, b, y, mean, rstd, float32(eps))
    return norm_forward(x, w, b, eps, stats, op="layernorm", launch=launch)


def _parts(rows):
    return max(1, min(rows, 4 if runtime.SIMULATE else 264))


def layernorm_backward_atomic(dy, x, w, mean, rstd):
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        args = [runtime.to_numba(t) for t in (dy, x, w, mean, rstd, dx, dw, db)]
        layernorm_bwd_atomic_kernel[rows, _row_threads(cols)](*args)
    return norm_backward(dy, x, w, mean, rstd, op="layernorm_backward_atomic", launch=launch)


_launch_bwd = runtime.NumbaLauncher(layernorm_bwd_partials_kernel)
_launch_colsum = runtime.NumbaLauncher(column_sum_kernel)
_launch_rms = runtime.NumbaLauncher(rmsnorm_kernel)
_launch_rms_bwd = runtime.NumbaLauncher(rmsnorm_bwd_partials_kernel)
#: Threads per block of the column sum (a thread per column).
COLSUM_THREADS = 64 if runtime.SIMULATE else 256


def _column_sum(p, out):
    """out (cols,) = the sum over the rows of the (parts, cols) partials p."""
    _launch_colsum(cdiv(p.shape[1], COLSUM_THREADS), COLSUM_THREADS, p, out)


def layernorm_backward_partials(dy, x, w, mean, rstd):
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        parts = _parts(rows)
        pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        pdb = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        _launch_bwd(parts, _row_threads(cols), dy, x, w, mean, rstd, dx, pdw, pdb)
        _column_sum(pdw, dw)
        _column_sum(pdb, db)
    # the column sums write every value of dw and db: no zeros first
    return norm_backward(dy, x, w, mean, rstd, op="layernorm_backward_partials", launch=launch, accumulate=False)


layernorm_backward = layernorm_backward_partials


def rmsnorm(x, w, eps=EPS, stats=False):
    def launch(x, w, y, rstd, rows, cols, eps):
        _launch_rms(rows, _row_threads(cols), x, w, y, rstd, float32(eps))
    return norm_forward(x, w, None, eps, stats, op="rmsnorm", launch=launch, rms=True)


def rmsnorm_backward(dy, x, w, rstd):
    def launch(dy, x, w, rstd, dx, dw, rows, cols):
        parts = _parts(rows)
        pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        _launch_rms_bwd(parts, _row_threads(cols), dy, x, w, rstd, dx, pdw)
        _column_sum(pdw, dw)
    return norm_backward(dy, x, w, None, rstd, op="rmsnorm_backward", launch=launch, rms=True, accumulate=False)


VERSIONS = version_index(__doc__, v1=layernorm_block, v2=layernorm_reg, v3=layernorm)
REFERENCE = "v3"

BACKWARD_VERSIONS = version_index(__doc__, atomic=layernorm_backward_atomic, partials=layernorm_backward_partials)
BACKWARD_REFERENCE = "partials"
