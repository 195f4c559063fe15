"""LayerNorm's and RMSNorm's frame, shared by the CUDA C++, Numba and Triton launchers: the
epsilon, the input rules, what a launcher does around its kernels and the PyTorch references.

    EPS                                   the topic's epsilon, 1e-5
    check_norm_inputs(x, w, b, ...)       x as (rows, cols), w and b of cols values, or a clear error
    check_norm_backward_inputs(dy, x, w, stats, ...)   the same for a backward, with the saved statistics
    stats_dtype(x), row_stats(x)          the statistics' dtype, and an output for one per row
    norm_forward(x, w, b, eps, stats, op=..., launch=...)    check, allocate, skip empty input, shape y
    norm_backward(dy, x, w, mean, rstd, op=..., launch=...)  the same for (dx, dw, db)
    in_shape(t, shape)                    a (rows, cols) result back in the input's shape
    layernorm_ref, rmsnorm_ref            torch.nn.functional.layer_norm, rms_norm

``b`` may be None: no bias, as in ``torch.nn.functional.layer_norm``.
"""
from __future__ import annotations

import torch

from runtime.inputs import INT32_MAX, check_tensor, is_plain

#: The topic's epsilon (rstd = 1 / sqrt(var + EPS)), defined once: every language's kernels and
#: the grader's float64 reference (utils/topics/layernorm.py) read it from here.
EPS = 1e-5


def check_norm_inputs(x, w, b=None, *, op="layernorm", name="x", dtypes=(torch.float32, torch.bfloat16),
                      bias=False):
    """``(x2d, w, b, shape)``: x as a contiguous (rows, cols) tensor, w and b contiguous of
    ``cols`` values, or a clear error. Any leading dims are flattened into rows. With ``bias``
    (LayerNorm's forward), a ``b`` of None is a zero bias, as in ``torch.nn.functional.layer_norm``;
    without it (RMSNorm, the backward) b is not used and stays None."""
    # The common case first, with as little Python as it takes (a launcher's host time adds to
    # every launch): x already (rows, cols), w and b of cols values, all as the kernels take them.
    if (is_plain(x, dtypes) and x.dim() == 2 and is_plain(w, dtypes) and w.dim() == 1 and
            w.shape[0] == x.shape[1] and x.numel() <= INT32_MAX and
            (b is None if not bias else (is_plain(b, dtypes) and b.dim() == 1 and b.shape[0] == w.shape[0]))):
        return x, w, b, tuple(x.shape)
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


def in_shape(t, shape):
    """The (rows, cols) result ``t`` in the input's ``shape`` (itself when x was 2-D already)."""
    return t if len(shape) == 2 else t.reshape(shape)


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
    sdt = (stats_dtype(x),)
    for t, name in stats:
        if t is None or (is_plain(t, sdt) and t.dim() == 1 and t.shape[0] == rows):
            out.append(t)  # as the forward returned it: nothing to check further or reshape
            continue
        check_tensor(t, name, op=op, dtypes=sdt)
        if t.numel() != rows:
            raise ValueError(f"{op}: {name} must hold one value per row of x ({rows}), got shape "
                             f"{tuple(t.shape)}: pass the {name} that the forward returned with stats=True")
        out.append(t.reshape(rows).contiguous())
    return dy, x, w, out, shape


F32 = (torch.float32,)


def _check_row_length(cols, max_cols, op):
    if max_cols is not None and cols > max_cols:
        raise ValueError(f"{op} holds a row in registers, at most {max_cols} columns; got {cols}")


def norm_forward(x, w, b, eps, stats, *, op, launch, rms=False, dtypes=F32, max_cols=None):
    """What every forward launcher of the topic does around its kernel, in all three languages:
    check the inputs (``b`` None: a zero bias; RMSNorm takes none), make y and the statistics,
    call ``launch(x, w, b, y, mean, rstd, rows, cols, eps)`` on x as (rows, cols) unless x is
    empty (RMSNorm: ``launch(x, w, y, rstd, rows, cols, eps)``), and return y in x's shape, or
    with ``stats`` (y, mean, rstd) (RMSNorm: (y, rstd)). ``max_cols``: the longest row the
    kernel holds."""
    x, w, b, shape = check_norm_inputs(x, w, b, op=op, dtypes=dtypes, bias=not rms)
    rows, cols = x.shape
    _check_row_length(cols, max_cols, op)
    y = torch.empty_like(x)
    saved = (row_stats(x),) if rms else (row_stats(x), row_stats(x))
    if rows and cols:
        launch(*((x, w) if rms else (x, w, b)), y, *saved, rows, cols, eps)
    y = in_shape(y, shape)
    return (y, *saved) if stats else y


def norm_backward(dy, x, w, mean, rstd, *, op, launch, rms=False, dtypes=F32, max_cols=None, accumulate=True):
    """What every backward launcher of the topic does around its kernels: check dy, x, w and
    the saved statistics, make dx and the weight gradients (dw and db, RMSNorm dw only: zeros
    in ``stats_dtype(x)`` for kernels that ``accumulate`` into them, else left for a column
    sum to write, in w's dtype), call ``launch(dy, x, w, mean, rstd, dx, dw, db, rows, cols)``
    unless x is empty (RMSNorm: ``launch(dy, x, w, rstd, dx, dw, rows, cols)``), and return
    (dx in x's shape, dw, db) with the gradients in w's dtype (RMSNorm: (dx, dw))."""
    saved = ((rstd, "rstd"),) if rms else ((mean, "mean"), (rstd, "rstd"))
    dy, x, w, saved, shape = check_norm_backward_inputs(dy, x, w, saved, op=op, dtypes=dtypes)
    rows, cols = x.shape
    _check_row_length(cols, max_cols, op)
    dx = torch.empty_like(x)
    n = 1 if rms else 2
    if not (rows and cols):  # nothing to launch: the gradients of no rows are zeros
        return (in_shape(dx, shape),) + tuple(torch.zeros(cols, dtype=w.dtype, device=x.device) for _ in range(n))
    new = torch.zeros if accumulate else torch.empty  # a column sum writes every value: no zeros
    dtype = stats_dtype(x) if accumulate else w.dtype
    grads = tuple(new(cols, dtype=dtype, device=x.device) for _ in range(n))
    launch(dy, x, w, *saved, dx, *grads, rows, cols)
    if accumulate and dtype != w.dtype:
        grads = tuple(g.to(w.dtype) for g in grads)
    return (in_shape(dx, shape), *grads)


def layernorm_ref(x, w, b, eps=EPS):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm_ref(x, w, eps=EPS):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
