"""LayerNorm and RMSNorm in CUDA C++: launchers for ``layernorm.cu``.

Forward (``VERSIONS``; ``f(x, w, b, eps=1e-5, stats=False)`` -> y, or (y, mean, rstd)):

    v1  layernorm_block   a block per row, three passes over the row from memory
    v2  layernorm_warp    a warp per row (short rows), reductions by shuffles only
    v3  layernorm_reg     a block per row held in registers: x read once
    v4  layernorm         the reference: v2 up to 256 columns, v3 up to 16384, v1 beyond

Backward (``BACKWARD_VERSIONS``; ``f(dy, x, w, mean, rstd)`` -> (dx, dw, db)): atomics, or
per-block partials plus a column-sum kernel. RMSNorm: ``rmsnorm``, ``rmsnorm_backward``.

The CUDA C++ and Numba kernels take float32 only, Triton's bfloat16 and float64 too. The input
rules (``check_norm_inputs``, ``check_norm_backward_inputs``) serve all three languages. ``b``
may be None: no bias, as in ``torch.nn.functional.layer_norm``.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

import torch

import utils
import utils.topics.layernorm as layernorm_spec
from kernels._launch import cdiv, cuda_source, sm_count
from utils.inputs import check_tensor

SOURCE = utils.KERNELS_DIR / "cuda" / "layernorm.cu"
EPS = layernorm_spec.EPS  # the epsilon of the topic (rstd = 1 / sqrt(var + EPS)), defined once
REG_ITEMS = (1, 2, 4, 8, 16)
MAX_THREADS = 1024
REG_MAX_COLS = REG_ITEMS[-1] * MAX_THREADS
WARP_MAX_COLS = 256
INT32_MAX = 2**31 - 1


def check_norm_inputs(x, w, b=None, *, op="layernorm", name="x", dtypes=(torch.float32, torch.bfloat16),
                      bias=False):
    """``(x2d, w, b, shape)``: x as a contiguous (rows, cols) tensor, w and b contiguous of
    ``cols`` values, or a clear error. Any leading dims are flattened into rows. With ``bias``
    (LayerNorm's forward), a ``b`` of None is a zero bias, as in ``torch.nn.functional.layer_norm``;
    without it (RMSNorm, the backward) b is not used and stays None."""
    for t, n in ((x, name), (w, "w"), (b, "b")):
        if t is None and n == "b":
            continue
        check_tensor(t, n, op=op, dtypes=dtypes)
    if x.dim() < 1:
        raise ValueError(f"{op}: {name} must have at least one dim (the normalized one), got a scalar: "
                         f"reshape it with {name}.reshape(1, 1)")
    cols = x.shape[-1]
    for t, n in ((w, "w"), (b, "b")):
        if t is not None and tuple(t.shape) != (cols,):
            raise ValueError(f"{op}: {n} must have shape ({cols},) (x's last dim), got {tuple(t.shape)}")
    if x.numel() > INT32_MAX:
        raise ValueError(f"{op}: {name} has {x.numel()} elements, more than int32 indexes: split it")
    if b is None and bias:
        b = torch.zeros(cols, dtype=w.dtype, device=w.device)
    shape = tuple(x.shape)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    x2 = x.reshape(rows, cols).contiguous()
    return x2, w.contiguous(), (b.contiguous() if b is not None else None), shape


def stats_dtype(x):
    """The dtype of the statistics (mean, rstd) of x: float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def row_stats(x):
    """An output for one statistic per row of the checked (rows, cols) x, in ``stats_dtype(x)``,
    for a kernel to fill; NaN for rows of no columns (as torch's mean of nothing), where no
    kernel runs."""
    rows, cols = x.shape
    if cols == 0:
        return torch.full((rows,), float("nan"), dtype=stats_dtype(x), device=x.device)
    return torch.empty(rows, dtype=stats_dtype(x), device=x.device)


def check_norm_backward_inputs(dy, x, w, stats, *, op, dtypes=(torch.float32,)):
    """``(dy2d, x2d, w, stats, shape)`` for a backward: dy of x's shape and dtype, and each of
    ``stats`` (``(tensor, name)`` pairs; a tensor of None is passed through) one value per row
    of x in ``stats_dtype(x)``, as the forward returns them with ``stats=True``; or a clear error."""
    x, w, _, shape = check_norm_inputs(x, w, None, op=op, dtypes=dtypes)
    dy, _, _, dshape = check_norm_inputs(dy, w, None, op=op, name="dy", dtypes=dtypes)
    if dshape != shape:
        raise ValueError(f"{op}: dy must have x's shape {shape}, got {dshape}")
    if dy.dtype != x.dtype:
        raise TypeError(f"{op}: dy must have x's dtype {x.dtype}, got {dy.dtype}: convert it with dy.to(x.dtype)")
    rows = x.shape[0]
    out = []
    for t, name in stats:
        if t is None:
            out.append(None)
            continue
        check_tensor(t, name, op=op, dtypes=(stats_dtype(x),))
        if t.numel() != rows:
            raise ValueError(f"{op}: {name} must hold one value per row of x ({rows}), got shape "
                             f"{tuple(t.shape)}: pass the {name} that the forward returned with stats=True")
        out.append(t.reshape(rows).contiguous())
    return dy, x, w, out, shape


def layernorm_ref(x, w, b, eps=EPS):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm_ref(x, w, eps=EPS):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    """A kernel of layernorm.cu, compiled once."""
    return utils.cuda_kernel(SOURCE, name)


def source(name: str) -> str:
    """The text of one kernel or helper of layernorm.cu (its comment block and body)."""
    return cuda_source(name, SOURCE)


def _threads(cols, per_thread):
    return min(MAX_THREADS, max(32, cdiv(cdiv(cols, per_thread), 32) * 32))


def _inputs(x, w, b, op, bias=False):
    return check_norm_inputs(x, w, b, op=op, dtypes=(torch.float32,), bias=bias)


def _forward(x, w, b, eps, stats, op, launch):
    x, w, b, shape = _inputs(x, w, b, op, bias=True)
    rows, cols = x.shape
    y = torch.empty_like(x)
    mean = row_stats(x)
    rstd = row_stats(x)
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


def layernorm_backward_atomic(dy, x, w, mean, rstd):
    """dx per row (a block per row), dw/db by atomicAdd."""
    dy, x, w, (mean, rstd), shape = check_norm_backward_inputs(dy, x, w, ((mean, "mean"), (rstd, "rstd")),
                                                               op="layernorm_backward_atomic")
    rows, cols = x.shape
    dx = torch.empty_like(x)
    dw = torch.zeros(cols, dtype=torch.float32, device=x.device)
    db = torch.zeros(cols, dtype=torch.float32, device=x.device)
    if rows and cols:
        kernel("layernorm_bwd_atomic_kernel")[rows, _threads(cols, 4)](dy, x, w, mean, rstd, dx, dw, db, cols)
    return dx.reshape(shape), dw, db


def _parts(rows):
    return max(1, min(rows, 2 * sm_count()))


def layernorm_backward_partials(dy, x, w, mean, rstd):
    """Fused dx + per-block dw/db partials (persistent grid), then a column-sum kernel."""
    dy, x, w, (mean, rstd), shape = check_norm_backward_inputs(dy, x, w, ((mean, "mean"), (rstd, "rstd")),
                                                               op="layernorm_backward_partials")
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
    rstd = row_stats(x)
    if rows and cols:
        kernel("rmsnorm_kernel")[rows, _threads(cols, 4)](x, w, y, rstd, cols, float(eps))
    y = y.reshape(shape)
    return (y, rstd) if stats else y


def rmsnorm_backward(dy, x, w, rstd):
    dy, x, w, (rstd,), shape = check_norm_backward_inputs(dy, x, w, ((rstd, "rstd"),), op="rmsnorm_backward")
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
