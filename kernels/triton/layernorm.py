"""LayerNorm and RMSNorm over the last dim in Triton, forward and backward.

Forward (``VERSIONS``; each launcher is ``f(x, w, b, eps=1e-5, stats=False)`` and returns y,
or ``(y, mean, rstd)`` with ``stats=True``: the float32 statistics the backward needs):

    v1  a program per row, three passes over the row in chunks (x read 3 times)
        layernorm_chunked: one pass for the mean, one for the variance, one to normalize
    v2  a program per row, the row in registers: x read once, two-pass variance on chip
        layernorm_row (the reference up to 32768 columns)
    v3  the reference: ROWS rows per program (a 2-D tile) in registers, v1 for rows longer than 32768
        layernorm: short rows fill a program as one 2-D tile; v2's kernel where one row fills it

Backward (``BACKWARD_VERSIONS``; ``f(dy, x, w, mean, rstd)`` returns ``(dx, dw, db)``):

    atomic  dx per row, dw/db by atomic_add (one per column per row)
            simple, contended, order-dependent in the last bits
    partials  fused: dx and per-program dw/db partials, then a column-sum kernel
              a persistent program walks its rows ROWS at a time, computes dx and keeps its
              dw/db partial sums in registers; a second kernel sums the partials (deterministic)

RMSNorm (``rmsnorm(x, w)`` -> y or (y, rstd); ``rmsnorm_backward(dy, x, w, rstd)`` -> (dx, dw)).

x may be float32 or bfloat16 (statistics and accumulations in float32, y in x's dtype), or
float64 (everything in float64: what gradcheck needs).
"""
from __future__ import annotations

import functools

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import sm_count, version_index
from kernels.frames.layernorm import EPS, norm_backward, norm_forward, stats_dtype

import triton
import triton.language as tl

#: The widest row v2 holds in registers (16 warps x 32 lanes x 64 values).
ROW_MAX_COLS = 32768
CHUNK = 1024


def num_warps_for(block: int) -> int:
    return max(1, min(16, block // 256))


# ---------------------------------------------------------------------------------------
# v1: the row in chunks of BLOCK columns, three passes (mean, variance, normalize).
@triton.jit
def layernorm_chunked_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, cols, eps,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    y_row = y_ptr + row * cols
    acc = tl.zeros([BLOCK], dtype=mean_ptr.dtype.element_ty)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + offs, mask=offs < cols, other=0.0).to(mean_ptr.dtype.element_ty)
    mean = tl.sum(acc, axis=0) / cols
    # the variance from (x - mean)^2, never E[x^2] - E[x]^2 (which cancels when |mean| >> std)
    acc = tl.zeros([BLOCK], dtype=mean_ptr.dtype.element_ty)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        d = tl.where(mask, tl.load(x_row + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------
# v2: one program per row, the whole row (BLOCK >= cols) in registers. x is read once; the
# variance is still two-pass, but the second pass runs over registers, not memory.
@triton.jit
def layernorm_row_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, cols, eps,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * cols can pass 2**31
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    mean = tl.sum(x, axis=0) / cols
    d = tl.where(mask, x - mean, 0.0)  # the masked lanes must not add (0 - mean)^2
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    tl.store(y_ptr + row * cols + offs, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


# ---------------------------------------------------------------------------------------
# v3: ROWS rows per program, as one [ROWS, BLOCK] tile. A row of 512 floats is 2 KB: one
# program per row leaves most lanes of a 4-warp program idle or moves too few bytes per
# program; ROWS rows keep every lane busy with wide (16-byte) loads. The reductions run
# along axis 1, one mean and one rstd per row.
@triton.jit
def layernorm_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, eps,
                          ROWS: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
                          RMS: tl.constexpr = False):
    # RMS: RMSNorm (no mean, no b: b_ptr and mean_ptr are not read or written)
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    rmask = r < rows
    cmask = c < cols
    mask = rmask[:, None] & cmask[None, :]
    offs = r[:, None] * cols + c[None, :]
    st = rstd_ptr.dtype.element_ty
    # EVICT = "evict_first": x is read once, so it need not stay in L2 (a hint; tried on the H100)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(st)
    w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(st)
    if RMS:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / cols + eps)
        y = x * rstd[:, None] * w[None, :]
    else:
        mean = tl.sum(x, axis=1) / cols
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / cols + eps)
        b = tl.load(b_ptr + c, mask=cmask, other=0.0).to(st)
        y = d * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(mean_ptr + r, mean, mask=rmask)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + r, rstd, mask=rmask)


