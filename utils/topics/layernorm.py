"""LayerNorm and RMSNorm over the last dim (lesson 09): two row reductions forward, and a
backward whose dW/db reduce across rows, over the whole batch.

    y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),  var the biased variance
    rms_norm: y = x * rstd * w,      rstd = 1 / sqrt(mean(x^2) + eps)

Inputs carry rows with a large mean (1000 + randn): there ``E[x^2] - E[x]^2`` in float32
loses most digits, while a two-pass or Welford variance keeps them.
"""
from __future__ import annotations

import re

import torch

from kernels.frames.layernorm import EPS  # the epsilon every language's kernels use (defined once)

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    GradingError,
    Output,
    grade,
    grader_shapes,
    in_order,
    label_shape,
    randn,
    returned,
    shapes_text,
    success,
)
from ._spec import FLOAT, Baseline, Spec, Target, compiled, eager, generator


# ----------------------------------------------------------------------------------------
# float64 references
# ----------------------------------------------------------------------------------------
def layernorm_stats64(x, eps=EPS):
    """(mean, rstd) of each row in float64, the variance biased (divided by N)."""
    x = x.double()
    mean = x.mean(dim=-1)
    var = ((x - mean[..., None]) ** 2).mean(dim=-1)
    return mean, 1.0 / torch.sqrt(var + eps)


def layernorm_ref64(x, w, b, eps=EPS):
    mean, rstd = layernorm_stats64(x, eps)
    return (x.double() - mean[..., None]) * rstd[..., None] * w.double() + b.double()


def layernorm_backward_ref64(dy, x, w, eps=EPS, mean=None, rstd=None):
    """(dx, dw, db) in float64, from the statistics given (the float32 ones a forward saved:
    the kernel under test gets those) or else the float64 statistics of x."""
    dy, x, w = dy.double(), x.double(), w.double()
    if mean is None or rstd is None:
        mean, rstd = layernorm_stats64(x, eps)
    mean, rstd = mean.double().reshape(-1), rstd.double().reshape(-1)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    c1 = (g * xhat).mean(dim=1, keepdim=True)
    c2 = g.mean(dim=1, keepdim=True)
    dx = (g - xhat * c1 - c2) * rstd[:, None]
    return dx, (dy * xhat).sum(dim=0), dy.sum(dim=0)


def rmsnorm_ref64(x, w, eps=EPS):
    x = x.double()
    rstd = 1.0 / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return x * rstd * w.double()


def rmsnorm_backward_ref64(dy, x, w, eps=EPS):
    dy, x, w = dy.double(), x.double(), w.double()
    rstd = 1.0 / torch.sqrt((x * x).mean(dim=1, keepdim=True) + eps)
    xhat = x * rstd
    g = dy * w
    dx = (g - xhat * (g * xhat).mean(dim=1, keepdim=True)) * rstd
    return dx, (dy * xhat).sum(dim=0)


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------
def layernorm_input(shape, seed=0, device=None, dtype=torch.float32):
    """(x, w, b): rows of x cycle through ordinary values, values spread by 10 and values
    around 1000 (a large mean: where E[x^2] - E[x]^2 cancels); w, b random."""
    from runtime.config import DEVICE
    device = device or DEVICE
    g = generator(seed, device)
    rows, cols = shape
    x = torch.randn(rows, cols, generator=g, device=device)
    kind = torch.arange(rows, device=device) % 3
    x = torch.where((kind == 1)[:, None], 10.0 * x, x)
    x = torch.where((kind == 2)[:, None], x + 1000.0, x)
    w = 1.0 + 0.5 * torch.randn(cols, generator=g, device=device)
    b = 0.5 * torch.randn(cols, generator=g, device=device)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def layernorm_tol(inputs, ref):
    """The dtype's tolerance, plus what x's own rounding carries into y: a row around 1000
    holds each value only to 1000 * 2^-24 in float32 (2^-8 in bfloat16), and y = (x - mean)
    * rstd * w passes that error on, scaled by rstd * |w|. Every correct float32 kernel
    (torch's included) differs from the float64 result by about that much on such rows."""
    x, w = inputs[0], inputs[1]
    t = _check.tolerance(x.dtype)
    unit = 2.0 ** -24 if x.dtype == torch.float32 else 2.0 ** -8
    x64 = x.double()
    if x64.numel() == 0:
        return t["atol"] + t["rtol"] * ref.abs()
    rstd = 1.0 / torch.sqrt(x64.var(dim=-1, unbiased=False, keepdim=True) + EPS)
    carried = 4 * unit * x64.abs().amax(dim=-1, keepdim=True) * rstd * w.double().abs().max()
    return t["atol"] + t["rtol"] * ref.abs() + carried


