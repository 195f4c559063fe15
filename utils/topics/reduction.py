"""Reductions (lesson 04): the sum of a vector, and the row maximum that softmax needs."""
from __future__ import annotations

import math

import torch

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    grader_shapes,
    grader_sizes,
    label_n,
    label_shape,
    probe_size,
    row_cases,
    run_cases,
    same,
    shapes_text,
    sizes_text,
    success,
)
from ._spec import EPS32, FLOAT, Baseline, Spec, Target, compiled, eager, float32_tol, generator, numel


def sum_ref64(x):
    """The sum in float64, as a 0-d tensor."""
    return x.double().sum()


def row_max_ref64(x):
    return x.double().amax(dim=1)


def sum_input(shape, seed=0, device=None):
    # A positive mean keeps the sum well away from 0, so a missing block of elements shows
    # up as a clear relative error; the negatives catch a kernel that drops the sign.
    from runtime.config import DEVICE
    device = device or DEVICE
    return torch.rand(tuple(shape), generator=generator(seed, device), device=device) - 0.25


def sum_tol(inputs, ref):
    # Rounding in any summation order is bounded by a multiple of eps * sum|x|; reordering
    # (tree, atomics) gives a random walk of about sqrt(n) roundings. Small sizes keep this
    # tight enough that a missing block fails; large ones still catch gross errors.
    x = inputs[0]
    atol, rtol = float32_tol()
    n = max(x.numel(), 1)
    return atol + rtol * ref.abs() + 2.0 * EPS32 * math.sqrt(n) * x.double().abs().sum()