#: float64 runs too (the interpreter and the GPU), for gradcheck; its statistics are float64.
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def _forward(kernel, x, w, b, eps, stats, block, op):
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        kernel[(rows,)](x, w, b, y, mean, rstd, cols, eps, BLOCK=block, num_warps=num_warps_for(block))
    return norm_forward(x, w, b, eps, stats, op=op, launch=launch, dtypes=DTYPES)


def layernorm_chunked(x, w, b, eps=EPS, stats=False):
    """v1: three passes over the row in chunks of 1024 columns."""
    return _forward(layernorm_chunked_kernel, x, w, b, eps, stats, CHUNK, "layernorm_chunked")


def layernorm_row(x, w, b, eps=EPS, stats=False):
    """v2: the row in registers (rows up to ROW_MAX_COLS columns)."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols > ROW_MAX_COLS:
        raise ValueError(f"layernorm_row holds a row in registers, at most {ROW_MAX_COLS} columns; "
                         f"got {cols}: use layernorm_chunked")
    return _forward(layernorm_row_kernel, x, w, b, eps, stats, triton.next_power_of_2(max(cols, 1)),
                    "layernorm_row")


#: Bytes of x one program of v3 holds (ROWS x BLOCK elements): a row of 512 floats is 2 KB,
#: so 8 rows a program; one row of 4096 floats fills it. A warp per 2 KB, 4 to 16 warps.
#: Picked from a sweep on an H100 (benchmarks/tune/layernorm_tune.py).
TILE_BYTES = 16384
#: The eviction hint of v3's load of x ("" or "evict_first": x is read once).
EVICT = ""


@functools.lru_cache(maxsize=256)
def rows_config(cols: int, itemsize: int, tile_bytes: int = TILE_BYTES) -> tuple[int, int, int]:
    """(ROWS, BLOCK, num_warps) of v3 for rows of ``cols`` elements of ``itemsize`` bytes."""
    block = triton.next_power_of_2(max(cols, 1))
    if runtime.SIMULATE:
        return min(4, max(1, 1024 // block)), block, 1
    rows = max(1, tile_bytes // (block * itemsize))
    warps = max(4, min(16, rows * block * itemsize // 2048))
    return rows, block, warps


def layernorm(x, w, b, eps=EPS, stats=False):
    """The reference: ROWS rows per program in registers (rows up to 32768 columns), v1 beyond."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols > ROW_MAX_COLS:
        return layernorm_chunked(x, w, b, eps, stats)

    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        nrows, block, warps = rows_config(cols, x.element_size())
        if nrows == 1:
            # One row a program: v2's 1-D kernel. (On an H100 the [1, BLOCK] tile of the 2-D
            # kernel ran bfloat16 rows of 16384 at 71% of copy, the 1-D one at 93%.)
            layernorm_row_kernel[(rows,)](x, w, b, y, mean, rstd, cols, eps, BLOCK=block, num_warps=warps)
        else:
            layernorm_rows_kernel[(triton.cdiv(rows, nrows),)](x, w, b, y, mean, rstd, rows, cols, eps,
                                                               ROWS=nrows, BLOCK=block, EVICT=EVICT, num_warps=warps)
    return norm_forward(x, w, b, eps, stats, op="layernorm", launch=launch, dtypes=DTYPES)


