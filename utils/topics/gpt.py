"""Lesson 11's model grader: your kernels plugged into the GPT in place of one of its operators.

    utils.check_gpt_op("gelu", gelu_forward, gelu_backward)

``gelu_forward(x)`` returns GELU (tanh approximation) of a float32 tensor and
``gelu_backward(dy, x)`` returns ``dy * gelu'(x)``. The grader

1. puts them into lesson 11's model (``utils.GPT``, 2 layers, width 32, float32) as its GELU,
   runs one forward and backward next to the same model on torch's kernels (same weights, same
   batch) and compares the loss and every parameter's gradient, as ``utils.gradient_check``
   does. Each call of your functions inside the model is recorded; when the model disagrees,
   the diagnosis names the first call that gave a wrong result: the operator, its block, forward
   or backward, and where;
2. then grades each function alone on the harness of ``utils/grading.py`` (an awkward size,
   poisoned outputs, guarded inputs, a second run for races), and rejects a result that torch
   computed instead of your kernel.
"""
from __future__ import annotations

import math

import torch

from runtime.backends.launches import record_launches

from .. import check as _check
from ..grading import Case, Grader, GradingError, graded, label_shape, randn, run_cases, stub_message, success

__all__ = ["check_gpt_op", "gelu_ref64", "gelu_backward_ref64", "MODEL_OPS"]

_C = math.sqrt(2.0 / math.pi)


def gelu_ref64(x):
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(_C * (x + 0.044715 * x ** 3)))


def gelu_backward_ref64(dy, x):
    x = x.double()
    t = torch.tanh(_C * (x + 0.044715 * x ** 3))
    return dy.double() * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * 0.044715 * x * x))


#: The operators a learner can replace, with their float64 references.
MODEL_OPS = {"gelu": (gelu_ref64, gelu_backward_ref64)}

#: The model the grader builds (``utils.GPTConfig`` fields) and its batch.
_CFG = dict(vocab_size=48, block_size=8, n_layer=2, n_head=2, n_embd=32)
_BATCH = 2


#: gelu'(x) of the tanh approximation, written out (the hints quote it).
_GELU_PRIME = ("gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), "
               "t = tanh(sqrt(2/pi) (x + 0.044715 x^3))")


def _gelu_candidates(x64, dy, which):
    """(values, hint) of the usual wrong answers of a GELU forward or backward, in float64."""
    t = torch.tanh(_C * (x64 + 0.044715 * x64 ** 3))
    erf_gelu = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))
    sig = torch.sigmoid(1.702 * x64)
    if which == "forward":
        return [(erf_gelu, "this is the exact (erf) GELU; GPT-2's is the tanh approximation 0.5 x (1 + tanh(u))."),
                (x64 * sig, "this is the sigmoid approximation x sigmoid(1.702 x); GPT-2's is the tanh one.")]
    dy = dy.double()
    right = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * _C * (1 + 3 * 0.044715 * x64 ** 2)
    erf_prime = 0.5 * (1 + torch.erf(x64 / math.sqrt(2))) + x64 * torch.exp(-0.5 * x64 ** 2) / math.sqrt(2 * math.pi)
    return [
        (right, "dx is gelu'(x) alone: multiply by the incoming gradient dy (the chain rule: dx = dy * gelu'(x))."),
        (dy * erf_prime, "this is the derivative of the exact (erf) GELU, Phi(x) + x phi(x) (erf and the normal "
                         "density), but the forward computes GPT-2's tanh approximation, and the backward must be "
                         f"the derivative of that same tanh formula: dx = dy * gelu'(x), {_GELU_PRIME}."),
        (dy * (sig + 1.702 * x64 * sig * (1 - sig)),
         f"this is the derivative of the sigmoid approximation x sigmoid(1.702 x); the forward is the tanh one: "
         f"{_GELU_PRIME}."),
        (dy * 0.5 * (1 + t), "the derivative lacks the term of tanh's own derivative: gelu'(x) = 0.5 (1 + t) + "
                             "0.5 x (1 - t^2) u'(x), with t = tanh(u) and u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2)."),
        (dy * (0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * _C * (1 + 0.044715 * x64 ** 2)),
         "u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2): the derivative of x^3 is 3 x^2."),
        (dy * (0.5 * (1 + t) + 0.5 * x64 * (1 - t) * _C * (1 + 3 * 0.044715 * x64 ** 2)),
         "tanh'(u) = 1 - tanh(u)^2, not 1 - tanh(u)."),
        (dy * 0.5 * x64 * (1 + t), "dx = dy * gelu(x) is the forward's value times dy; the backward multiplies dy "
                                   f"by the derivative: {_GELU_PRIME}."),
    ]


