"""Residual add + LayerNorm, fused (lesson 11): where every transformer block joins its
residual stream, h = x + r (kept: the next block adds to it), y = LayerNorm(h).

Fused, x and r are read once and h and y written once (16 bytes per element); unfused, h
makes a round trip through memory before LayerNorm reads it (benchmarks/lessons/gpt_kernels.py)."""
from __future__ import annotations

import torch

from runtime.config import DEVICE, SIMULATE

from ..grading import Grader, Output, grade, largest_first, randn, returned, success
from . import _multi
from ._spec import FLOAT, Spec, Target, generator
from .layernorm import EPS, layernorm_ref64, layernorm_tol


def residual_layernorm_ref64(x, r, w, b, eps=EPS):
    """y = LayerNorm(h) in float64 of h = x + r as float32 holds it (h is an output too)."""
    h = (x.float() + r.float()).double() if x.dtype != torch.float64 else x + r
    return layernorm_ref64(h, w, b, eps)


def residual_layernorm_input(shape, seed=0, device=None):
    """(x, r, w, b); every third row of r around 1000 (a large mean: E[h^2] - E[h]^2 cancels)."""
    device = device or DEVICE
    gen = generator(seed, device)
    rows, cols = shape
    x = torch.randn(rows, cols, generator=gen, device=device)
    r = torch.randn(rows, cols, generator=gen, device=device)
    r = torch.where((torch.arange(rows, device=device) % 3 == 2)[:, None], r + 1000.0, r)
    w = 1.0 + 0.5 * torch.randn(cols, generator=gen, device=device)
    b = 0.5 * torch.randn(cols, generator=gen, device=device)
    return x, r, w, b


def residual_layernorm_tol(inputs, ref):
    x, r, w, b = inputs
    return layernorm_tol(((x.float() + r.float()), w), ref)


def residual_layernorm_bytes(shape) -> int:
    rows, cols = shape
    return 4 * FLOAT * rows * cols


def _shapes():
    return [(1, 1), (7, 3), (9, 300)] if SIMULATE else [(1, 1), (7, 3), (1023, 768), (16384, 768)]


def _hint_y(x, r, w, b, want, y):
    near = lambda a: bool(((y - a).abs() <= 1e-3 * (1 + a.abs())).all())  # noqa: E731
    if near(layernorm_ref64(x, w, b)):
        return "y is the LayerNorm of x: it normalizes h = x + r, the sum."
    if near(layernorm_ref64(x, w, b) + r.double()):
        return "r was added after the LayerNorm: y = LayerNorm(x + r)."
    big = (r.double().mean(dim=1).abs() > 100)
    ok = ((y - want).abs() <= 1e-3 * (1 + want.abs())).all(dim=1)
    if bool(big.any()) and bool(ok[~big].all()) and not bool(ok[big].all()):
        return ("right on ordinary rows, wrong on rows with a large mean (around 1000): E[h^2] - E[h]^2 in "
                "float32 cancels; subtract the mean first (two passes over the row).")
    return "y = (h - mean) * rstd * w + b; mean and the biased variance of each row of h, eps inside the sqrt."


def check_residual_layernorm(fn, *, seed=None):
    """``fn(x, r, w, b)`` must return ``(h, y)``: h = x + r and y = LayerNorm(h) (biased
    variance, eps 1e-5 inside the square root) with weight w and bias b; all float32."""
    g = Grader("check_residual_layernorm", fn, seed)
    cases = []
    for rows, cols in _shapes():
        x, r = randn(g.gen, rows, cols), randn(g.gen, rows, cols)
        r[2::3] += 1000.0
        w, b = 1.0 + 0.5 * randn(g.gen, cols), 0.5 * randn(g.gen, cols)
        cases.append(_multi.case(f"a {rows}x{cols} input (rows around 1000)", (x, r, w, b),
                                 residual_layernorm_ref64(x, r, w, b)))

    def outputs(c):
        x, r, w, b = c.values
        return [Output("h", (x + r).double(), tol=0.0,
                       diagnose=lambda run, got, bad: "h = x + r, element by element (the residual stream the next "
                                                      "block uses)."),
                Output("y", c.expected, tol=residual_layernorm_tol(c.values, c.expected),
                       diagnose=lambda run, got, bad: _hint_y(*run.case.values, run.case.expected, got))]

    def unpack(run):
        if isinstance(run.out, (tuple, list)) and len(run.out) > 2:
            return tuple(run.out[:2])  # (h, y, mean, rstd) with the statistics: h and y are graded
        return returned(g, run, ("h", "y"))

    worst = grade(g, cases, outputs, inputs=("x", "r", "w", "b"), unpack=unpack, order=largest_first)
    success("check_residual_layernorm", cases, worst, "shapes " + ", ".join(f"{r}x{k}" for r, k in _shapes()))


SPEC = Spec(
    name="residual_layernorm", title="Residual add + LayerNorm (fused)", lesson=_multi.LESSON,
    reference=residual_layernorm_ref64, make_input=residual_layernorm_input, nbytes=residual_layernorm_bytes,
    tolerance=residual_layernorm_tol,
    checks={"check_residual_layernorm": check_residual_layernorm},
    main_shapes=lambda sizes: [(16384, 768)] if not SIMULATE else [(64, 300)],
    sweep_shapes=lambda sizes: [(16384, 768)] if not SIMULATE else [(64, 300)],
    check_shapes=lambda sizes: [(1, 1), (7, 3), (9, 300)],
)

#: The H100 goal (benchmarks/lessons/gpt_kernels.py): at GPT-2's width (16 x 1024 tokens, 768 wide), the
#: fused kernel at least as fast as the unfused pair, and 85 % of the copy bandwidth.
TARGETS = [Target("cuda", "copy", 0.85, shape=(16384, 768)), Target("triton", "copy", 0.85, shape=(16384, 768))]
