"""Pieces the graders of lesson 11's topics share (cross-entropy, embedding, AdamW, the
fusions): inputs of any dtype (int64 class indices, bfloat16 logits) inside guarded,
poisoned buffers, functions that return several tensors, and a tolerance that is a tensor
(one allowed error per element), all on the harness of ``utils/grading.py``."""
from __future__ import annotations

import torch

from runtime.config import DEVICE

from .. import check as _check
from ..grading import INPUT_GUARD_BITS, Case, Grader, _Guarded

#: The lesson that teaches these topics (its notebook is notebooks/<LESSON>.ipynb).
LESSON = "11_gpt"


def guarded(values: torch.Tensor):
    """``values`` (any dtype) copied into the middle of a guarded buffer on DEVICE: floats
    past the ends read NaN, integers a recognisable garbage value."""
    g = _Guarded(values.shape, values.dtype, DEVICE, INPUT_GUARD_BITS, "input")
    g.view.copy_(values)
    g.orig = values.detach().clone()
    return g.view, g


def maker(values):
    """A Case's ``make``: fresh guarded copies of ``values`` for every call (an in-place
    kernel may write over its inputs)."""
    def make():
        pairs = [guarded(v) for v in values]
        return tuple(p[0] for p in pairs), [p[1] for p in pairs]
    return make


def case(label, values, expected, **extra):
    """A Case whose inputs keep their dtypes (``Case.values`` would all become float32)."""
    c = Case(label, tuple(values), expected, make=maker(values), extra=extra)
    return c


def outputs(g: Grader, run, specs, names, *, dtypes=(torch.float32,)):
    """The tensors ``fn`` returned, checked: ``specs`` is one (shape or "scalar") per output.
    Returns them as float64 CPU tensors, in order, and the raw tensors."""
    out = run.out
    if len(specs) > 1 and (not isinstance(out, (tuple, list)) or len(out) != len(specs)):
        g.fail(f"your function returned {type(out).__name__}"
               f"{' of length ' + str(len(out)) if isinstance(out, (tuple, list)) else ''}: "
               f"return the tuple ({', '.join(names)}).")
    outs = out if len(specs) > 1 else (out,)
    got, raw = [], []
    for o, spec, name in zip(outs, specs, names):
        run.out = o
        scalar = spec == "scalar"
        t = g.output_tensor(run, None if scalar else spec, scalar=scalar, dtypes=dtypes)
        g.check_guards(run, t, out_noun=name)
        if not scalar:
            m = g.unwritten_mask(run, t)
            if m is not None and bool(m.any()):
                one = int(m.sum()) == 1
                g.fail(f"{name}: {_check.describe_positions(m)} {'was' if one else 'were'} never written "
                       "(the grader's NaN marker is still there).",
                       "does every element get a thread (or a program), the last block too?")
        raw.append(t)
        got.append(t.detach().to("cpu", torch.float64).reshape(() if scalar else spec))
    run.out = out
    return got, raw


def compare(g: Grader, got, want, tol, name, hint=None):
    """Fail with the mismatch in words where ``|got - want| > tol`` (tol a tensor or a number)."""
    bad = ~((got - want).abs() <= tol)
    bad = bad | (torch.isnan(got) != torch.isnan(want))
    bad &= ~(torch.isnan(got) & torch.isnan(want))
    if bool(bad.any()):
        tol_t = torch.as_tensor(tol, dtype=torch.float64, device=got.device)
        atol = float(tol_t.min()) if tol_t.numel() else 0.0
        if tol_t.numel() > 1:  # an allowed error per element: the one where the error is furthest over it
            excess = torch.where(bad, (got.double() - want.double()).abs() - tol_t, torch.full_like(tol_t, -1.0))
            excess = torch.nan_to_num(excess, nan=float("inf"))
            atol = float(tol_t.broadcast_to(got.shape).flatten()[int(excess.flatten().argmax())])
        if got.dim() == 0:
            msg = f"{name} is {float(got):.7g}, expected {float(want):.7g}."
        else:
            msg = _check.describe_mismatch(got, want, mask=bad, what=name.removeprefix("the "), atol=atol, rtol=0.0)
        g.fail(msg, hint() if callable(hint) else hint)
    finite = torch.isfinite(want) & torch.isfinite(got)
    return float((got - want).abs()[finite].max()) if bool(finite.any()) else 0.0


def rerun_differs(g: Grader, c, specs, names, first, rtol=1e-5, dtypes=(torch.float32,)):
    """Run ``c`` again under another thread order; (name, how many elements changed) of the
    first output that changed beyond ``rtol``, or None."""
    run2 = g.call(c, schedule_seed=g.seed + 1)
    second, _ = outputs(g, run2, specs, names, dtypes=dtypes)
    for a, b, name in zip(first, second, names):
        same = ((a - b).abs() <= rtol * (1 + a.abs())) | (torch.isnan(a) & torch.isnan(b))
        if not bool(same.all()):
            return name, int((~same).sum())
    return None