# ---------------------------------------------------------------------------------------
# Backward. With xhat = (x - mean) * rstd and g = dy * w:
#     dx = rstd * (g - mean(g) - xhat * mean(g * xhat))     two row reductions
#     dw = sum over rows of dy * xhat,  db = sum over rows of dy   reductions ACROSS rows
@triton.jit
def _row_dx(dy_ptr, x_ptr, w, mean_ptr, rstd_ptr, dx_ptr, row, cols, offs, mask):
    dy = tl.load(dy_ptr + row * cols + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    g = dy * w
    c1 = tl.sum(g * xhat, axis=0) / cols
    c2 = tl.sum(g, axis=0) / cols
    dx = (g - xhat * c1 - c2) * rstd
    tl.store(dx_ptr + row * cols + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    return dy * xhat, dy


@triton.jit
def layernorm_bwd_atomic_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                                cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(mean_ptr.dtype.element_ty)
    pdw, pdb = _row_dx(dy_ptr, x_ptr, w, mean_ptr, rstd_ptr, dx_ptr, row, cols, offs, mask)
    # every row adds into the same cols floats: atomics, never a plain read-add-store
    tl.atomic_add(dw_ptr + offs, pdw, mask=mask)
    tl.atomic_add(db_ptr + offs, pdb, mask=mask)


@triton.jit
def layernorm_bwd_partials_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, pdw_ptr, pdb_ptr,
                                  rows, cols, ROWS: tl.constexpr, BLOCK: tl.constexpr, RMS: tl.constexpr = False,
                                  ADD_DX: tl.constexpr = False):
    # a persistent program: row groups pid, pid + P, ... of ROWS rows each, as one
    # [ROWS, BLOCK] tile; its share of dw/db stays in registers until the end.
    # RMS: RMSNorm's backward (no mean, no db: mean_ptr and pdb_ptr are not read or written)
    # ADD_DX: dx += the gradient instead of dx = (a residual stream's gradient: the LayerNorm's
    # input also went on along the residual path, whose gradient dx holds already)
    pid = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    cmask = c < cols
    st = pdw_ptr.dtype.element_ty
    w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(st)
    acc_dw = tl.zeros([BLOCK], dtype=st)
    acc_db = tl.zeros([BLOCK], dtype=st)
    for g in range(pid, tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tl.cast(g, tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = r < rows
        mask = rmask[:, None] & cmask[None, :]
        offs = r[:, None] * cols + c[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(st)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(st)
        rstd = tl.load(rstd_ptr + r, mask=rmask, other=0.0)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(mean_ptr + r, mask=rmask, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g_ = dy * w[None, :]
        c1 = tl.sum(g_ * xhat, axis=1) / cols
        dx = g_ - xhat * c1[:, None]
        if not RMS:
            dx = dx - (tl.sum(g_, axis=1) / cols)[:, None]
        dx = dx * rstd[:, None]
        if ADD_DX:
            dx += tl.load(dx_ptr + offs, mask=mask, other=0.0).to(st)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        acc_dw += tl.sum(dy * xhat, axis=0)
        if not RMS:
            acc_db += tl.sum(dy, axis=0)
    tl.store(pdw_ptr + pid * cols + c, acc_dw, mask=cmask)
    if not RMS:
        tl.store(pdb_ptr + pid * cols + c, acc_db, mask=cmask)


@triton.jit
def column_sum_kernel(p_ptr, out_ptr, out2_ptr, parts, cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # stage 2: out[c] = sum over parts of p[part, c], a program per BLOCK_C columns; with a
    # second grid row (program_id(1) = 1), also out2[c] = the sum of the next (parts, cols)
    # partials p[parts + part, c] (dw's partials, then db's: one launch for both)
    h = tl.program_id(1).to(tl.int64)  # int64 first: parts * cols may pass int32, and parts may be the constant 1
    p_ptr += h * parts * cols
    if h == 1:
        out_ptr = out2_ptr
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=p_ptr.dtype.element_ty)
    for start in range(0, parts, BLOCK_P):
        ps = start + tl.arange(0, BLOCK_P)
        m = (ps[:, None] < parts) & (cs[None, :] < cols)
        acc += tl.load(p_ptr + ps[:, None] * cols + cs[None, :], mask=m, other=0.0)
    tl.store(out_ptr + cs, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cs < cols)


def _backward_frame(dy, x, w, mean, rstd, op, launch, rms=False, accumulate=False):
    return norm_backward(dy, x, w, mean, rstd, op=op, launch=launch, rms=rms, dtypes=DTYPES, max_cols=ROW_MAX_COLS,
                         accumulate=accumulate)


def layernorm_backward_atomic(dy, x, w, mean, rstd):
    """dx per row, dw/db by atomics."""
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        block = triton.next_power_of_2(cols)
        layernorm_bwd_atomic_kernel[(rows,)](dy, x, w, mean, rstd, dx, dw, db, cols, BLOCK=block,
                                             num_warps=num_warps_for(block))
    return _backward_frame(dy, x, w, mean, rstd, "layernorm_backward_atomic", launch, accumulate=True)


#: Persistent programs of the backward per SM, by the element size (each writes a row of
#: partial sums: more programs overlap better, but the partials are extra traffic), and the
#: bytes of x and dy one step of a program holds. From the H200 sweep at 4096 x 4096
#: (benchmarks/tune/layernorm_tune.py bwd3): float32 78.1 us with 1 program an SM (82.3 with
#: 2), bfloat16 46.5 us with 2 (62.7 with 1).
BWD_PROGRAMS_PER_SM = {4: 1, 2: 2}
BWD_TILE_BYTES = 8192


@functools.lru_cache(maxsize=256)
def bwd_config(rows: int, cols: int, itemsize: int) -> tuple[int, int, int, int]:
    """(ROWS, BLOCK, num_warps, programs) of the backward kernels."""
    block = triton.next_power_of_2(max(cols, 1))
    if runtime.SIMULATE:
        return min(4, max(1, 1024 // block)), block, 1, max(1, min(triton.cdiv(rows, 4), 8))
    nrows = max(1, BWD_TILE_BYTES // (block * itemsize))
    warps = max(2, min(16, nrows * block * itemsize // 1024))
    per_sm = BWD_PROGRAMS_PER_SM if isinstance(BWD_PROGRAMS_PER_SM, int) else BWD_PROGRAMS_PER_SM.get(itemsize, 1)
    parts = max(1, min(triton.cdiv(rows, nrows), per_sm * sm_count()))
    return nrows, block, warps, parts


#: Columns per program of the column sum: narrow, so that a (parts, 4096) sum is 128 programs
#: (a program per 128 columns left most SMs idle).
COLSUM_BLOCK = 32


def _column_sum(p, out, out2=None):
    """out (cols,) = the sum over the rows of the (parts, cols) partials p; with ``out2``, p is
    (2, parts, cols) and out2 gets the second sum, in the same launch."""
    parts, cols = p.shape[-2:]
    column_sum_kernel[(triton.cdiv(cols, COLSUM_BLOCK), 1 if out2 is None else 2)](
        p, out, out if out2 is None else out2, parts, cols, BLOCK_P=64, BLOCK_C=COLSUM_BLOCK)


def layernorm_backward_partials(dy, x, w, mean, rstd):
    """Fused dx + per-program dw/db partials, then a second kernel over the partials."""
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        nrows, block, warps, parts = bwd_config(rows, cols, x.element_size())
        p = torch.empty(2, parts, cols, dtype=stats_dtype(x), device=x.device)  # dw's partials, then db's
        pdb = p[1]
        layernorm_bwd_partials_kernel[(parts,)](dy, x, w, mean, rstd, dx, p, pdb, rows, cols, ROWS=nrows,
                                                BLOCK=block, num_warps=warps)
        _column_sum(p, dw, db)
    return _backward_frame(dy, x, w, mean, rstd, "layernorm_backward_partials", launch)


layernorm_backward = layernorm_backward_partials


# ---------------------------------------------------------------------------------------
# RMSNorm: LayerNorm without the mean (and without b). One reduction instead of two, and no
# centering: LLMs (LLaMA, Mistral, ...) use it because it is cheaper and trains as well.
# Its kernels are LayerNorm's v3 and partials kernels with RMS=True.
def rmsnorm(x, w, eps=EPS, stats=False):
    def launch(x, w, y, rstd, rows, cols, eps):
        nrows, block, warps = rows_config(cols, x.element_size())
        layernorm_rows_kernel[(triton.cdiv(rows, nrows),)](x, w, w, y, rstd, rstd, rows, cols, eps, ROWS=nrows,
                                                           BLOCK=block, EVICT=EVICT, RMS=True, num_warps=warps)
    return norm_forward(x, w, None, eps, stats, op="rmsnorm", launch=launch, rms=True, dtypes=DTYPES,
                        max_cols=ROW_MAX_COLS)


def rmsnorm_backward(dy, x, w, rstd):
    def launch(dy, x, w, rstd, dx, dw, rows, cols):
        nrows, block, warps, parts = bwd_config(rows, cols, x.element_size())
        pdw = torch.empty(parts, cols, dtype=stats_dtype(x), device=x.device)
        layernorm_bwd_partials_kernel[(parts,)](dy, x, w, rstd, rstd, dx, pdw, pdw, rows, cols, ROWS=nrows,
                                                BLOCK=block, RMS=True, num_warps=warps)
        _column_sum(pdw, dw)
    return _backward_frame(dy, x, w, None, rstd, "rmsnorm_backward", launch, rms=True)


VERSIONS = version_index(__doc__, v1=layernorm_chunked, v2=layernorm_row, v3=layernorm)
REFERENCE = "v3"

BACKWARD_VERSIONS = version_index(__doc__, atomic=layernorm_backward_atomic, partials=layernorm_backward_partials)
BACKWARD_REFERENCE = "partials"


# ---------------------------------------------------------------------------------------
# Shipping: an autograd.Function (eager). The torch.library op with a fake kernel (so
# torch.compile and opcheck can trace it without running it), course::layernorm_triton, is in
# kernels/ops.py (kernels.ops.layernorm_op).
class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps=EPS):
        y, mean, rstd = layernorm(x, w, b, eps, stats=True)
        ctx.save_for_backward(x, w, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_backward(dy.contiguous(), x, w, mean, rstd)
        return dx, dw, db, None
