"""LayerNorm and RMSNorm in CUDA C++: launchers for ``layernorm.cu``.

The header of ``layernorm.cu`` lists the versions. Forward (``VERSIONS``: ``layernorm_block``
v1, ``layernorm_warp`` v2, ``layernorm_reg`` v3, ``layernorm_v4`` v4, ``layernorm`` v5, the
reference), each ``f(x, w, b, eps=1e-5, stats=False)`` -> y, or (y, mean, rstd). Backward
(``BACKWARD_VERSIONS``: atomic, partials, vec, the reference), ``f(dy, x, w, mean, rstd)`` ->
(dx, dw, db). RMSNorm: ``rmsnorm``, ``rmsnorm_backward`` (v5's kernels with RMS = true).

v5 and the vec backward take float32 and bfloat16 (statistics in float32), the older CUDA C++
versions and Numba's float32 only, Triton's float64 too. The input rules
(``check_norm_inputs``, ``check_norm_backward_inputs``) serve all three languages, and so do the
launchers' frames (``norm_forward``, ``norm_backward``: check, allocate, skip empty input, shape
the result; each launcher passes its launch): they live in ``kernels/frames/layernorm.py``, with
``EPS`` and the references. ``b`` may be None: no bias, as in ``torch.nn.functional.layer_norm``.
"""
from __future__ import annotations

import functools

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, cuda_source, sm_count, version_index
from kernels.frames.layernorm import (  # the frame: input rules and references, shared by the three languages
    EPS,
    F32,  # noqa: F401  (importable from here too)
    INT32_MAX,  # noqa: F401
    check_norm_backward_inputs,
    check_norm_inputs,
    in_shape,
    layernorm_ref,  # noqa: F401
    norm_backward,
    norm_forward,
    rmsnorm_ref,  # noqa: F401
    row_stats,
    stats_dtype,  # noqa: F401
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "layernorm.cu"
REG_ITEMS = (1, 2, 4, 8, 16)
MAX_THREADS = 1024
REG_MAX_COLS = REG_ITEMS[-1] * MAX_THREADS
WARP_MAX_COLS = 256


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str) -> str:
    """The text of one kernel or helper of layernorm.cu (its comment block and body)."""
    return cuda_source(name, SOURCE)


def _threads(cols, per_thread):
    return min(MAX_THREADS, max(32, cdiv(cdiv(cols, per_thread), 32) * 32))


def layernorm_block(x, w, b, eps=EPS, stats=False):
    """v1: a block per row, three passes over the row."""
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        kernel("layernorm_block_kernel")[rows, _threads(cols, 4)](x, w, b, y, mean, rstd, cols, float(eps))
    return norm_forward(x, w, b, eps, stats, op="layernorm_block", launch=launch)


def layernorm_warp(x, w, b, eps=EPS, stats=False):
    """v2: a warp per row, 8 rows per block."""
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        warps = 8
        kernel("layernorm_warp_kernel")[cdiv(rows, warps), 32 * warps](x, w, b, y, mean, rstd, rows, cols,
                                                                        float(eps))
    return norm_forward(x, w, b, eps, stats, op="layernorm_warp", launch=launch)


def reg_config(cols):
    """(items per thread, threads) for v3: about 256 threads, more for long rows."""
    items = next((k for k in REG_ITEMS if cols <= k * 256), REG_ITEMS[-1])
    return items, _threads(cols, items)


def layernorm_reg(x, w, b, eps=EPS, stats=False):
    """v3: the row in registers, at most 16384 columns."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols > REG_MAX_COLS:
        raise ValueError(f"layernorm_reg holds a row in registers, at most {REG_MAX_COLS} columns; got {cols}: "
                         "use layernorm_block")

    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        items, threads = reg_config(cols)
        kernel(f"layernorm_reg{items}_kernel")[rows, threads](x, w, b, y, mean, rstd, cols, float(eps))
    return norm_forward(x, w, b, eps, stats, op="layernorm_reg", launch=launch)


def layernorm_v4(x, w, b, eps=EPS, stats=False):
    """v4: a warp per row up to 256 columns, the row in registers up to 16384, v1 beyond."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols <= WARP_MAX_COLS:
        return layernorm_warp(x, w, b, eps, stats)
    if cols <= REG_MAX_COLS:
        return layernorm_reg(x, w, b, eps, stats)
    return layernorm_block(x, w, b, eps, stats)


def layernorm_backward_atomic(dy, x, w, mean, rstd):
    """dx per row (a block per row), dw/db by atomicAdd."""
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        kernel("layernorm_bwd_atomic_kernel")[rows, _threads(cols, 4)](dy, x, w, mean, rstd, dx, dw, db, cols)
    return norm_backward(dy, x, w, mean, rstd, op="layernorm_backward_atomic", launch=launch)


