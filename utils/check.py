"""Comparing a kernel's result with a reference: the course's one tolerance table.

Every comparison in the course (graders, tests, notebooks) goes through here, so "close
enough" means the same thing everywhere:

    utils.assert_close(y, x.double().relu())        # float64 reference
    utils.max_abs_err(y, ref)                        # a number for a print()
    print(utils.describe_mismatch(y, ref))           # where and how they differ, in words

The reference should be computed in float64 from the same (float32) inputs: then the
only error left is the kernel's own, and the tolerance of the kernel's dtype applies.
"""
from __future__ import annotations

import math

import torch

__all__ = [
    "TOLERANCES",
    "tolerance",
    "assert_close",
    "max_abs_err",
    "mismatch_mask",
    "index_ranges",
    "format_ranges",
    "describe_positions",
    "describe_mismatch",
]

#: Tolerances by the dtype of the result, for ``|actual - expected| <= atol + rtol * |expected|``
#: against a float64 reference. float32 allows about 80 ulp relative: enough for a
#: different summation order or fast-math ``__expf``/``ex2.approx``, far too little for
#: a different formula (erf-GELU differs from tanh-GELU by up to 5e-4).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
    torch.float64: dict(atol=1e-10, rtol=1e-7),
}


def tolerance(dtype: torch.dtype) -> dict:
    """``dict(atol=..., rtol=...)`` for results of ``dtype`` (float32 for integer types)."""
    if dtype in TOLERANCES:
        return dict(TOLERANCES[dtype])
    if not dtype.is_floating_point:
        return dict(atol=0.0, rtol=0.0)
    raise KeyError(f"no tolerance for {dtype}; the course knows {list(TOLERANCES)}")


def _as64(t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    return t.detach().to(device="cpu", dtype=torch.float64)


def mismatch_mask(actual, expected, *, atol: float, rtol: float) -> torch.Tensor:
    """Boolean tensor, True where ``actual`` is not close to ``expected``.

    NaN is only close to NaN, +inf to +inf and -inf to -inf.
    """
    a, e = _as64(actual), _as64(expected)
    a, e = torch.broadcast_tensors(a, e)
    # NaN anywhere makes the comparison False, so NaN and inf need a second look only
    # where the plain test fails (and where the expected value is inf, since
    # |finite - inf| <= rtol * inf would pass).
    ok = (a - e).abs() <= atol + rtol * e.abs()
    e_inf = torch.isinf(e)
    if bool(e_inf.any()):
        ok &= ~e_inf | (a == e)
    bad = ~ok
    if bool(bad.any()):
        ab, eb = a[bad], e[bad]
        fine = (torch.isnan(ab) & torch.isnan(eb)) | (torch.isinf(ab) & (ab == eb))
        bad[bad.clone()] = ~fine
    return bad


def max_abs_err(actual, expected) -> float:
    """The largest ``|actual - expected|`` (inf if one has NaN/inf where the other has not)."""
    a, e = _as64(actual), _as64(expected)
    if a.numel() == 0:
        return 0.0
    a, e = torch.broadcast_tensors(a, e)
    d = (a - e).abs()
    if not bool(torch.isfinite(d).all()):
        same = (torch.isnan(a) & torch.isnan(e)) | (torch.isinf(a) & (a == e))
        d = torch.where(same, torch.zeros_like(d), d)
        d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
    return float(d.max())


def index_ranges(mask) -> list[tuple[int, int]]:
    """``[(first, last), ...]`` of the runs of True in a 1-D boolean tensor (inclusive)."""
    m = torch.as_tensor(mask).reshape(-1).to("cpu", torch.bool)
    if m.numel() == 0 or not bool(m.any()):
        return []
    mi = m.to(torch.int8)
    edges = torch.diff(mi, prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8))
    starts = torch.nonzero(edges == 1).reshape(-1).tolist()
    stops = torch.nonzero(edges == -1).reshape(-1).tolist()
    return [(s, e - 1) for s, e in zip(starts, stops)]


def format_ranges(ranges, noun: str = "elements", limit: int = 4) -> str:
    """``"elements 1024..1822"``, ``"element 7"``, ``"elements 0..3, 9 and 12..15 (and 5 more ranges)"``."""
    if not ranges:
        return f"no {noun}"
    single = noun[:-1] if noun.endswith("s") else noun
    parts = [f"{a}" if a == b else f"{a}..{b}" for a, b in ranges[:limit]]
    word = single if len(ranges) == 1 and ranges[0][0] == ranges[0][1] else noun
    if len(parts) == 1:
        text = parts[0]
    else:
        text = ", ".join(parts[:-1]) + " and " + parts[-1]
    more = len(ranges) - limit
    if more > 0:
        text += f" (and {more} more range{'s' if more > 1 else ''})"
    return f"{word} {text}"


