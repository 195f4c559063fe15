"""LayerNorm and RMSNorm in CUDA C++: launchers for ``layernorm.cu``.

Forward (``VERSIONS``; ``f(x, w, b, eps=1e-5, stats=False)`` -> y, or (y, mean, rstd)):

    v1  layernorm_block   a block per row, three passes over the row from memory
    v2  layernorm_warp    a warp per row (short rows), reductions by shuffles only
    v3  layernorm_reg     a block per row held in registers: x read once
    v4  layernorm         the reference: v2 up to 256 columns, v3 up to 16384, v1 beyond

Backward (``BACKWARD_VERSIONS``; ``f(dy, x, w, mean, rstd)`` -> (dx, dw, db)): atomics, or
per-block partials plus a column-sum kernel. RMSNorm: ``rmsnorm``, ``rmsnorm_backward``.

The CUDA C++ kernels take float32 only; the shared input rules (``check_norm_inputs``)
also serve the Triton and Numba launchers, which accept bfloat16 too.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

import torch

import utils

SOURCE = utils.KERNELS_DIR / "cuda" / "layernorm.cu"
EPS = 1e-5
REG_ITEMS = (1, 2, 4, 8, 16)
MAX_THREADS = 1024
REG_MAX_COLS = REG_ITEMS[-1] * MAX_THREADS
WARP_MAX_COLS = 256
INT32_MAX = 2**31 - 1


def check_norm_inputs(x, w, b=None, *, op="layernorm", name="x", dtypes=(torch.float32, torch.bfloat16)):
    """``(x2d, w, b, shape)``: x as a contiguous (rows, cols) tensor, w and b contiguous of
    ``cols`` values, or a clear error. Any leading dims are flattened into rows."""
    for t, n in ((x, name), (w, "w"), (b, "b")):
        if t is None and n == "b":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {n} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"{op}: {n} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
        if t.device.type != utils.DEVICE.type:
            raise ValueError(f"{op}: {n} is on {t.device}, but the kernels run on {utils.DEVICE}: "
                             f"move it with {n}.to(utils.DEVICE)")
    if x.dim() < 1:
        raise ValueError(f"{op}: {name} must have at least one dim (the normalized one), got a scalar")
    cols = x.shape[-1]
    for t, n in ((w, "w"), (b, "b")):
        if t is not None and tuple(t.shape) != (cols,):
            raise ValueError(f"{op}: {n} must have shape ({cols},) (x's last dim), got {tuple(t.shape)}")
    if x.numel() > INT32_MAX:
        raise ValueError(f"{op}: {name} has {x.numel()} elements, more than int32 indexes: split it")
    shape = tuple(x.shape)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    x2 = x.reshape(rows, cols).contiguous()
    return x2, w.contiguous(), (b.contiguous() if b is not None else None), shape


def layernorm_ref(x, w, b, eps=EPS):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm_ref(x, w, eps=EPS):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    """A kernel of layernorm.cu, compiled once."""
    return utils.cuda_kernel(SOURCE, name)


def source(name: str) -> str:
    from kernels.cuda.reduction import source as _source
    return _source(name, SOURCE)


def cdiv(a, b):
    return (a + b - 1) // b


def sm_count() -> int:
    if utils.SIMULATE:
        return 4
    return torch.cuda.get_device_properties(utils.DEVICE).multi_processor_count


def _threads(cols, per_thread):
    return min(MAX_THREADS, max(32, cdiv(cdiv(cols, per_thread), 32) * 32))


def _inputs(x, w, b, op):
    return check_norm_inputs(x, w, b, op=op, dtypes=(torch.float32,))


def _forward(x, w, b, eps, stats, op, launch):
    x, w, b, shape = _inputs(x, w, b, op)
    rows, cols = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows and cols:
        launch(x, w, b, y, mean, rstd, rows, cols, float(eps))
    y = y.reshape(shape)
    return (y, mean, rstd) if stats else y


def layernorm_block(x, w, b, eps=EPS, stats=False):
    """v1: a block per row, three passes over the row."""
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        kernel("layernorm_block_kernel")[rows, _threads(cols, 4)](x, w, b, y, mean, rstd, cols, eps)
    return _forward(x, w, b, eps, stats, "layernorm_block", launch)


def layernorm_warp(x, w, b, eps=EPS, stats=False):
    """v2: a warp per row, 8 rows per block."""
    def launch(x, w, b, y, mean, rstd, rows, cols, eps):
        warps = 8
        kernel("layernorm_warp_kernel")[cdiv(rows, warps), 32 * warps](x, w, b, y, mean, rstd, rows, cols, eps)
    return _forward(x, w, b, eps, stats, "layernorm_warp", launch)


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
        kernel(f"layernorm_reg{items}_kernel")[rows, threads](x, w, b, y, mean, rstd, cols, eps)
    return _forward(x, w, b, eps, stats, "layernorm_reg", launch)


def layernorm(x, w, b, eps=EPS, stats=False):
    """The reference: a warp per row up to 256 columns, the row in registers up to 16384, v1 beyond."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if cols <= WARP_MAX_COLS:
        return layernorm_warp(x, w, b, eps, stats)
    if cols <= REG_MAX_COLS:
        return layernorm_reg(x, w, b, eps, stats)
    return layernorm_block(x, w, b, eps, stats)