def layernorm_bytes(shape) -> int:
    """Forward: read x, write y (w and b are read once per row but stay in cache)."""
    rows, cols = shape
    return 2 * FLOAT * rows * cols


def layernorm_backward_bytes(shape, itemsize=FLOAT) -> int:
    """Backward, counted honestly: read x, dy, w, mean, rstd; write dx, dW, db."""
    rows, cols = shape
    return itemsize * (3 * rows * cols + 3 * cols) + FLOAT * 2 * rows


# ----------------------------------------------------------------------------------------
# Graders
# ----------------------------------------------------------------------------------------

def _shapes():
    """The course's awkward shapes plus one long row (more columns than a block has threads)
    and rows of one column (N = 1: every row's variance is 0)."""
    from runtime.config import SIMULATE
    shapes = list(grader_shapes())
    long_row = (3, 1500) if SIMULATE else (9, 5000)
    for extra in (long_row, (6, 1)):
        if extra not in shapes:
            shapes.append(extra)
    return shapes


#: The value of the constant rows (variance 0): a float that sums exactly, so the mean is exact.
CONSTANT_ROW = 1.25


def _cases(g, shapes):
    """Rows cycle through ordinary values, values spread by 10, values around 1000 (a large
    mean); every sixth row from row 3 on is constant (variance 0: rstd = 1/sqrt(eps))."""
    cases = []
    for rows, cols in shapes:
        x = randn(g.gen, rows, cols)
        for r in range(rows):
            if r % 6 == 3:
                x[r] = CONSTANT_ROW
            elif r % 3 == 1:
                x[r] *= 10.0
            elif r % 3 == 2:
                x[r] += 1000.0
        w = 1.0 + 0.5 * randn(g.gen, cols)
        b = 0.5 * randn(g.gen, cols)
        cases.append((x, w, b))
    return cases


def _tol(dtype=torch.float32):
    return _check.tolerance(dtype)


def _bad(got, want, atol, rtol):
    return _check.mismatch_mask(got, want, atol=atol, rtol=rtol)


