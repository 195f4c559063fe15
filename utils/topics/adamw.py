"""AdamW, one fused step over every parameter (lesson 11), and the global gradient norm for
clipping.

    p <- p * (1 - lr * wd)                    (decoupled weight decay)
    m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

checked against ``torch.optim.AdamW`` over 10 steps. The topic's reference is one step
(step 3, lr 1e-3, weight decay 0.1) from a given state; its shape is the parameter count.
"""
from __future__ import annotations

import math

import torch

from runtime.config import DEVICE, SIMULATE

from ..grading import Grader, Output, grade, in_order, randn, success
from . import _multi
from ._spec import FLOAT, Spec, Target, generator

#: The hyperparameters the topic's reference (one step) uses; the grader uses GRADE_HYPER.
REF_HYPER = dict(step=3, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
GRADE_HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
STEPS = 10


def adamw_step64(p, g, m, v, *, step, lr, beta1, beta2, eps, weight_decay, variant=None):
    """One AdamW step in float64: (p, m, v) after it. ``variant`` names a classic mistake
    (for the diagnoses): "no bias correction", "L2", "decay without lr", "eps inside sqrt",
    "bc2 without sqrt"."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    if variant == "L2":
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    if variant == "no bias correction":
        bc1 = bc2 = 1.0
    if variant == "decay without lr":
        p = p * (1 - weight_decay)
    elif variant != "L2":
        p = p * (1 - lr * weight_decay)
    if variant == "eps inside sqrt":
        denom = torch.sqrt(v / bc2 + eps)
    elif variant == "bc2 without sqrt":
        denom = torch.sqrt(v) / bc2 + eps
    else:
        denom = torch.sqrt(v) / math.sqrt(bc2) + eps
    return p - lr / bc1 * m / denom, m, v


def adamw_ref64(p, g, m, v):
    """The topic's reference: the parameters after step 3 (REF_HYPER) from state (m, v)."""
    return adamw_step64(p, g, m, v, **REF_HYPER)[0]


def adamw_input(shape, seed=0, device=None):
    """(params, grads, exp_avg, exp_avg_sq): a state a few steps into training (v >= 0)."""
    device = device or DEVICE
    gen = generator(seed, device)
    n = shape[0]
    p = torch.randn(n, generator=gen, device=device)
    g = torch.randn(n, generator=gen, device=device)
    m = 0.1 * torch.randn(n, generator=gen, device=device)
    v = 0.01 * torch.rand(n, generator=gen, device=device)
    return p, g, m, v


def adamw_tol(inputs, ref):
    return 1e-6 + 1e-5 * ref.abs()


def adamw_bytes(shape) -> int:
    """Read p, g, m, v; write p, m, v: 28 bytes per parameter."""
    return 7 * FLOAT * shape[0]


def grad_norm_ref64(grads):
    tensors = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))


# ----------------------------------------------------------------------------------------
# Graders
# ----------------------------------------------------------------------------------------
def _sizes():
    return [1, 7, 1025] if SIMULATE else [1, 7, 1025, (1 << 20) + 3]


_VARIANTS = {
    "no bias correction": "the update lacks the bias corrections: divide m by 1 - beta1^t and v by 1 - beta2^t "
                          "(t the step number, from 1); without them the first steps are far too small.",
    "L2": "the weight decay is added to the gradient (Adam's L2 penalty, which then passes through m and v): "
          "AdamW decays the parameters directly, p = p * (1 - lr * weight_decay), apart from m and v.",
    "decay without lr": "the weight decay is not multiplied by lr: p = p * (1 - lr * weight_decay), not "
                        "p * (1 - weight_decay).",
    "eps inside sqrt": "eps is inside the square root: the denominator is sqrt(v_hat) + eps.",
    "bc2 without sqrt": "v is divided by sqrt(1 - beta2^t) the wrong way: v_hat = v / (1 - beta2^t), and the "
                        "denominator is sqrt(v_hat) + eps = sqrt(v) / sqrt(1 - beta2^t) + eps.",
}


def _adamw_hint(before, t, got_p):
    p, g, m, v = before
    if not bool(torch.isfinite(got_p).all()) and t == 1:
        return ("inf/NaN at step 1: is the step number counted from 1? The bias corrections 1 - beta^t are 0 at "
                "t = 0, and m / 0 is inf.")
    for variant, text in _VARIANTS.items():
        want = adamw_step64(p, g, m, v, step=t, variant=variant, **GRADE_HYPER)[0]
        if bool(((got_p - want).abs() <= 1e-5 * (1 + want.abs())).all()):
            return text
    return None


