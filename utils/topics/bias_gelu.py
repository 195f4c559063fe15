"""Bias + GELU, fused (lesson 11): the first activation of a transformer's MLP,
y = gelu(x + b) with the bias b broadcast over the rows, and its backward
d(x + b) = dy * gelu'(x + b). GELU is lesson 03's tanh approximation.

Fused, x is read once and y written once; unfused, x + b makes a round trip through memory
(benchmarks/lessons/gpt_kernels.py measures both)."""
from __future__ import annotations

import math

import torch

from runtime.config import DEVICE, SIMULATE

from ..grading import Grader, Output, grade, largest_first, randn, success
from . import _multi
from ._spec import FLOAT, Spec, Target, generator

K0 = math.sqrt(2.0 / math.pi)


def _gelu64(z):
    return 0.5 * z * (1.0 + torch.tanh(K0 * (z + 0.044715 * z ** 3)))


def bias_gelu_ref64(x, b):
    return _gelu64(x.double() + b.double())


def bias_gelu_backward_ref64(dy, x, b):
    z = x.double() + b.double()
    t = torch.tanh(K0 * (z + 0.044715 * z ** 3))
    return dy.double() * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * K0 * (1 + 3 * 0.044715 * z * z))


def bias_gelu_input(shape, seed=0, device=None):
    device = device or DEVICE
    gen = generator(seed, device)
    rows, cols = shape
    return 3.0 * torch.randn(rows, cols, generator=gen, device=device), torch.randn(cols, generator=gen, device=device)


def bias_gelu_tol(inputs, ref):
    return 1e-5 + 1e-5 * ref.abs()


def bias_gelu_bytes(shape) -> int:
    rows, cols = shape
    return 2 * FLOAT * rows * cols + FLOAT * cols


def _shapes():
    return [(1, 1), (7, 3), (33, 300)] if SIMULATE else [(1, 1), (7, 3), (1023, 3072), (8192, 3072)]


def _hint_forward(x, b, got):
    x64, b64 = x.double(), b.double()
    near = lambda a: bool(((got - a).abs() <= 1e-4 * (1 + a.abs())).all())  # noqa: E731
    if near(_gelu64(x64)):
        return "that is gelu(x): the bias was not added (y = gelu(x + b), b[c] for column c)."
    if near(_gelu64(x64) + b64):
        return "the bias was added after the GELU: y = gelu(x + b), the bias goes inside."
    if x.shape[0] <= x.shape[1] and near(_gelu64(x64 + b64[: x.shape[0], None])):
        return "the bias is indexed by the row: b has one value per column, b[i % cols] for flat index i."
    erf = 0.5 * (x64 + b64) * (1 + torch.erf((x64 + b64) / math.sqrt(2)))
    if near(erf):
        return "that is the exact (erf) GELU: the course uses the tanh approximation of lesson 03."
    return None


def check_bias_gelu(fn, *, seed=None):
    """``fn(x, b)`` must return gelu(x + b) (tanh approximation): x float32 (rows, cols), b (cols,)."""
    g = Grader("check_bias_gelu", fn, seed)
    cases = []
    for rows, cols in _shapes():
        x, b = randn(g.gen, rows, cols) * 3.0, randn(g.gen, cols)
        cases.append(_multi.case(f"a {rows}x{cols} input", (x, b), bias_gelu_ref64(x, b)))

    def outputs(c):
        return [Output("y", c.expected, tol=bias_gelu_tol(c.values, c.expected),
                       diagnose=lambda run, got, bad: _hint_forward(*run.case.values, got))]

    worst = grade(g, cases, outputs, inputs=("x", "b"), order=largest_first)
    success("check_bias_gelu", cases, worst, "shapes " + ", ".join(f"{r}x{k}" for r, k in _shapes()))


def _hint_backward(dy, x, b, got):
    near = lambda a: bool(((got - a).abs() <= 1e-4 * (1 + a.abs())).all())  # noqa: E731
    if near(bias_gelu_backward_ref64(dy, x, torch.zeros_like(b))):
        return "gelu' is taken at x, not at x + b: the forward's input was x + b."
    if near(bias_gelu_backward_ref64(torch.ones_like(dy), x, b)):
        return "that is gelu'(x + b) alone: multiply by dy (the chain rule)."
    if near(dy.double() * bias_gelu_ref64(x, b)):
        return "that is dy * gelu(x + b): the backward needs the derivative gelu'(z), not gelu(z)."
    z = x.double() + b.double()
    erf_prime = 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if near(dy.double() * erf_prime):
        return ("that is the derivative of the exact (erf) GELU, Phi(z) + z phi(z); the forward is the tanh "
                "approximation of lesson 03, so the backward is that formula's derivative: gelu'(z) = 0.5 (1 + t) + "
                "0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2), t = tanh(sqrt(2/pi) (z + 0.044715 z^3)).")
    return ("gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2), "
            "t = tanh(sqrt(2/pi) (z + 0.044715 z^3)).")


def check_bias_gelu_backward(fn, *, seed=None):
    """``fn(dy, x, b)`` must return d(x + b) = dy * gelu'(x + b), float32 of x's shape."""
    g = Grader("check_bias_gelu_backward", fn, seed)
    cases = []
    for rows, cols in _shapes():
        dy, x, b = randn(g.gen, rows, cols), randn(g.gen, rows, cols) * 3.0, randn(g.gen, cols)
        cases.append(_multi.case(f"a {rows}x{cols} input", (dy, x, b), bias_gelu_backward_ref64(dy, x, b)))

    def outputs(c):
        return [Output("dx", c.expected, tol=1e-5 + 1e-5 * c.expected.abs(),
                       diagnose=lambda run, got, bad: _hint_backward(*run.case.values, got))]

    worst = grade(g, cases, outputs, inputs=("dy", "x", "b"), order=largest_first)
    success("check_bias_gelu_backward", cases, worst, "shapes " + ", ".join(f"{r}x{k}" for r, k in _shapes()))


SPEC = Spec(
    name="bias_gelu", title="Bias + GELU (fused)", lesson=_multi.LESSON,
    reference=bias_gelu_ref64, make_input=bias_gelu_input, nbytes=bias_gelu_bytes, tolerance=bias_gelu_tol,
    checks={"check_bias_gelu": check_bias_gelu, "check_bias_gelu_backward": check_bias_gelu_backward},
    main_shapes=lambda sizes: [(16384, 3072)] if not SIMULATE else [(64, 300)],
    sweep_shapes=lambda sizes: [(16384, 3072)] if not SIMULATE else [(64, 300)],
    check_shapes=lambda sizes: [(1, 1), (7, 3), (33, 300)],
)

#: The H100 goal (benchmarks/lessons/gpt_kernels.py): the fused kernel at GPT-2's MLP (16 x 1024 tokens,
#: 3072 wide) at least as fast as the unfused pair, and 85 % of the copy bandwidth.
TARGETS = [Target("cuda", "copy", 0.85, shape=(16384, 3072)), Target("triton", "copy", 0.85, shape=(16384, 3072))]
