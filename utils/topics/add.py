"""Vector and matrix addition (lesson 01): the first kernels of the course."""
from __future__ import annotations

import torch

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    first_row_hint,
    grader_shapes,
    grader_sizes,
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
)
from ._spec import FLOAT, Spec, generator, numel


def add_ref64(x, y):
    return x.double() + y.double()


def add_input(shape, seed=0, device=None):
    from runtime.config import DEVICE
    device = device or DEVICE
    g = generator(seed, device)
    return (torch.randn(tuple(shape), generator=g, device=device),
            torch.randn(tuple(shape), generator=g, device=device))


def check_add(fn, *, seed=None):
    """``fn(x, y)`` must return ``x + y`` for 1-D float32 tensors."""
    g = Grader("check_add", fn, seed)
    sizes = grader_sizes()

    def case_of(n):
        x, y = randn(g.gen, n), randn(g.gen, n)
        return Case(label_n(n), (x, y), add_ref64(x, y), resize=case_of)

    cases = [case_of(n) for n in sizes]

    def diagnose(case, got, bad):
        x, y = (v.double() for v in case.values)
        if same(got, 2 * x, **_check.tolerance(torch.float32)):
            return "the result is x + x: is y read from the right pointer?"
        return shift_hint(got, lambda: case.expected)

    worst = run_cases(g, cases, names=("x", "y"), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=tail_hint, diagnose=diagnose)
    success("check_add", cases, worst, sizes_text(sizes))



def check_add_2d(fn, *, seed=None):
    """``fn(a, b)`` must return ``a + b`` for 2-D float32 matrices of awkward, non-square shapes."""
    g = Grader("check_add_2d", fn, seed)
    shapes = grader_shapes()
    cases = []
    for s in shapes:
        a, b = randn(g.gen, *s), randn(g.gen, *s)
        cases.append(Case(label_shape(s), (a, b), add_ref64(a, b)))

    def diagnose(case, got, bad):
        return transposed_hint(got, case.expected) or first_row_hint(bad)

    worst = run_cases(g, cases, names=("a", "b"), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=swap_hint_2d, diagnose=diagnose)
    success("check_add_2d", cases, worst, shapes_text(shapes))


SPEC = Spec(
    name="add", title="Add", lesson="01_threads_blocks_grids",
    reference=add_ref64, make_input=add_input,
    nbytes=lambda shape: 3 * FLOAT * numel(shape),   # two reads and one write per element
    checks={"check_add": check_add, "check_add_2d": check_add_2d},
    # Not benchmarked: lesson 01 times it only to show a launch's cost.
)