def _parts(rows):
    return max(1, min(rows, 2 * sm_count()))


def _column_sum(p, out):
    """out (cols,) = the sum over the rows of the (parts, cols) partials p."""
    parts, cols = p.shape
    kernel("column_sum_kernel")[cdiv(cols, 256), 256](p, out, parts, cols)


def layernorm_backward_partials(dy, x, w, mean, rstd):
    """Fused dx + per-block dw/db partials (persistent grid), then a column-sum kernel."""
    def launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols):
        parts = _parts(rows)
        pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        pdb = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        kernel("layernorm_bwd_partials_kernel")[parts, _threads(cols, 4)](dy, x, w, mean, rstd, dx, pdw, pdb,
                                                                          rows, cols)
        _column_sum(pdw, dw)
        _column_sum(pdb, db)
    # the column sums write every value of dw and db: no zeros first
    return norm_backward(dy, x, w, mean, rstd, op="layernorm_backward_partials", launch=launch, accumulate=False)


def rmsnorm_block(x, w, eps=EPS, stats=False):
    """RMSNorm, float32, a block per row (any row length)."""
    def launch(x, w, y, rstd, rows, cols, eps):
        kernel("rmsnorm_kernel")[rows, _threads(cols, 4)](x, w, y, rstd, cols, float(eps))
    return norm_forward(x, w, None, eps, stats, op="rmsnorm", launch=launch, rms=True)


def rmsnorm_backward_partials(dy, x, w, rstd):
    """RMSNorm's backward, float32: per-block partials (any row length)."""
    def launch(dy, x, w, rstd, dx, dw, rows, cols):
        parts = _parts(rows)
        pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
        kernel("rmsnorm_bwd_partials_kernel")[parts, _threads(cols, 4)](dy, x, w, rstd, dx, pdw, rows, cols)
        _column_sum(pdw, dw)
    return norm_backward(dy, x, w, None, rstd, op="rmsnorm_backward", launch=launch, rms=True, accumulate=False)


# ---------------------------------------------------------------------------------------
# v5: 16-byte vectors, the row in registers, a warp per row for short rows.
#: dtypes of v5 and of the vec backward (statistics in float32)
VEC_DTYPES = (torch.float32, torch.bfloat16)
_CTYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}
#: Rows a block of v5's warp-per-row form (measured on an H100: benchmarks/tune/layernorm_tune.py).
WARP_ROWS = 4
#: At most this many 16-byte vectors a thread keeps in registers (forward; the backward keeps
#: x, dy, w and its dw/db shares: 4).
VEC_ITEMS_MAX = 8
BWD_ITEMS_MAX = 4
#: Persistent blocks of the vec backward per SM, at most (fewer where their threads or shared
#: memory do not fit): each has one row in flight.
BWD_BLOCKS_PER_SM = 2


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@functools.lru_cache(maxsize=512)
def vec_config(cols: int, itemsize: int, aligned: bool):
    """(VEC, ITEMS, ROWS, threads) of v5 for rows of ``cols`` elements of ``itemsize`` bytes:
    VEC elements a vector (16 bytes when every row starts 16-byte aligned), ITEMS vectors a
    thread, ROWS rows a block (a warp each), or the whole block on one row (ROWS = 1); None
    for rows longer than registers hold."""
    vec = 16 // itemsize if aligned and cols % (16 // itemsize) == 0 else 1
    nvec = cdiv(cols, vec)
    # In simulation one ITEMS for every row length: each instantiation of the template is one
    # more compilation for the emulator, and the lanes past the row are masked anyway.
    if nvec <= 32 * VEC_ITEMS_MAX:
        items = VEC_ITEMS_MAX if runtime.SIMULATE else _pow2_at_least(cdiv(nvec, 32))
        return vec, items, WARP_ROWS, 32 * WARP_ROWS
    # Long rows: 4 vectors a thread, or 8 where 4 would need more than 512 threads (on the H200,
    # float32 rows of 16384: 8 x 512 threads ran at 86% of copy, 4 x 1024 at 77%; a block of
    # 1024 threads waits at each barrier for 32 warps).
    for most in ((MAX_THREADS,) if runtime.SIMULATE else (512, MAX_THREADS)):
        for items in ((8,) if runtime.SIMULATE else (4, 8)):
            threads = _pow2_at_least(cdiv(nvec, items))
            if threads <= most:
                return vec, items, 1, max(threads, 64)
    return None


