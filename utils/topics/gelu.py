"""GELU, tanh approximation (lesson 03): arithmetic that is free next to memory, and fusion."""
from __future__ import annotations

import math

import torch

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    grader_sizes,
    label_n,
    randn,
    run_cases,
    same,
    shift_hint,
    sizes_text,
    success,
    with_zeros,
)
from ._spec import Baseline, Spec, Target, compiled, eager, elementwise_bytes, generator


def gelu_input(shape, seed=0, device=None):
    from runtime.config import DEVICE
    device = device or DEVICE
    return 3.0 * torch.randn(tuple(shape), generator=generator(seed, device), device=device)


def _gelu_unfused(x):
    # The formula op by op: each op is its own kernel that reads and writes the whole tensor.
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    """The tanh-approximation GELU of the lesson, in float64:
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), where sqrt(2 / pi) = 0.7978845608..."""
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def check_gelu(fn, *, seed=None):
    """``fn(x)`` must return the tanh-approximation GELU of ``x`` (see ``gelu_tanh_ref``).

    Inputs stay within |x| <= 9, where ``tanh(u) = (exp(2u) - 1) / (exp(2u) + 1)`` is still
    finite in float32, so every usual way of writing tanh is accepted.
    """
    g = Grader("check_gelu", fn, seed)
    sizes = grader_sizes()

    def case_of(n):
        x = with_zeros(g.gen, (randn(g.gen, n) * 2.5).clamp_(-9.0, 9.0), frac=0.02)
        return Case(label_n(n), (x,), gelu_tanh_ref(x), resize=case_of)

    cases = [case_of(n) for n in sizes]

    def diagnose(case, got, bad):
        x = case.values[0].double()
        tol = _check.tolerance(torch.float32)
        erf = torch.nn.functional.gelu(x)
        if _check.max_abs_err(got, erf) < _check.max_abs_err(got, case.expected) or same(got, erf, **tol):
            return ("this looks like the erf GELU (torch.nn.functional.gelu default); the lesson asks for the "
                    "tanh approximation: 0.5 * x * (1 + tanh(0.79788456 * (x + 0.044715 * x^3))).")
        if same(got, x.clamp_min(0), **tol):
            return "the result is relu(x), not GELU."
        if bool(torch.isnan(got[bad]).any()) and bool((x[bad].abs() > 4).all()):
            return "NaN for large |x|: exp overflows; write tanh(u) as 1 - 2 / (exp(2u) + 1)."
        return shift_hint(got, lambda: case.expected) or (
            "check the constants (0.79788456, 0.044715) and the x^3 term against the formula.")

    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape, diagnose=diagnose)
    success("check_gelu", cases, worst, sizes_text(sizes))


SPEC = Spec(
    name="gelu", title="GELU (tanh)", lesson="03_gelu_and_fusion",
    reference=gelu_tanh_ref, make_input=gelu_input, nbytes=elementwise_bytes,
    checks={"check_gelu": check_gelu},
    baselines=[Baseline("torch", "eager", 'F.gelu(approximate="tanh")',
                        eager(lambda x: torch.nn.functional.gelu(x, approximate="tanh"))),
               Baseline("torch op-by-op", "unfused", "the tanh formula op by op (unfused)", eager(_gelu_unfused)),
               Baseline("torch.compile", "compile", "torch.compile of the op-by-op formula",
                        compiled(_gelu_unfused))],
    targets=[Target("cuda", "copy", 0.95), Target("triton", "copy", 0.95), Target("numba", "copy", 0.85)],
)