def _stats_mistakes(x, got_mean, got_rstd, eps):
    """The likely cause of wrong statistics, in words (None: no known mistake)."""
    x64 = x.double()
    cols = x.shape[1]
    mean = x64.mean(dim=1)
    var_b = x64.var(dim=1, unbiased=False)
    tol = _tol()
    if got_rstd is not None:
        flat = var_b == 0
        bad_r = ~torch.isfinite(got_rstd) | (got_rstd > 10 / eps ** 0.5)
        if bool(flat.any()) and bool(bad_r[flat].all()) and not bool(bad_r[~flat].any()):
            return ("rstd is inf (or huge) on exactly the rows whose values are all equal (variance 0): eps is "
                    "missing, or added outside the square root. rstd = 1 / sqrt(var + eps): with var = 0 that is "
                    "1 / sqrt(eps), and without eps 1 / sqrt(0) = inf, then y = 0 * inf = NaN.")
        if torch.allclose(got_rstd, 1 / (torch.sqrt(var_b) + eps), rtol=1e-4, atol=1e-6) and not torch.allclose(
                got_rstd, 1 / torch.sqrt(var_b + eps), rtol=1e-4, atol=1e-6):
            return "eps is added outside the square root: rstd = 1 / sqrt(var + eps), eps inside."
    if got_rstd is not None and cols > 1:
        var_u = x64.var(dim=1, unbiased=True)
        if torch.allclose(got_rstd, 1 / torch.sqrt(var_u + eps), rtol=1e-4, atol=1e-6):
            return ("the variance is divided by N - 1 (unbiased, torch.var's default): LayerNorm divides by N "
                    "(biased variance, torch.var(unbiased=False)).")
        # A block padded to a power of two: the lanes past the row's end load 0, so each adds
        # (0 - mean)^2 to the sum of squares unless it is masked out.
        block = 1 << (cols - 1).bit_length()
        if block > cols:
            var_pad = var_b + (block - cols) * mean * mean / cols
            if torch.allclose(got_rstd, 1 / torch.sqrt(var_pad + eps), rtol=1e-4, atol=1e-6):
                return (f"the variance counts the {block - cols} padding lanes past the row's end (the block is "
                        f"{block} wide for {cols} columns): each adds (0 - mean)^2. Mask them out of the sum of "
                        "squares, e.g. d = tl.where(mask, x - mean, 0.0).")
        # E[x^2] - E[x]^2 in float32: right on ordinary rows, lost on rows with a large mean
        x32 = x.float()
        naive = (x32 * x32).mean(dim=1) - x32.mean(dim=1) ** 2
        big = mean.abs() > 100
        # a right kernel's rstd is within a few float32 steps (relative 1e-6) even on rows with a
        # large mean; the cancellation's error varies with the draw, and can be as small as 3e-4
        ok = ~_bad(got_rstd, 1 / torch.sqrt(var_b + eps), atol=tol["atol"], rtol=2e-5)
        if bool(big.any()) and bool(ok[~big].all()) and not bool(ok[big].all()):
            r = int(torch.nonzero(big & ~ok)[0])
            return (f"the statistics are right on ordinary rows but wrong on rows with a large mean (row {r}: "
                    f"mean {float(mean[r]):.6g}, variance {float(var_b[r]):.4g}; E[x^2] - E[x]^2 in float32 gives "
                    f"{float(naive[r]):.4g}): E[x^2] - E[x]^2 cancels catastrophically. Subtract the mean first "
                    "(two passes over the row, or Welford's update).")
    return None


def _y_mistakes(x, w, b, got_y, mean, rstd):
    """The likely cause of a wrong y when mean and rstd are right (None: no known mistake)."""
    xhat = (x.double() - mean[:, None]) * rstd[:, None]
    w64, b64 = w.double(), b.double()
    for alt, text in ((xhat * w64, "b is never added: y = (x - mean) * rstd * w + b"),
                      (xhat + b64, "w is never applied: y = (x - mean) * rstd * w + b"),
                      (xhat, "neither w nor b is applied: y = (x - mean) * rstd * w + b"),
                      (xhat * b64 + w64, "w and b are swapped: y = xhat * w + b, with w the scale and b the shift"),
                      ((x.double() - mean[:, None]) * w64 + b64, "y is not multiplied by rstd: y = (x - mean) * rstd "
                                                                 "* w + b")):
        if torch.allclose(got_y, alt, rtol=1e-4, atol=1e-4):
            return text + "."
    return None


def _row_stride_hint(g, eps):
    """After an out-of-bounds access: is the kernel right when cols is a power of two (so that
    BLOCK = next_power_of_2(cols) equals cols)? Then the row's offset uses BLOCK, not cols."""
    x = randn(g.gen, 4, 64)
    w, b = 1.0 + 0.5 * randn(g.gen, 64), 0.5 * randn(g.gen, 64)
    saved = g.case
    try:
        run = g.call(Case("a 4x64 input", (x, w, b), layernorm_ref64(x, w, b, eps)))
    except GradingError:
        return None
    finally:
        g.case = saved
    out = run.out
    if not isinstance(out, (tuple, list)) or not isinstance(out[0], torch.Tensor) or tuple(out[0].shape) != (4, 64):
        return None
    if torch.allclose(out[0].detach().double().cpu(), layernorm_ref64(x, w, b, eps), rtol=1e-4, atol=1e-4):
        return ("the kernel is right when cols is a power of two (a 4x64 input) and reads past the end otherwise: "
                "row r starts at r * cols, not r * BLOCK. BLOCK = next_power_of_2(cols) is the width of the "
                "block of lanes, wider than the row when cols is not a power of two.")
    return None