def describe_positions(mask) -> str:
    """Where the True entries of a 1-D or 2-D boolean mask are, in plain words."""
    m = torch.as_tensor(mask).to("cpu", torch.bool)
    if m.dim() <= 1:
        return format_ranges(index_ranges(m.reshape(-1)))
    if m.dim() > 2:
        m = m.reshape(-1, m.shape[-1])
    rows, cols = m.shape
    bad_rows = m.any(dim=1)
    bad_cols = m.any(dim=0)
    full_rows = m.all(dim=1)
    row_text = format_ranges(index_ranges(bad_rows), noun="rows")
    col_text = format_ranges(index_ranges(bad_cols), noun="columns")
    if bool((full_rows == bad_rows).all()):
        return f"{row_text} (all {cols} columns)"
    if bool(bad_rows.all()) and bool((m == bad_cols.unsqueeze(0)).all()):
        return f"{col_text} of every row"
    # a block pattern: the same columns in each bad row
    first = m[bad_rows][0]
    if bool((m[bad_rows] == first.unsqueeze(0)).all()):
        return f"{col_text} of {row_text}"
    shown = []
    for r in torch.nonzero(bad_rows).reshape(-1).tolist()[:3]:
        shown.append(f"row {r}: {format_ranges(index_ranges(m[r]), noun='columns')}")
    more = int(bad_rows.sum()) - len(shown)
    text = "; ".join(shown)
    if more > 0:
        text += f"; and {more} more row{'s' if more > 1 else ''}"
    return text


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.7g}"


def describe_mismatch(actual, expected, *, dtype=None, atol=None, rtol=None, what: str = "result",
                      max_examples: int = 4, mask=None) -> str:
    """A plain-words account of where ``actual`` differs from ``expected``.

    Names the wrong elements as index ranges (rows and columns for 2-D results), shows
    the first few as expected-vs-got and the largest error. Returns ``""`` when they match.
    """
    a, e = _as64(actual), _as64(expected)
    if a.shape != e.shape:
        return f"{what} has shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    tol = tolerance(dtype or (actual.dtype if isinstance(actual, torch.Tensor) else torch.float32))
    atol = tol["atol"] if atol is None else atol
    rtol = tol["rtol"] if rtol is None else rtol
    bad = mismatch_mask(a, e, atol=atol, rtol=rtol) if mask is None else torch.as_tensor(mask).cpu()
    nbad = int(bad.sum())
    if nbad == 0:
        return ""
    total = a.numel()
    if a.dim() == 0:
        return (f"the {what} is wrong: got {_fmt(float(a))}, expected {_fmt(float(e))} "
                f"(error {_fmt(max_abs_err(a, e))}, allowed: {atol:g} + {rtol:g} * |expected|).")
    lines = [f"{nbad} of {total} element{'s' if total > 1 else ''} of the {what} "
             f"{'is' if nbad == 1 and total == 1 else 'are'} wrong: {describe_positions(bad)}."]
    idx = torch.nonzero(bad)[:max_examples]
    examples = []
    for i in idx.tolist():
        pos = tuple(i)
        name = f"[{', '.join(map(str, pos))}]" if pos else ""
        examples.append(f"{what}{name} = {_fmt(float(a[pos]))}, expected {_fmt(float(e[pos]))}")
    if examples:
        lines.append("First wrong: " + "; ".join(examples) + ".")
    err = max_abs_err(a, e)
    lines.append(f"Largest error {_fmt(err)} (allowed: {atol:g} + {rtol:g} * |expected|).")
    return "\n".join(lines)


def assert_close(actual, expected, *, dtype=None, what: str = "result", atol=None, rtol=None) -> None:
    """Raise ``AssertionError`` (with a plain-words diagnosis) unless ``actual`` matches ``expected``.

    ``expected`` is best a float64 reference. The tolerance is ``TOLERANCES[dtype]``, with
    ``dtype`` defaulting to ``actual``'s dtype; ``atol``/``rtol`` override it.
    """
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{what} should be a torch.Tensor, got {type(actual).__name__}")
    exp_shape = tuple(torch.as_tensor(expected).shape)
    if tuple(actual.shape) != exp_shape:
        raise AssertionError(f"{what} has shape {tuple(actual.shape)}, expected {exp_shape}")
    msg = describe_mismatch(actual, expected, dtype=dtype or actual.dtype, atol=atol, rtol=rtol, what=what)
    if msg:
        raise AssertionError(msg)