def _gelu_hint(x, dy, got, which):
    """The usual mistakes of a GELU backward (or forward), recognised from the values: the wrong
    formula that ``got`` matches most closely, within the tolerance of one call in the model
    (relative to the largest value: a fixed absolute tolerance would match anything as small as
    the gradients inside a GPT)."""
    x64 = x.double()
    got = got.double().reshape(x64.shape)
    best, hint = 1.0, None
    for cand, text in _gelu_candidates(x64, dy, which):
        tol = _call_tol(cand)
        excess = float(((got - cand).abs() / (2 * tol["atol"] + 2 * tol["rtol"] * cand.abs())).max())
        if excess <= best:     # within twice the tolerance everywhere, and closer than any other
            best, hint = excess, text
    if hint is not None:
        return hint
    if which == "forward":
        return "gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."
    return f"dx = dy * gelu'(x), {_GELU_PRIME}."


class _Plugged(torch.autograd.Function):
    """The learner's forward and backward as one operator of the model; every call recorded."""

    @staticmethod
    def forward(ctx, x, rec):
        ctx.rec = rec
        i = len(rec["calls"])
        with record_launches() as launches:
            y = rec["forward"](x.detach().contiguous())
        y = _as_tensor(rec, y, x, "forward")
        rec["calls"].append({"i": i, "x": x.detach().clone(), "y": y, "fwd_launches": launches})
        ctx.i = i
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        rec = ctx.rec
        with record_launches() as launches:
            dx = rec["backward"](dy.detach().contiguous(), x.detach().contiguous())
        dx = _as_tensor(rec, dx, x, "backward")
        rec["calls"][ctx.i].update(dy=dy.detach().clone(), dx=dx, bwd_launches=launches)
        return dx, None


def _as_tensor(rec, t, like, which):
    """What the learner's forward or backward returned, as the model's tensor: a tensor of the
    input's shape and dtype, or a failure that says so (a dtype before any value: autograd would
    convert a gradient of another dtype silently, and only its rounding would show)."""
    g = rec["grader"]
    what = "y, what your gelu_forward returned," if which == "forward" else "dx, what your gelu_backward returned,"
    if isinstance(t, (tuple, list)) and len(t) == 1:
        t = t[0]
    if not isinstance(t, torch.Tensor):
        g.fail(f"in the model, your gelu_{which} returned a {type(t).__name__}, not a torch tensor.")
    if tuple(t.shape) != tuple(like.shape):
        g.fail(f"in the model, your gelu_{which} returned shape {tuple(t.shape)} for an input of shape "
               f"{tuple(like.shape)}: return a tensor of the input's shape (torch.empty_like(x)).")
    g.check_dtype(t, (like.dtype,), what)
    return t


def _call_tol(want):
    """float32's tolerance for one call inside the model, relative to the call's largest value:
    the gradients flowing back through a GPT are small (1e-4 and less), and a fixed absolute
    tolerance would let a wrong derivative through."""
    scale = float(want.abs().max()) if want.numel() else 1.0
    return {"atol": 1e-5 * scale + 1e-30, "rtol": 1e-4}


def _report_text(op, rep) -> str:
    """The model's gradient check in words, for a failure: with the model's loss and gradients
    within their tolerance, a wrong call can still be found alone, and no verdict of the model's
    (its report's PASS) may read as the learner's."""
    head = (f"loss {rep.loss:.10g} vs torch {rep.loss_ref:.10g} (|diff| {rep.loss_diff:.2g}); {len(rep.rows)} "
            f"gradients, largest relative error {rep.max_rel:.2g}")
    if rep.ok:
        lines = [f"the model with your {op} stays within the model's tolerance of torch's: {head}, "
                 f"{rep.tol:.0e} allowed. Yet a call of your {op} inside it is wrong (below)."]
    else:
        lines = [f"the model with your {op} does not match the model on torch's kernels: {head}, more than the "
                 f"{rep.tol:.0e} allowed."]
    lines += [f"  {name:28s} max |diff| {ab:.2g}  (max |grad| {ref:.2g}, relative {rel:.2g})"
              for name, ab, ref, rel in rep.worst()]
    return "\n".join(lines)


def _where(call, n_layer):
    # the model calls gelu once per block, in order: call i is block i's MLP
    i = call["i"]
    return f"block {i} (its MLP)" if i < n_layer else f"call {i}"