#: What a wrong statistic or y usually needs, when no known mistake explains it.
_STATS_HINT = ("compute mean, then var = mean((x - mean)^2) (divided by N), rstd = 1/sqrt(var + eps), "
               "y = (x - mean) * rstd * w + b.")
_NAN_HINT = ("a NaN comes from 0 / 0, 0 * inf or inf - inf: is eps inside the square root (rstd = 1/sqrt(var + eps)), "
             "and are the lanes past the row's end loaded with other=0.0 and kept out of the sums?")
_SAVE_STATS = ("save each row's mean and rstd (one float per row) for the backward: the program/block that "
               "normalizes row r stores mean[r] and rstd[r].")


def _forward_tol(x, w, rstd, want, rtol, y=False):
    """The error allowed in mean, rstd or (``y=True``) y, element by element: float32 x holds a
    row around 1000 only to 6e-5 (1000 * 2^-24, four times over at the most), and y = (x - mean)
    * rstd * w inherits that times rstd * |w|. (The message quotes the plain tolerance.)"""
    big = x.double().abs().amax(dim=1)
    carried = (2.0 ** -24) * 4 * (big * rstd * w.double().abs().max() if y else big)
    return _tol()["atol"] + (carried[:, None] if y else carried) + rtol * want.abs()


def check_layernorm(fn, *, seed=None, eps=EPS):
    """``fn(x, w, b)`` must return ``(y, mean, rstd)``: y the LayerNorm of each row of the 2-D
    float32 x (biased variance, eps inside the square root), mean and rstd the float32
    statistics of each row, saved for the backward.
    """
    g = Grader("check_layernorm", fn, seed)
    shapes = _shapes()
    tol = _tol()
    cases = []
    for x, w, b in _cases(g, shapes):
        mean, rstd = layernorm_stats64(x, eps)
        cases.append(Case(label_shape(tuple(x.shape)) + " (some rows around 1000, some constant)", (x, w, b),
                          layernorm_ref64(x, w, b, eps), extra=dict(mean=mean, rstd=rstd)))

    def stats_hint(run):
        return _stats_mistakes(run.case.values[0], run.got["mean"], run.got["rstd"], eps)

    def values_hint(run, got, bad):
        hint = stats_hint(run)
        if hint is None:
            x, w, b = run.case.values
            gm, gr = run.got["mean"], run.got["rstd"]
            mean_ok = torch.allclose(gm, run.case.extra["mean"], rtol=1e-4, atol=1e-4 + 1e-6 * float(x.abs().max()))
            rstd_ok = torch.allclose(gr, run.case.extra["rstd"], rtol=1e-3, atol=1e-5)
            if mean_ok and rstd_ok:  # with the kernel's own statistics: on a row around 1000 the mean's
                # float32 rounding (6e-5) times w would hide the mistake in y behind a float64 xhat
                hint = _y_mistakes(x, w, b, run.got["y"], gm, gr)
        return hint or _STATS_HINT

    def outputs(case):
        x, w, _ = case.values
        rstd = case.extra["rstd"]
        outs = []
        for name, want, rtol in (("mean", case.extra["mean"], tol["rtol"]), ("rstd", rstd, 1e-4),
                                 ("y", case.expected, tol["rtol"])):
            stat = name != "y"
            outs.append(Output(
                name, want, tol=_forward_tol(x, w, rstd, want, rtol, y=not stat),
                describe=lambda got, want, bad, name=name, rtol=rtol: _check.describe_mismatch(
                    got, want, mask=bad, what=name, atol=tol["atol"], rtol=rtol),
                unwritten_text=(lambda m, name=name: f"{name} was never written ({int(m.sum())} of {m.numel()} rows "
                                                     "still hold the grader's NaN marker).") if stat else None,
                unwritten_hint=_SAVE_STATS if stat else None,
                nan_hint=lambda run, nan: stats_hint(run) or _NAN_HINT, diagnose=values_hint))
        return outs

    def unpack(run):
        y, mean, rstd = returned(g, run, ("y", "mean", "rstd"))
        return mean, rstd, y   # checked in this order: the statistics say more than y

    def explain_error(case, text):
        # a read or write past the end: right when cols is a power of two?
        if any(w_ in text.lower() for w_ in ("out of bounds", "past the end", "off-by-one", "outside")):
            return _row_stride_hint(g, eps)
        return None

    worst = grade(g, cases, outputs, inputs=("x", "w", "b"), unpack=unpack, explain_error=explain_error,
                  order=lambda cs: sorted(range(len(cs)), key=lambda i: abs(cs[i].numel - 1024)))
    success("check_layernorm", cases, worst, shapes_text(shapes))