def _backward_inputs(dy, x, w, stats_, op):
    x, w, _, shape = _inputs(x, w, None, op)
    dy, _, _, dshape = check_norm_inputs(dy, w, None, op=op, name="dy", dtypes=(torch.float32,))
    if dshape != shape:
        raise ValueError(f"{op}: dy must have x's shape {shape}, got {dshape}")
    rows = x.shape[0]
    out = []
    for t, name in stats_:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != rows:
            raise ValueError(f"{op}: {name} must be a float32 tensor of {rows} values (one per row)")
        out.append(t.reshape(rows).contiguous())
    return dy, x, w, out, shape


def layernorm_backward_atomic(dy, x, w, mean, rstd):
    """dx per row (a block per row), dw/db by atomicAdd."""
    dy, x, w, (mean, rstd), shape = _backward_inputs(dy, x, w, ((mean, "mean"), (rstd, "rstd")),
                                                     "layernorm_backward_atomic")
    rows, cols = x.shape
    dx = torch.empty_like(x)
    dw = torch.zeros(cols, dtype=torch.float32, device=x.device)
    db = torch.zeros(cols, dtype=torch.float32, device=x.device)
    if rows and cols:
        kernel("layernorm_bwd_atomic_kernel")[rows, _threads(cols, 4)](dy, x, w, mean, rstd, dx, dw, db, cols)
    return dx.reshape(shape), dw, db


def _parts(rows):
    return max(1, min(rows, (2 if utils.SIMULATE else 2) * sm_count()))


def layernorm_backward_partials(dy, x, w, mean, rstd):
    """Fused dx + per-block dw/db partials (persistent grid), then a column-sum kernel."""
    dy, x, w, (mean, rstd), shape = _backward_inputs(dy, x, w, ((mean, "mean"), (rstd, "rstd")),
                                                     "layernorm_backward_partials")
    rows, cols = x.shape
    dx = torch.empty_like(x)
    dw = torch.zeros(cols, dtype=torch.float32, device=x.device)
    db = torch.zeros(cols, dtype=torch.float32, device=x.device)
    if rows == 0 or cols == 0:
        return dx.reshape(shape), dw, db
    parts = _parts(rows)
    pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
    pdb = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
    kernel("layernorm_bwd_partials_kernel")[parts, _threads(cols, 4)](dy, x, w, mean, rstd, dx, pdw, pdb, rows, cols)
    kernel("column_sum_kernel")[cdiv(cols, 256), 256](pdw, dw, parts, cols)
    kernel("column_sum_kernel")[cdiv(cols, 256), 256](pdb, db, parts, cols)
    return dx.reshape(shape), dw, db


layernorm_backward = layernorm_backward_partials


def rmsnorm(x, w, eps=EPS, stats=False):
    x, w, _, shape = _inputs(x, w, None, "rmsnorm")
    rows, cols = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows and cols:
        kernel("rmsnorm_kernel")[rows, _threads(cols, 4)](x, w, y, rstd, cols, float(eps))
    y = y.reshape(shape)
    return (y, rstd) if stats else y


def rmsnorm_backward(dy, x, w, rstd):
    dy, x, w, (rstd,), shape = _backward_inputs(dy, x, w, ((rstd, "rstd"),), "rmsnorm_backward")
    rows, cols = x.shape
    dx = torch.empty_like(x)
    dw = torch.zeros(cols, dtype=torch.float32, device=x.device)
    if rows == 0 or cols == 0:
        return dx.reshape(shape), dw
    parts = _parts(rows)
    pdw = torch.empty(parts, cols, dtype=torch.float32, device=x.device)
    kernel("rmsnorm_bwd_partials_kernel")[parts, _threads(cols, 4)](dy, x, w, rstd, dx, pdw, rows, cols)
    kernel("column_sum_kernel")[cdiv(cols, 256), 256](pdw, dw, parts, cols)
    return dx.reshape(shape), dw


VERSIONS = OrderedDict(
    v1=("a block per row, three passes over the row from memory", layernorm_block),
    v2=("a warp per row, reductions by shuffles only (short rows)", layernorm_warp),
    v3=("a block per row held in registers: x read once", layernorm_reg),
    v4=("the reference: v2 up to 256 columns, v3 up to 16384, v1 beyond", layernorm),
)
REFERENCE = "v4"

BACKWARD_VERSIONS = OrderedDict(
    atomic=("dx per row, dw/db by atomicAdd", layernorm_backward_atomic),
    partials=("fused: dx and per-block dw/db partials, then a column-sum kernel", layernorm_backward_partials),
)
BACKWARD_REFERENCE = "partials"