def _model_check(g, op, fwd, bwd, ref_f, ref_b):
    from ..gpt import GPT, GPTConfig, gradient_check, race_checks_off
    cfg = GPTConfig(**_CFG)
    rec = {"calls": [], "forward": fwd, "backward": bwd, "grader": g}
    base = GPT(cfg, "torch", seed=None).ops      # torch's kernels elsewhere: your operator is the one on trial
    ops = base.replace(**{op: lambda x: _Plugged.apply(x, rec)})
    try:
        with race_checks_off():
            rep = gradient_check(cfg, ops=ops, dtype=torch.float32, batch=_BATCH, T=cfg.block_size, seed=g.seed)
    except GradingError:
        raise
    except NotImplementedError as e:
        raise GradingError(stub_message(e) or f"not solved yet: {e}") from None
    except Exception as e:
        stub = stub_message(e)
        if stub:
            raise GradingError(stub) from None
        g.fail(f"the model with your {op} raised {type(e).__name__}: {e}", cause=e)
    calls = rec["calls"]
    # which call was wrong first: the forward calls in order, then the backward calls (which run in
    # reverse order of the blocks)
    tol = _check.tolerance(torch.float32)
    first_bad = None
    for call in calls:
        want = ref_f(call["x"].cpu())
        got = call["y"].detach().to("cpu", torch.float64)
        tol = _call_tol(want)
        bad = _check.mismatch_mask(got, want, **tol)
        if bool(bad.any()):
            first_bad = (call, "forward", got, want, bad, _gelu_hint(call["x"].cpu(), None, got, "forward"))
            break
    if first_bad is None:
        for call in reversed(calls):
            if "dx" not in call:
                continue
            want = ref_b(call["dy"].cpu(), call["x"].cpu())
            got = call["dx"].detach().to("cpu", torch.float64)
            tol = _call_tol(want)
            bad = _check.mismatch_mask(got, want, **tol)
            if bool(bad.any()):
                first_bad = (call, "backward", got, want, bad,
                             _gelu_hint(call["x"].cpu(), call["dy"].cpu(), got, "backward"))
                break
    if not rep.ok or first_bad is not None:
        lines = [_report_text(op, rep)]
        if first_bad is not None:
            call, which, got, want, bad, hint = first_bad
            what = _check.describe_mismatch(got, want, mask=bad, what="y" if which == "forward" else "dx", **tol)
            lines.append(f"The first wrong operator: {op} in {_where(call, cfg.n_layer)}, its {which} "
                         f"(your {'gelu_forward' if which == 'forward' else 'gelu_backward'}): {what}")
            g.fail("\n".join(lines), hint)
        g.fail("\n".join(lines), f"every call of your {op} matched the float64 reference, yet the gradients "
               "differ: does your function change its input, or keep state between calls?")
    for call in calls:
        for key, fn in (("fwd_launches", fwd), ("bwd_launches", bwd)):
            if key in call:
                why = call[key].verdict((), True, fn)
                if why:
                    g.fail(f"in the model, your {op} {'forward' if key == 'fwd_launches' else 'backward'}: {why}")
    return rep, len(calls)


@graded
def check_gpt_op(op, forward, backward, *, seed=None):
    """Your ``forward`` and ``backward`` of operator ``op`` ("gelu") in lesson 11's model: the
    model's loss and every gradient against torch's, then each function alone on the harness."""
    if op not in MODEL_OPS:
        raise ValueError(f"check_gpt_op: op must be one of {sorted(MODEL_OPS)}, got {op!r}")
    for name, fn in (("forward", forward), ("backward", backward)):
        if not callable(fn):
            raise TypeError(f"check_gpt_op expects your {name} function, got {type(fn).__name__}")
    ref_f, ref_b = MODEL_OPS[op]
    # In the model, autograd calls the functions (each call's launches are judged there); alone,
    # each function is graded by the grading loop.
    gf = Grader("check_gpt_op", forward, seed)
    rep, n_calls = _model_check(gf, op, forward, backward, ref_f, ref_b)
    # each function alone: odd sizes, poison, guards, a second run, torch doing the work
    shape = (7, 131)
    x = randn(gf.gen, *shape) * 3
    dy = randn(gf.gen, *shape)
    fwd_case = Case(label_shape(shape) + f" ({op} forward)", (x,), ref_f(x))
    run_cases(gf, [fwd_case], names=("x",), shape_of=lambda c: c.expected.shape,
              diagnose=lambda c, got, bad: _gelu_hint(c.values[0], None, got, "forward"))
    bwd_case = Case(label_shape(shape) + f" ({op} backward)", (dy, x), ref_b(dy, x))
    gb = Grader("check_gpt_op", backward, gf.seed)
    run_cases(gb, [bwd_case], names=("dy", "x"), shape_of=lambda c: c.expected.shape,
              diagnose=lambda c, got, bad: _gelu_hint(c.values[1], c.values[0], got, "backward"))
    success("check_gpt_op", line=(
        f"check_gpt_op: the model with your {op} ({n_calls} forward and backward calls) matches torch's: loss "
        f"{rep.loss:.6f} vs {rep.loss_ref:.6f}, {len(rep.rows)} gradients within {rep.max_rel:.2g} (relative; float32 "
        f"tolerance {rep.tol:.0e}); alone on a {shape[0]}x{shape[1]} input: correct"))