def _exact_sum_values(gen, n):
    """Random values whose every partial sum is exact in float32 (multiples of a power of
    two, small enough that no partial sum reaches 2^24 units), none of them zero.

    So a right float32 sum in ANY order (tree, atomics, grid-stride, Kahan) gets the exact
    answer, while a sum that misses even one element is wrong by at least one unit.
    """
    units = max(2, min(1024, (2 ** 24 - 1) // max(n, 1)))
    scale = 2.0 ** math.floor(math.log2(4.0 / units))
    k = torch.randint(1, units + 1, (n,), generator=gen)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1, 1)
    return (k * sign).to(torch.float32) * scale, scale


#: A size that no block size up to 4096 overhangs: a kernel without a mask is right there.
_NO_TAIL = 4096


def check_sum(fn, *, seed=None):
    """``fn(x)`` must return the sum of a 1-D float32 tensor: a 0-d or 1-element tensor.

    The inputs are random multiples of a power of two whose partial sums are all exact in
    float32, so a right kernel (tree, atomics, any order) is exact and the tolerance can be
    tight: ``atol + rtol * |sum|`` of ``TOLERANCES[float32]``, never more than a quarter
    of the smallest input value, which is what missing one element would cost.
    """
    g = Grader("check_sum", fn, seed)
    sizes = grader_sizes()
    cases = []
    for n in sizes:
        x, scale = _exact_sum_values(g.gen, n)
        c = Case(label_n(n), (x,), sum_ref64(x), extra=dict(scale=scale))
        c.numel = n
        cases.append(c)

    def tol_of(case):
        t = _check.tolerance(torch.float32)
        allowed = min(t["atol"] + t["rtol"] * abs(float(case.expected)), case.extra["scale"] / 4)
        return dict(atol=allowed, rtol=0.0)

    def probe(values):
        """The learner's result on a diagnostic input, or None when that run fails."""
        res = g.probe(Case("probe", (values.to(torch.float32),), sum_ref64(values)), scalar=True)
        return None if res is None else float(res[1].reshape(-1)[0])

    def cut_hint(n, k):
        # The same cut at a second, larger size means a fixed number of elements is summed.
        n2 = probe_size(n)
        if probe(torch.ones(n2)) == k:
            return (f"the result is the sum of the first {k} elements only, whatever n is ({n2} ones also sum "
                    f"to {k}): the elements past the first {k} never reach the result. Either only the first "
                    "block's partial sum is kept (add every block's partial sum: atomicAdd, or a second pass "
                    f"over the partial sums), or the grid is a fixed {k} threads (programs x BLOCK) with one "
                    "element each: loop over the rest (grid-stride: i += gridDim.x * blockDim.x) or launch "
                    "cdiv(n, BLOCK) blocks.")
        if n - k < k:
            return (f"the result misses the last {n - k} element{'s' if n - k > 1 else ''}: is the grid "
                    "rounded up (cdiv(n, BLOCK)), and does the tail block load with a mask (0 past the end)?")
        return (f"the result is the sum of the first {k} elements only: only the first block's partial "
                "sum reaches the result. Add every block's partial sum (atomicAdd, or a second pass over "
                "the partial sums).")

    def nan_hint(case):
        # NaN at the graded size but not at a size no block overhangs: the tail reads past x.
        n, m = case.numel, _NO_TAIL
        at_n = probe(torch.ones(n))
        if n % m and probe(torch.ones(m)) == m and (at_n is None or math.isnan(at_n)):
            return (f"the sum of {n} ones is NaN, but {m} ones (a multiple of any block) sum right: the last "
                    "block reads past the end of x, where the grader puts NaN. Mask its loads: "
                    "tl.load(x_ptr + offs, mask=offs < n, other=0.0) in Triton, if (i < n) in CUDA and Numba.")
        return ("the sum is NaN, so the kernel used memory that nobody wrote: an accumulator made with "
                "torch.empty (use torch.zeros for an atomicAdd target); x past its end (the grader puts "
                "NaN there: is every load masked, idx < n?); a masked tl.load without other= (lanes where the mask "
                "is off are undefined, here NaN: tl.load(..., mask=mask, other=0.0)); or shared memory read before "
                "another thread wrote it (is a __syncthreads() missing after filling it and after each tree step?).")

    def diagnose(case, got, bad):
        x = case.values[0].double()
        n = x.numel()
        v = float(got.reshape(-1)[0])
        if math.isnan(v):
            return nan_hint(case)
        near = case.extra["scale"] / 4
        if abs(v) <= near:
            return ("the result is 0: nothing was added. Is the kernel launched with at least one block "
                    "(cdiv(n, BLOCK))?")
        # Which elements reached the result? Partial sums of random data can coincide, so ask the
        # kernel itself: summing ones counts the elements it adds, and ones on a prefix (or a
        # suffix) say which ones.
        count = probe(torch.ones(n))
        if count is not None and count == round(count) and 0 < count < n:
            k = int(count)
            if probe(torch.cat([torch.ones(k), torch.zeros(n - k)])) == k:
                return cut_hint(n, k)
            if probe(torch.cat([torch.zeros(n - k), torch.ones(k)])) == k:
                t = n - k
                return f"the result misses the first {t} element{'s' if t > 1 else ''}: an off-by-one in the index?"
        if count is not None and count == round(count) and count > n:
            return (f"summing {n} ones gave {int(count)}: some elements are added more than once. Does each "
                    "thread (or each grid-stride step) start at its own index, and is each block's partial "
                    "sum added exactly once (by one thread)?")
        prefix = torch.cumsum(x, 0)[:-1]          # prefix[k-1] = sum of the first k elements
        hits = torch.nonzero((prefix - v).abs() <= near).reshape(-1)
        if hits.numel():
            ks = [int(h) + 1 for h in hits.tolist()]
            k = ks[-1]
            if n - k >= k:
                # a block size is the likely cut; other hits are partial sums that match by chance
                pow2 = [c for c in ks if c >= 32 and c & (c - 1) == 0]
                k = pow2[0] if pow2 else k
            return cut_hint(n, k)
        suffix = torch.flip(torch.cumsum(torch.flip(x, (0,)), 0), (0,))[1:]   # suffix[t-1] = sum of x[t:]
        hits = torch.nonzero((suffix - v).abs() <= near).reshape(-1)
        if hits.numel():
            t = int(hits[0]) + 1
            return f"the result misses the first {t} element{'s' if t > 1 else ''}: an off-by-one in the index?"
        return ("the sum is off: in a shared-memory tree, is there a __syncthreads() after each step "
                "(a missing barrier lets a thread read a partial sum before it is written)? Is shared "
                "memory filled with 0 for threads past n? Are the block partial sums all added?")

    def unwritten_hint(case, mask, g):
        # The marker NaN can also arrive through a load past the end of x: ask which.
        hint = nan_hint(case)
        if "reads past the end" in hint:
            return hint
        return ("the result was never written (or an accumulator made with torch.empty was added to: "
                "use torch.zeros for an atomicAdd target).")

    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: (), scalar=True, tol_of=tol_of,
                       unwritten_hint=unwritten_hint,
                       diagnose=diagnose)
    success("check_sum", cases, worst, sizes_text(sizes))