def vec_configs(cols: int, itemsize: int) -> list[tuple[int, int, int]]:
    """Every (ITEMS, ROWS, threads) v5 can run aligned rows of ``cols`` elements with (tuning)."""
    nvec = cdiv(cols, 16 // itemsize)
    if nvec <= 32 * VEC_ITEMS_MAX:
        items = _pow2_at_least(cdiv(nvec, 32))
        return [(items, rows, 32 * rows) for rows in (2, 4, 8)]
    out = []
    for items in (1, 2, 4, 8):
        threads = _pow2_at_least(cdiv(nvec, items))
        if 64 <= threads <= MAX_THREADS:
            out.append((items, 1, threads))
    return out


def _aligned(*tensors) -> bool:
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits % 16 == 0


def _vec_forward(x, w, b, eps, stats, op, rms, config=None):
    x, w, b, shape = check_norm_inputs(x, w, b, op=op, dtypes=VEC_DTYPES, bias=not rms)
    rows, cols = x.shape
    y = torch.empty_like(x)
    rstd = row_stats(x)
    mean = rstd if rms else row_stats(x)  # RMSNorm writes no mean
    if rows and cols:
        if config is not None:
            vec, (items, nrows, threads) = 16 // x.element_size(), config
        else:
            cfg = vec_config(cols, x.element_size(), _aligned(x, w, b, y))
            if cfg is None:
                return _long_rows(x, w, b, eps, stats, shape, rms)
            vec, items, nrows, threads = cfg
        name = f"layernorm_vec_kernel<{_CTYPE[x.dtype]}, {vec}, {items}, {nrows}, {'true' if rms else 'false'}>"
        kernel(name)[cdiv(rows, nrows), threads](x, w, w if rms else b, y, mean, rstd, rows, cols, float(eps))
    y = in_shape(y, shape)
    if rms:
        return (y, rstd) if stats else y
    return (y, mean, rstd) if stats else y


def _long_rows(x, w, b, eps, stats, shape, rms):
    """Rows longer than v5 holds in registers: the float32 block-per-row kernels (bfloat16 through
    a float32 copy)."""
    xf, wf = x.float(), w.float()
    if rms:
        y, r = rmsnorm_block(xf, wf, eps, stats=True)
        y = y.to(x.dtype).reshape(shape)
        return (y, r) if stats else y
    y, m, r = layernorm_block(xf, wf, b.float(), eps, stats=True)
    y = y.to(x.dtype).reshape(shape)
    return (y, m, r) if stats else y


def layernorm(x, w, b, eps=EPS, stats=False, config=None):
    """v5, the reference (float32 or bfloat16): 16-byte vectors, the row in registers, a warp per
    row for short rows. ``config`` = (ITEMS, ROWS, threads) overrides the choice (for tuning)."""
    return _vec_forward(x, w, b, eps, stats, "layernorm", False, config)


layernorm_vec = layernorm


def rmsnorm(x, w, eps=EPS, stats=False, config=None):
    """RMSNorm (float32 or bfloat16): v5's kernel without the mean and b. Returns y, or (y, rstd)."""
    return _vec_forward(x, w, None, eps, stats, "rmsnorm", True, config)


#: Threads per block of the column sum: 32 columns x COLSUM_SLICES slices of the parts (the
#: ``#define`` of layernorm.cu).
COLSUM_SLICES = 16


#: Where the vec backward keeps a block's dw/db shares, by the element size: registers (False)
#: or shared memory (True). From the H200 sweep at 4096 x 4096 (benchmarks/tune/layernorm_tune.py
#: bwd3): float32 71.7 us in shared memory against 88.1 in registers, bfloat16 68.5 against 62.1.
BWD_SHARED = {4: True, 2: False}


def _bwd_shared(cols: int, rms: bool, shared: bool) -> int:
    """Bytes of dynamic shared memory of the vec backward: a block's dw (and db) shares, if it
    keeps them there."""
    return (1 if rms else 2) * cols * 4 if shared else 0


@functools.lru_cache(maxsize=512)
def bwd_vec_config(rows: int, cols: int, itemsize: int, aligned: bool, rms: bool = False):
    """(VEC, ITEMS, threads, blocks, SHARED) of the vec backward: a vector a thread up to 1024
    threads (the fastest at 4096 x 4096 on the H200, in both dtypes), BWD_BLOCKS_PER_SM blocks
    an SM (fewer where their threads or shared memory do not fit); None for rows longer than it
    holds."""
    vec = 16 // itemsize if aligned and cols % (16 // itemsize) == 0 else 1
    nvec = cdiv(cols, vec)
    items = BWD_ITEMS_MAX if runtime.SIMULATE else min(BWD_ITEMS_MAX, _pow2_at_least(cdiv(nvec, MAX_THREADS)))
    threads = max(32, _pow2_at_least(cdiv(nvec, items)))
    acc_shared = BWD_SHARED[itemsize]
    shared = _bwd_shared(cols, rms, acc_shared)
    if threads > MAX_THREADS or shared > runtime.max_dynamic_shared():
        return None
    per_sm = max(1, min(BWD_BLOCKS_PER_SM, 2048 // threads, (runtime.max_dynamic_shared() + 1024) // (shared + 1024)))
    return vec, items, threads, max(1, min(rows, per_sm * sm_count())), acc_shared


def bwd_vec_configs(rows: int, cols: int, itemsize: int) -> list[tuple[int, int, int, bool]]:
    """(ITEMS, threads, blocks, SHARED) the vec backward can run aligned rows with (tuning)."""
    nvec = cdiv(cols, 16 // itemsize)
    out = []
    for items in (1, 2, 4):
        threads = _pow2_at_least(cdiv(nvec, items))
        if 64 <= threads <= MAX_THREADS:
            out += [(items, threads, per_sm * sm_count(), shared)
                    for shared in (False, True) for per_sm in (1, 2, 3, 4)]
    return out


def _vec_backward(dy, x, w, mean, rstd, op, rms, config=None):
    stats = ((rstd, "rstd"),) if rms else ((mean, "mean"), (rstd, "rstd"))
    dy, x, w, got, shape = check_norm_backward_inputs(dy, x, w, stats, op=op, dtypes=VEC_DTYPES)
    rstd = got[-1]
    mean = rstd if rms else got[0]
    rows, cols = x.shape
    dx = torch.empty_like(x)
    if rows == 0 or cols == 0:
        zero = torch.zeros(cols, dtype=w.dtype, device=x.device)
        dx = in_shape(dx, shape)
        return (dx, zero) if rms else (dx, zero, zero.clone())
    if config is not None:
        vec, (items, threads, parts, acc_shared) = 16 // x.element_size(), config
    else:
        cfg = bwd_vec_config(rows, cols, x.element_size(), _aligned(dy, x, w, dx), rms)
        if cfg is None:  # rows too long: the float32 partials kernels (bfloat16 through float32)
            out = (rmsnorm_backward_partials(dy.float(), x.float(), w.float(), rstd) if rms else
                   layernorm_backward_partials(dy.float(), x.float(), w.float(), mean, rstd))
            return (out[0].to(x.dtype).reshape(shape),) + tuple(t.to(w.dtype) for t in out[1:])
        vec, items, threads, parts, acc_shared = cfg
    parts = min(parts, rows)
    halves = 1 if rms else 2
    # one buffer for the partials of dw and db, and one launch sums both
    p = torch.empty(halves, parts, cols, dtype=torch.float32, device=x.device)
    name = (f"layernorm_bwd_vec_kernel<{_CTYPE[x.dtype]}, {vec}, {items}, {'true' if rms else 'false'}, "
            f"{'true' if acc_shared else 'false'}>")
    kernel(name)[parts, threads, _bwd_shared(cols, rms, acc_shared)](dy, x, w, mean, rstd, dx, p, rows, cols)
    dw = torch.empty(cols, dtype=w.dtype, device=x.device)
    db = dw if rms else torch.empty(cols, dtype=w.dtype, device=x.device)
    kernel(f"column_sum_vec_kernel<{_CTYPE[w.dtype]}>")[(cdiv(cols, 32), halves), (32, COLSUM_SLICES)](
        p, dw, db, parts, cols)
    dx = in_shape(dx, shape)
    return (dx, dw) if rms else (dx, dw, db)


def layernorm_backward_vec(dy, x, w, mean, rstd, config=None):
    """The reference backward (float32 or bfloat16): a persistent grid, x and dy read once with
    16-byte loads, each thread's dw/db shares in registers; then a column sum of the partials.
    dw and db come back in w's dtype."""
    return _vec_backward(dy, x, w, mean, rstd, "layernorm_backward", False, config)


def rmsnorm_backward(dy, x, w, rstd, config=None):
    """RMSNorm's backward (float32 or bfloat16): the vec backward without the mean and db.
    Returns (dx, dw)."""
    return _vec_backward(dy, x, w, None, rstd, "rmsnorm_backward", True, config)


layernorm_backward = layernorm_backward_vec


VERSIONS = version_index(SOURCE, v1=layernorm_block, v2=layernorm_warp, v3=layernorm_reg, v4=layernorm_v4, v5=layernorm)
REFERENCE = "v5"

BACKWARD_VERSIONS = version_index(
    SOURCE, atomic=layernorm_backward_atomic, partials=layernorm_backward_partials, vec=layernorm_backward_vec)
BACKWARD_REFERENCE = "vec"