def _backward_cases(g, shapes, eps):
    out = []
    for x, w, b in _cases(g, shapes):
        mean, rstd = layernorm_stats64(x, eps)
        dy = randn(g.gen, *x.shape)
        out.append((dy, x, w, mean.float(), rstd.float()))
    return out


def _dx_hint(got, dy, x, w, mean, rstd):
    """The likely cause of a wrong dx (None: no known mistake)."""
    cols = x.shape[1]
    r = rstd.double()[:, None]
    xhat = (x.double() - mean.double()[:, None]) * r
    g = dy.double() * w.double()
    c1, c2 = (g * xhat).mean(dim=1, keepdim=True), g.mean(dim=1, keepdim=True)
    for alt, text in (((g - c2) * r, "dx lacks the xhat * mean(dy*w*xhat) term: both row reductions are needed"),
                      (g - xhat * c1 - c2, "dx is not multiplied by rstd: dx = (dy*w - xhat * c1 - c2) * rstd"),
                      ((g - xhat * c1 * cols - c2) * r, "the sum of dy*w*xhat is not divided by N: c1 is its "
                                                        "mean, sum / cols"),
                      ((g - xhat * c1 - c2 * cols) * r, "the sum of dy*w is not divided by N: c2 is its mean, "
                                                        "sum / cols"),
                      ((g - xhat * c1 * cols - c2 * cols) * r, "neither row sum is divided by N: c1 and c2 are "
                                                               "means, sum / cols")):
        if cols > 1 and torch.allclose(got, alt, atol=1e-4, rtol=1e-3) and not torch.allclose(
                alt, (g - xhat * c1 - c2) * r, atol=1e-4, rtol=1e-3):
            return text + "."
    return None


def _reduction_hint(name, got, want, terms, dy, x, mean, dw):
    """The likely cause of a wrong dw or db (None: no known mistake); ``terms``: the per-row
    terms it sums (dy * xhat for dw, dy for db)."""
    rows = x.shape[0]
    tol = 1e-3 * (want.abs() + terms.abs().sum(dim=0) + 1e-3)

    def close(a, b):
        return bool(((a - b).abs() <= tol).all())
    if bool((got == 0).all()) and not bool((want == 0).all()):
        return (f"{name} is all zeros: nothing was summed into it. (It was made with torch.zeros, so the grader "
                f"cannot tell it was never written.) Sum its partials into it too: column_sum_kernel on the "
                f"{name} partials.")
    if name == "db" and close(got, dw) and not close(want, dw):
        return "db equals dw: it is summed from the dw partials (pdw). db sums dy over the rows: sum pdb into db."
    if name == "dw" and close(got, (dy.double() * (x.double() - mean.double()[:, None])).sum(dim=0)):
        return "dw lacks rstd: it is the sum of dy * xhat, with xhat = (x - mean) * rstd."
    ok = (got - want).abs() <= tol
    wrong = torch.nonzero(~ok).reshape(-1)
    k = int(wrong[0]) if wrong.numel() else 0
    if k > 0 and bool(ok[:k].all()) and bool((got[k:] == 0).all()):
        return (f"only the first {k} columns of {name} are summed, the others stay 0: the kernel that adds the "
                f"partials covers {k} columns. Launch cdiv(cols, threads) blocks of it, one thread per column.")
    # each block's partial holds one row (the last it handled): assigned (=), not accumulated (+=)
    for blocks in range(1, min(rows - 1, 16) + 1):
        last = [max(range(b, rows, blocks)) for b in range(blocks)]
        if close(got, terms[last].sum(dim=0)):
            return (f"{name} is the sum of one row per block (the last row each of {blocks} blocks handled): the "
                    "per-block partials are assigned (=) instead of accumulated (+=) over the block's rows.")
    return None