def check_adamw(fn, *, seed=None):
    """``fn(params, grads, exp_avg, exp_avg_sq, *, step, lr, beta1, beta2, eps, weight_decay)``
    must do one AdamW step in place (params, exp_avg and exp_avg_sq updated, float32, 1-D).
    The grader runs 10 steps, with fresh gradients each, from zero moments, and compares
    every step with torch.optim.AdamW's float64 answer."""
    g = Grader("check_adamw", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sorted(sizes, key=lambda k: abs(k - 1025)):  # several blocks and a tail first
        p = randn(g.gen, n)
        m = torch.zeros(n)
        v = torch.zeros(n)
        ref = torch.optim.AdamW([torch.nn.Parameter(p.double().clone())], lr=GRADE_HYPER["lr"],
                                betas=(GRADE_HYPER["beta1"], GRADE_HYPER["beta2"]), eps=GRADE_HYPER["eps"],
                                weight_decay=GRADE_HYPER["weight_decay"], foreach=False)
        ref_p = ref.param_groups[0]["params"][0]
        for t in range(1, STEPS + 1):
            grad = randn(g.gen, n) * (1.0 + t)
            ref_p.grad = grad.double()
            ref.step()
            want_p = ref_p.detach().clone()
            st = ref.state[ref_p]
            want_m, want_v = st["exp_avg"].clone(), st["exp_avg_sq"].clone()
            cases.append(_multi.case(f"{n} parameters, step {t} of {STEPS}", (p, grad, m, v), want_p,
                                     kwargs=dict(step=t, **GRADE_HYPER), step=t, m=want_m, v=want_v))
            p, m, v = want_p.float(), want_m.float(), want_v.float()  # the next step starts from the right state

    def outputs(c):
        p, grad, m, v = c.values
        want_m, want_v = c.extra["m"], c.extra["v"]
        # m = beta1 m + (1 - beta1) g may cancel to far less than its two terms. A float32 kernel
        # rounds beta1 (0.9 becomes 0.9 - 2.4e-8, so (1 - beta1) g is off by 2.4e-7 of itself) and
        # both products: up to ~2^-22 of the terms' size, more than 1e-5 |m| where they cancel and
        # the gradients are large (up to ~60 among the GPU's 2^20 parameters); 2^-20 of it allowed
        m_terms = GRADE_HYPER["beta1"] * m.double().abs() + (1 - GRADE_HYPER["beta1"]) * grad.double().abs()
        return [Output("exp_avg", want_m, tol=1e-6 + 1e-5 * want_m.abs() + 2.0 ** -20 * m_terms, what="exp_avg (m)",
                       diagnose=lambda run, got, bad: "m = beta1 * m + (1 - beta1) * g, before the update."),
                Output("exp_avg_sq", want_v, tol=1e-7 + 1e-5 * want_v.abs(), what="exp_avg_sq (v)",
                       diagnose=lambda run, got, bad: "v = beta2 * v + (1 - beta2) * g * g, before the update."),
                Output("params", c.expected, tol=1e-6 + 1e-5 * c.expected.abs(),
                       diagnose=lambda run, got, bad: _adamw_hint(run.case.values, run.case.extra["step"], got))]

    def unpack(run):
        params, _, exp_avg, exp_avg_sq = run.inputs   # updated in place: what fn returns is not graded
        return exp_avg, exp_avg_sq, params

    def params_changed(run):
        if torch.equal(run.inputs[0].detach().cpu(), run.case.values[0]) and run.case.values[0].numel() > 1:
            g.fail("params did not change: the step updates params, exp_avg and exp_avg_sq in place "
                   "(write into the tensors passed in, not into new ones).")

    worst = grade(g, cases, outputs, inputs=("params", "grads", "exp_avg", "exp_avg_sq"),
                  written=("params", "exp_avg", "exp_avg_sq"), unpack=unpack, check=params_changed, order=in_order)
    success("check_adamw", line=f"check_adamw: {STEPS} steps match torch.optim.AdamW on {len(sizes)} parameter "
                                f"counts ({min(sizes)} .. {max(sizes)}), max error {worst:.3g}")


def check_grad_norm(fn, *, seed=None):
    """``fn(grads)`` must return the L2 norm of the 1-D float32 tensor grads (a 0-d or 1-element
    tensor), or a tuple whose first element is it (as ``grad_norm`` returns (norm, scale))."""
    g = Grader("check_grad_norm", fn, seed)
    sizes = [1, 7, 1025, 20001] if SIMULATE else [1, 7, 1025, (1 << 24) + 3]
    cases = []
    for n in sorted(sizes, key=lambda k: -k):
        x = randn(g.gen, n)
        cases.append(_multi.case(f"{n} gradients", (x,), grad_norm_ref64(x)))

    def hint(run, got, bad):
        x, want = run.case.values[0], run.case.expected
        sq = float(want) ** 2
        if abs(float(got) - sq) <= 1e-4 * (1 + sq):
            return "that is the sum of squares: the norm is its square root."
        if abs(float(got) - float(x.double().abs().sum())) <= 1e-4 * float(x.double().abs().sum()):
            return "that is the sum of |g| (the L1 norm): the L2 norm is sqrt(sum of g^2)."
        if 0 < float(got) < float(want):
            return ("too small: only part of the gradient was added. Every block's partial sum must reach "
                    "the total (a second pass over the partials, or an atomic add per block).")
        return None

    def outputs(c):
        return [Output("norm", c.expected, scalar=True, tol=1e-6 + 1e-5 * float(c.expected), what="the norm",
                       diagnose=hint)]

    def unpack(run):
        return (run.out[0] if isinstance(run.out, (tuple, list)) and len(run.out) >= 1 else run.out,)

    worst = grade(g, cases, outputs, inputs=("grads",), unpack=unpack, order=in_order)
    success("check_grad_norm", cases, worst, f"sizes {min(sizes)} .. {max(sizes)}")


SPEC = Spec(
    name="adamw", title="AdamW step", lesson=_multi.LESSON,
    reference=adamw_ref64, make_input=adamw_input, nbytes=adamw_bytes, tolerance=adamw_tol,
    checks={"check_adamw": check_adamw, "check_grad_norm": check_grad_norm},
    main_shapes=lambda sizes: [(124_475_904,)] if not SIMULATE else [(4096,)],
    sweep_shapes=lambda sizes: [(124_475_904,)] if not SIMULATE else [(4096,)],
    check_shapes=lambda sizes: [(1,), (7,), (1025,)],
)

#: The H100 goal (benchmarks/lessons/gpt_kernels.py): one step over GPT-2 124M's parameters (a flat
#: buffer) no slower than torch.optim.AdamW(fused=True), 1.42 ms when the issue was filed.
TARGETS = [Target("cuda", "torch", 1.0, shape=(124_475_904,)), Target("triton", "torch", 1.0, shape=(124_475_904,))]