def check_row_max(fn, *, seed=None):
    """``fn(x)`` must return the maximum of each row of a 2-D tensor: shape ``(rows,)``.

    Some rows are entirely negative (a running max started at 0 fails them), and the maximum
    is put in the last column of some rows (a loop that misses the tail fails them).
    """
    g = Grader("check_row_max", fn, seed)
    shapes = grader_shapes()
    kinds = [("mixed", 1.0, 0.0), ("all negative", 1.0, -50.0), ("max in the last column", 1.0, 0.0),
             ("large", 100.0, 0.0), ("max in the first column", 1.0, 0.0)]
    cases = []
    for x, labels in row_cases(g, shapes, kinds):
        for r, label in enumerate(labels):
            if label == "max in the last column":
                x[r, -1] = x[r].max() + 1.0
            elif label == "max in the first column":
                x[r, 0] = x[r].max() + 1.0
        c = Case(label_shape(tuple(x.shape)), (x,), row_max_ref64(x), extra=dict(labels=labels))
        cases.append(c)

    def diagnose(case, got, bad):
        x = case.values[0].double()
        labels = case.extra["labels"]
        bad_rows = [r for r in range(x.shape[0]) if bool(bad[r])]
        if bad_rows and all(float(x[r].max()) < 0 for r in bad_rows) and bool((got[bad] == 0).all()):
            return ("rows whose values are all negative came out as 0: start the running maximum at "
                    "-INFINITY (or the row's first element), and fill masked/past-the-end lanes with -inf, not 0.")
        if bad_rows and all(labels[r] == "max in the last column" for r in bad_rows):
            return ("only rows whose maximum is in the last column are wrong: does the loop cover the whole row "
                    "(its tail)?")
        if bad_rows and all(labels[r] == "max in the first column" for r in bad_rows):
            return "only rows whose maximum is in the first column are wrong: is column 0 skipped (off by one)?"
        if x.shape[0] > 1 and x.shape[1] > 1 and got.numel() == x.shape[0]:
            col = x.amax(dim=0)
            if col.numel() >= got.numel() and same(got, col[:got.numel()], atol=0, rtol=0):
                return "this looks like the maximum over dim 0 (down the columns): take it along each row."
        if bad_rows and all(bool((x[r] == got[r]).any()) and float(got[r]) < float(x[r].max()) for r in bad_rows):
            # each wrong row holds one of its own values: its elements were read, not all compared
            return ("each wrong row came out as one of its own values, but not the largest: some partial "
                    "maxima were lost. In a shared-memory tree, is there a __syncthreads() after filling "
                    "shared memory and after each step (without it a thread reads a slot before another "
                    "thread has written it)? Does every thread's loop cover its share of the columns?")
        return ("is every row handled by its own block/program (row = blockIdx.x), and does each row start at "
                "x + row * n_cols?")

    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=lambda c, m, g: ("these rows' results were never written: is there one block "
                                                 "(or program) per row, and does the grid have rows blocks?"),
                       diagnose=diagnose)
    success("check_row_max", cases, worst, shapes_text(shapes))


SPEC = Spec(
    name="reduction", title="Sum", lesson="04_reduction",
    reference=sum_ref64, make_input=sum_input, tolerance=sum_tol,
    nbytes=lambda shape: FLOAT * numel(shape) + FLOAT,   # every element read, one float written
    scalar_output=True,
    checks={"check_sum": check_sum, "check_row_max": check_row_max},
    baselines=[Baseline("torch", "eager", "torch.sum", eager(torch.sum)),
               Baseline("torch.compile", "compile", "torch.compile(torch.sum)", compiled(torch.sum))],
    targets=[Target("cuda", "copy", 0.93), Target("triton", "copy", 0.93)],
)