def _partial_hint(name, got, per_row):
    """dW (or db) equal to the sum over a run of consecutive rows only: one block's share."""
    rows = per_row.shape[0]
    cs = torch.cumsum(per_row, dim=0)
    tol = 1e-3 * (per_row.abs().sum(dim=0) + 1)
    for k in range(1, rows):
        for lo in (0,):
            if bool(((got - cs[k - 1]).abs() <= tol).all()):
                return (f"{name} equals the sum over rows 0..{k - 1} only: it is summed over one block's rows. "
                        f"Every block must contribute: per-block partial sums then a second kernel that adds them, "
                        "or an atomicAdd per block.")
        rest = cs[-1] - cs[k - 1]
        if bool(((got - rest).abs() <= tol).all()):
            return (f"{name} equals the sum over rows {k}..{rows - 1} only: one block's rows (the last block to "
                    "write wins). Every block must contribute: partial sums plus a second kernel, or atomics.")
    return None


_BACKWARD_RACE = ("dx: a __syncthreads() must separate the two row reductions (sum of dy*w and sum of dy*w*xhat) "
                  "when they reuse the same shared scratch; dw/db: several blocks adding into one element need "
                  "atomicAdd or per-block partials.")


def _backward_race_report(text):
    """The hint for a race detector's report in a LayerNorm backward: which of its two races."""
    if "shared memory" in text:
        return ("the two row reductions (sum of dy*w*xhat, then sum of dy*w) share scratch memory: a __syncthreads() "
                "must separate them, or the second overwrites the first's partial sums while a slow warp still "
                "reads them.")
    return ("several blocks add into the same dw/db element with a plain +=: a read-add-write of one block "
            "overwrites another's. Use atomicAdd, or per-block partial sums and a second kernel that adds them.")


