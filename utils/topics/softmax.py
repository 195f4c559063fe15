"""Row softmax (lesson 05): fusion, rows too long for one block, and the online softmax."""
from __future__ import annotations

import re

import torch

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    GradingError,
    grader_shapes,
    label_shape,
    row_cases,
    run_cases,
    same,
    shapes_text,
    success,
)
from ._spec import Baseline, Spec, Target, compiled, eager, elementwise_bytes, generator


def softmax_ref64(x):
    return torch.softmax(x.double(), dim=-1)


def softmax_input(shape, seed=0, device=None):
    # Each row shifted by up to +-200: exp() of such values overflows float32 (above 88.7),
    # so a softmax without max subtraction returns inf/nan and fails the check.
    from runtime.config import DEVICE
    device = device or DEVICE
    g = generator(seed, device)
    rows, cols = shape
    x = 4.0 * torch.randn(rows, cols, generator=g, device=device)
    x += 400.0 * (torch.rand(rows, 1, generator=g, device=device) - 0.5)
    return x


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _row_sweep(sizes, cols=4096):
    """The size sweep: ``n`` elements as rows of ``cols`` columns."""
    out = []
    for n in sizes.bench_sizes:
        shape = (max(1, int(n) // cols), cols)
        if shape not in out:
            out.append(shape)
    return out


def check_softmax(fn, *, seed=None):
    """``fn(x)`` must return ``softmax(x, dim=-1)`` of a 2-D float32 tensor.

    Rows of large magnitude (values near +-1000, or spread over hundreds) overflow ``exp``
    unless the row maximum is subtracted first.
    """
    g = Grader("check_softmax", fn, seed)
    shapes = grader_shapes()
    kinds = [("ordinary", 1.0, 0.0), ("spread 5", 5.0, 0.0), ("around 500", 1.0, 500.0),
             ("spread 300", 300.0, 0.0), ("around -1000", 2.0, -1000.0)]
    cases = []
    for x, labels in row_cases(g, shapes, kinds):
        c = Case(label_shape(tuple(x.shape)) + " (some rows with values in the hundreds)", (x,),
                  softmax_ref64(x), extra=dict(labels=labels))
        cases.append(c)

    def diagnose(case, got, bad):
        x = case.values[0].double()
        tol = _check.tolerance(torch.float32)
        labels = case.extra["labels"]
        nonfinite_rows = (~torch.isfinite(got)).any(dim=1)
        small = torch.tensor([labels[r] in ("ordinary", "spread 5") for r in range(x.shape[0])])
        if bool(nonfinite_rows.any()):
            rows = torch.nonzero(nonfinite_rows).reshape(-1).tolist()
            small_rows_right = not bool(bad[small].any())
            if small_rows_right and all(not bool(small[r]) for r in rows):
                return ("got inf/nan on rows with large values: subtract the row max before exp "
                        "(exp(1000) overflows float32; softmax(x) = softmax(x - max(x))).")
        if bool(torch.isnan(got).any()):
            hint = _nan_hint(fn)
            if hint:
                return hint
        if x.shape[0] > 1 and same(got, torch.softmax(x, dim=0), **tol):
            return "looks like softmax over dim 0 (down each column): softmax is over the last dim, along each row."
        sums = got.sum(dim=1)
        off = ~((sums - 1).abs() <= 1e-4)           # NaN sums count as off
        if bool(off.any()):
            finite_off = off & torch.isfinite(sums)
            r = int(torch.nonzero(finite_off if bool(finite_off.any()) else off)[0])
            return (f"rows do not sum to 1 (row {r} sums to {float(sums[r]):.6g}): is each row divided by the "
                    "sum over the whole row (every block/chunk of it)?")
        return "compare one row by hand: max, then exp(x - max), then divide by their sum."

    def unwritten_hint(case, mask, g=None):
        if mask.dim() == 2 and bool(mask.all(dim=1)[mask.any(dim=1)].all()):
            return ("whole rows were never written: softmax launches one program (one block) per row, so the "
                    "grid is the number of rows, grid = (rows,), not a count computed from the number of "
                    "elements (cdiv(numel, BLOCK)).")
        return None

    try:
        worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape, diagnose=diagnose,
                          unwritten_hint=unwritten_hint)
    except GradingError as e:
        text = _past_row_end(str(e))
        if text is None:
            raise
        raise GradingError(text) from None
    success("check_softmax", cases, worst, shapes_text(shapes))


def _nan_hint(fn):
    """NaN in the result: an unguarded -inf - (-inf) in an online softmax, or a masked load that
    gave the grader's NaN where its mask is off. A row that starts with a whole chunk of -inf
    (a valid input: those columns get probability 0), at a width of 128, tells them apart."""
    x = torch.randn(2, 128)
    x[:, :64] = float("-inf")
    try:
        from runtime.config import DEVICE
        got = fn(x.to(DEVICE)).detach().to("cpu", torch.float64)
        online = bool(torch.isnan(got).any())
    except Exception:
        return None
    if online:
        return ("NaN where a row starts with -inf: with m = -inf, exp(m - m_new) is exp(-inf - (-inf)) = "
                "exp(nan). Guard the -inf start (shift = tl.where(m_new == -inf, 0, m_new)) and leave lanes "
                "whose max is still -inf out of the sum.")
    return ("NaN in the result: a masked load without other= gives undefined values where the mask is "
            "off (here the grader's NaN marker), and one NaN spoils its row's max and sum. Load with "
            "other=float(\"-inf\") (tl.load(..., mask=mask, other=float(\"-inf\"))) so the lanes past the "
            "end drop out.")


def _past_row_end(text: str):
    """A race on an output element at the start of a row, between two blocks: the block of the
    row before wrote one past the end of its row (``c <= cols``). Returns the message with that
    hint, or None."""
    m = re.search(r"race on `\w+\[(\d+)\]` \(global memory\): thread \S+ of block \((\d+),", text)
    shape = re.search(r"on a (\d+)x(\d+) input", text)
    if not (m and shape):
        return None
    idx, cols = int(m.group(1)), int(shape.group(2))
    blocks = re.findall(r"of block \((\d+),", text)
    if idx % cols or len(set(blocks)) < 2:
        return None
    hint = (f"element {idx} is column 0 of row {idx // cols}, and the block of row {idx // cols - 1} wrote it too: "
            "a write past the end of a row (not a race to fix with atomics). The loop over a row's columns "
            "must stop at c < cols, not c <= cols.")
    # the race report's advice (atomics, a second kernel) is for blocks that share an element on purpose
    text = re.sub(r" Blocks run in any order.*?(?=\n)", "", text, count=1, flags=re.S)
    return re.sub(r"(?=\n\(Inputs came from seed)", lambda _: "\nHint: " + hint, text, count=1)


SPEC = Spec(
    name="softmax", title="Row softmax", lesson="05_softmax",
    reference=softmax_ref64, make_input=softmax_input, nbytes=elementwise_bytes,
    checks={"check_softmax": check_softmax},
    baselines=[Baseline("torch", "eager", "torch.softmax(x, dim=-1)", eager(_softmax)),
               Baseline("torch.compile", "compile", "torch.compile(torch.softmax)", compiled(_softmax))],
    baseline_label="torch.softmax",
    # At least torch's speed at every benchmark shape, and 2,200 GB/s at the widest rows.
    targets=[Target("cuda", "torch", 1.0), Target("triton", "torch", 1.0),
             Target("cuda", "gbps", 2200.0, shape=(1024, 65536)),
             Target("triton", "gbps", 2200.0, shape=(1024, 65536))],
    main_shapes=lambda sizes: [tuple(s) for s in sizes.softmax_bench_shapes],
    sweep_shapes=_row_sweep, sweep_label="elements, rows of 4096",
    check_shapes=lambda sizes: [tuple(s) for s in sizes.bench_check_shapes],
)
