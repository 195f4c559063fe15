"""ReLU (lesson 02): the elementwise kernel every language starts with."""
from __future__ import annotations

import torch

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    first_row_hint,
    grader_shapes,
    grader_sizes,
    guarded_input,
    label_n,
    label_shape,
    randn,
    run_cases,
    same,
    shapes_text,
    shift_hint,
    sizes_text,
    success,
    swap_hint_2d,
    tail_hint,
    transposed_hint,
    with_zeros,
)
from ._spec import Baseline, Spec, Target, compiled, eager, elementwise_bytes, exact_tol, generator


def relu_ref64(x):
    return torch.relu(x.double())


def relu_input(shape, seed=0, device=None):
    from runtime.config import DEVICE
    device = device or DEVICE
    x = torch.randn(tuple(shape), generator=generator(seed, device), device=device)
    x.view(-1)[::7] = 0.0  # exact zeros: relu(0) must be 0
    return x


def check_relu(fn, *, seed=None):
    """``fn(x)`` must return ``relu(x)`` (``max(x, 0)``) for a 1-D float32 tensor."""
    g = Grader("check_relu", fn, seed)
    sizes = grader_sizes()

    def case_of(n):
        x = with_zeros(g.gen, randn(g.gen, n))
        return Case(label_n(n) + " (with negatives and exact zeros)", (x,), relu_ref64(x), resize=case_of)

    cases = [case_of(n) for n in sizes]

    def diagnose(case, got, bad):
        x = case.values[0].double()
        if same(got, x, **_check.tolerance(torch.float32)):
            return "the result equals the input: negative values must become 0."
        if same(got, x.abs(), **_check.tolerance(torch.float32)):
            return "the result is |x|: negative values must become 0, not positive."
        if bool((x[bad] < 0).all()):
            return "only negative inputs are wrong: relu(x) is 0 for x < 0 (fmaxf(x, 0.f))."
        return shift_hint(got, lambda: case.expected)

    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=tail_hint, diagnose=diagnose)
    success("check_relu", cases, worst, sizes_text(sizes))


def check_relu_2d(fn, *, seed=None):
    """``fn(x)`` must return ``relu(x)`` for a 2-D strided view: ``x`` is a column slice of a
    wider matrix, so ``x.stride(0) > x.shape[1]`` (a pitched matrix). The result may be a
    new contiguous tensor of ``x``'s shape."""
    g = Grader("check_relu_2d", fn, seed)
    shapes = grader_shapes()
    cases = []
    for rows, cols in shapes:
        pad, off = 5 + cols // 3, 2
        wide = with_zeros(g.gen, randn(g.gen, rows, cols + pad))
        x = wide[:, off:off + cols]

        def make(wide=wide, off=off, cols=cols):
            w, guard = guarded_input(wide)
            return (w[:, off:off + cols],), [guard]
        c = Case(label_shape((rows, cols)) + f" (a column slice of a {rows}x{cols + pad} matrix, "
                  f"row stride {cols + pad})", (x,), relu_ref64(x), make=make,
                  extra=dict(wide=wide, off=off))
        cases.append(c)

    def diagnose(case, got, bad):
        rows, cols = case.expected.shape
        flat = case.extra["wide"].reshape(-1)[case.extra["off"]:case.extra["off"] + rows * cols]
        nostride = flat.double().clamp_min(0).reshape(rows, cols)
        if rows > 1 and same(got, nostride, **_check.tolerance(torch.float32)):
            return ("the first row is right but the others are not: is the row stride used? "
                    f"Row r starts at x + r * x.stride(0) ({cols + 5 + cols // 3} here), not x + r * cols.")
        return first_row_hint(bad) or transposed_hint(got, case.expected)

    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=swap_hint_2d, diagnose=diagnose)
    success("check_relu_2d", cases, worst, shapes_text(shapes))


def check_relu_backward(fn, *, seed=None):
    """``fn(grad_out, x)`` must return ``grad_out * (x > 0)`` (the gradient is 0 at x == 0)."""
    g = Grader("check_relu_backward", fn, seed)
    sizes = grader_sizes()

    def case_of(n):
        go = randn(g.gen, n)
        x = with_zeros(g.gen, randn(g.gen, n), frac=0.2)
        return Case(label_n(n) + " (x with exact zeros)", (go, x), go.double() * (x.double() > 0).double(),
                    resize=case_of)

    cases = [case_of(n) for n in sizes]

    def diagnose(case, got, bad):
        go, x = (v.double() for v in case.values)
        tol = _check.tolerance(torch.float32)
        if same(got, go * (x >= 0).double(), **tol):
            return "at x == 0 the result must be 0: use x > 0, not x >= 0 (as torch does)."
        if same(got, x.clamp_min(0), **tol) or same(got, (x > 0).double(), **tol):
            return "the result ignores grad_out: the gradient is grad_out where x > 0, else 0."
        if same(got, go * (go > 0).double(), **tol):
            return "the mask comes from grad_out: it must come from x (the forward input)."
        return shift_hint(got, lambda: case.expected)

    worst = run_cases(g, cases, names=("grad_out", "x"), shape_of=lambda c: c.expected.shape,
                       diagnose=diagnose)
    success("check_relu_backward", cases, worst, sizes_text(sizes))


SPEC = Spec(
    name="relu", title="ReLU", lesson="02_relu",
    reference=relu_ref64, make_input=relu_input, nbytes=elementwise_bytes,
    tolerance=exact_tol,    # max(x, 0) is exact in any float format
    checks={"check_relu": check_relu, "check_relu_2d": check_relu_2d,
            "check_relu_backward": check_relu_backward},
    baselines=[Baseline("torch", "eager", "F.relu", eager(torch.nn.functional.relu)),
               Baseline("torch.compile", "compile", "torch.compile(F.relu)", compiled(torch.nn.functional.relu))],
    # At 2^28 elements on the H100: an elementwise kernel is a copy with arithmetic.
    targets=[Target("cuda", "copy", 0.95), Target("triton", "copy", 0.95), Target("numba", "copy", 0.85)],
)