def check_layernorm_backward(fn, *, seed=None, eps=EPS):
    """``fn(dy, x, w, mean, rstd)`` must return ``(dx, dw, db)`` of LayerNorm, with mean and
    rstd the statistics the forward saved (float32, one per row).

        dx = rstd * (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)),  xhat = (x - mean) * rstd
        dw = sum over rows of dy * xhat,  db = sum over rows of dy
    """
    g = Grader("check_layernorm_backward", fn, seed)
    shapes = _shapes()
    tol = _tol()
    cases = []
    for dy, x, w, mean, rstd in _backward_cases(g, shapes, eps):
        dx, dw, db = layernorm_backward_ref64(dy, x, w, eps, mean, rstd)
        cases.append(Case(label_shape(tuple(x.shape)), (dy, x, w, mean, rstd), dx, extra=dict(dw=dw, db=db)))

    def outputs(case):
        dy, x, w, mean, rstd = case.values
        xhat = (x.double() - mean.double()[:, None]) * rstd.double()[:, None]
        dw = case.extra["dw"]
        outs = []
        for name, want, terms in (("dx", case.expected, None), ("dw", dw, dy.double() * xhat),
                                  ("db", case.extra["db"], dy.double())):
            between_runs = dict(atol=1e-4, rtol=1e-4)
            if terms is not None:
                # a float32 sum over rows: its error grows with the sum of |terms|
                atol = tol["atol"] + 4e-7 * max(1.0, x.shape[0] ** 0.5) * terms.abs().sum(dim=0)
                # and two runs that add the rows in another order (atomics) differ by about the
                # rounding of the sum, ~ 2 u sqrt(rows) sum |terms| (u = 2^-24), not by a lost term
                between_runs = 1e-4 + 1e-4 * want.abs() + 2 * 2.0 ** -24 * max(1.0, x.shape[0] ** 0.5) \
                    * terms.abs().sum(dim=0)
            else:
                atol = tol["atol"] + 1e-6 * (dy.double().abs() * w.double().abs()).amax(dim=1, keepdim=True) \
                    * rstd.double()[:, None] * 4
            outs.append(Output(
                name, want, tol=atol + tol["rtol"] * want.abs(), race_tol=between_runs,
                describe=lambda got, want, bad, name=name: _check.describe_mismatch(
                    got, want, mask=bad, what=name, atol=tol["atol"], rtol=tol["rtol"]),
                diagnose=lambda run, got, bad, name=name, terms=terms: _backward_hint(name, got, run.case, terms)))
        return outs

    def explain_error(case, text):
        if re.search(r"index \d+ is out of bounds for axis 0 with size", text):
            return ("a loop runs past the rows of a 2-D array (axis 0): the partial sums of column c are p[0, c] .. "
                    "p[p.shape[0] - 1, c], one per block, so the loop over them is range(p.shape[0]), not "
                    "range(p.shape[1]) (the columns).")
        return None

    worst = grade(g, cases, outputs, inputs=("dy", "x", "w", "mean", "rstd"), explain_error=explain_error,
                  order=lambda cs: sorted(range(len(cs)), key=lambda i: abs(cs[i].numel - 1024)),
                  race_hint=_BACKWARD_RACE, race_report_hint=_backward_race_report)
    success("check_layernorm_backward", cases, worst, shapes_text(shapes))


def _backward_hint(name, got, case, terms):
    """The likely cause of a wrong dx, dw or db."""
    dy, x, w, mean, rstd = case.values
    want = case.expected if name == "dx" else case.extra[name]
    hint = None
    if terms is not None:
        hint = _reduction_hint(name, got, want, terms, dy, x, mean, case.extra["dw"])
    if terms is not None and x.shape[0] > 1 and hint is None:
        hint = _partial_hint(name, got, terms)
    if name == "dx" and hint is None:
        hint = _dx_hint(got, dy, x, w, mean, rstd)
    if hint is None and name != "dx":
        hint = (f"{name} sums over every row of every block: {'dy * xhat' if name == 'dw' else 'dy'} "
                "for each column, with xhat = (x - mean) * rstd.")
    return hint or ("dx needs two row sums (dy*w and dy*w*xhat) before any element is written: "
                    "dx = (dy*w - xhat * mean(dy*w*xhat) - mean(dy*w)) * rstd.")


def check_rmsnorm(fn, *, seed=None, eps=EPS):
    """``fn(x, w)`` must return ``(y, rstd)``: y = x * rstd * w per row, rstd = 1/sqrt(mean(x^2) + eps)."""
    g = Grader("check_rmsnorm", fn, seed)
    shapes = _shapes()
    tol = _tol()
    cases = []
    for x, w, _ in _cases(g, shapes):
        x64 = x.double()
        cases.append(Case(label_shape(tuple(x.shape)), (x, w), rmsnorm_ref64(x, w, eps),
                          extra=dict(rstd=1.0 / torch.sqrt((x64 * x64).mean(dim=1) + eps))))

    def rstd_hint(run, got, bad):
        x64 = run.case.values[0].double()
        layernorm_rstd = 1 / torch.sqrt(x64.var(dim=1, unbiased=False) + eps)
        if torch.allclose(got, layernorm_rstd, rtol=1e-4):
            return "that is LayerNorm's rstd: RMSNorm does not subtract the mean (rstd = 1/sqrt(mean(x^2) + eps))."
        if torch.allclose(got, 1 / (torch.sqrt((x64 * x64).mean(dim=1)) + eps), rtol=1e-4):
            return "eps is added outside the square root: rstd = 1 / sqrt(mean(x^2) + eps)."
        return "rstd = 1/sqrt(mean(x^2) + eps) over the whole row, y = x * rstd * w."

    def outputs(case):
        outs = []
        for name, want in (("rstd", case.extra["rstd"]), ("y", case.expected)):
            outs.append(Output(
                name, want, tol=tol["atol"] + 1e-4 * want.abs(),
                describe=lambda got, want, bad, name=name: _check.describe_mismatch(
                    got, want, mask=bad, what=name, atol=tol["atol"], rtol=1e-4),
                unwritten_text=(lambda m: "rstd was never written.") if name == "rstd" else None,
                unwritten_hint="save each row's rstd (one float per row) for the backward." if name == "rstd" else None,
                diagnose=rstd_hint if name == "rstd" else
                (lambda run, got, bad: "rstd = 1/sqrt(mean(x^2) + eps) over the whole row, y = x * rstd * w.")))
        return outs

    def unpack(run):
        y, rstd = returned(g, run, ("y", "rstd"))
        return rstd, y

    worst = grade(g, cases, outputs, inputs=("x", "w"), unpack=unpack, order=in_order)
    success("check_rmsnorm", cases, worst, shapes_text(shapes))


# ----------------------------------------------------------------------------------------
# Baselines and the spec
# ----------------------------------------------------------------------------------------
def _torch_layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _liger():
    """Liger Kernel's LayerNorm as a baseline, when its package is installed."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except Exception:  # not installed, or no GPU triton
        return []
    return [Baseline("Liger", "liger", "Liger Kernel's LayerNorm (Triton)",
                     eager(lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)))]


def _main_shapes(sizes):
    return [tuple(s) for s in sizes.layernorm_bench_shapes]


SPEC = Spec(
    name="layernorm", title="LayerNorm", lesson="09_layernorm",
    reference=layernorm_ref64, make_input=layernorm_input, nbytes=layernorm_bytes,
    tolerance=layernorm_tol,
    checks={"check_layernorm": check_layernorm, "check_layernorm_backward": check_layernorm_backward,
            "check_rmsnorm": check_rmsnorm},
    baselines=[Baseline("torch", "eager", "F.layer_norm(x, (N,), w, b)", eager(_torch_layernorm)),
               Baseline("torch.compile", "compile", "torch.compile(F.layer_norm)", compiled(_torch_layernorm))]
    + _liger(),
    baseline_label="F.layer_norm",
    # the forward reads x once and writes y once: 90 % of the copy bandwidth
    targets=[Target("cuda", "copy", 0.9,
                    if_missed="v5 moves 16-byte vectors and keeps the row in registers; the record's copy rows "
                              "(y.copy_(x) of the same bytes, each shape) give the ceiling of a pass this size: "
                              "not found yet what the rest is"),
             Target("triton", "copy", 0.9,
                    if_missed="the record's copy rows (y.copy_(x) of the same bytes, each shape) give the ceiling "
                              "of a pass this size, and torch.compile and Liger stop short of copy there too: "
                              "not found yet what the rest is"),
             Target("numba", "copy", 0.75,
                    if_missed="Numba's kernels load one 4-byte element a thread at a time (no 16-byte vector "
                              "loads from an array), v3 keeps the row in registers; not found yet what the "
                              "rest is")],
    main_shapes=_main_shapes,
    sweep_shapes=lambda sizes: [(max(1, int(n) // 4096), 4096) for n in sizes.bench_sizes],
    sweep_label="elements, rows of 4096",
    check_shapes=lambda sizes: [tuple(s) for s in sizes.layernorm_check_shapes],
)
