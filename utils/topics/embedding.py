"""Token embedding (lesson 11): the forward gathers rows of the table, the backward scatters
the output's gradient back into them, adding into ``dweight`` (the LM head shares the table,
so its gradient is already there).

    forward:  out[i] = weight[ids[i]]
    backward: dweight[ids[i]] += dout[i]   for every token i

Token ids repeat, so two tokens add into one row of dweight: a plain ``+=`` races (the race
detectors report it in simulation; a GPU loses updates), atomics are right but not bitwise
reproducible, sorting the ids gives each row one owner and the same bits every run (v3), and
cutting long runs of one id into chunks joined in order keeps that without one block doing the
work of a frequent token alone (v4).
The topic's shape is (tokens, vocabulary, width); its reference is the backward.
"""
from __future__ import annotations

import torch

from runtime.config import DEVICE, SIMULATE

from ..grading import Grader, Output, grade, in_order, largest_first, randn, success
from . import _multi
from ._spec import FLOAT, Spec, Target, generator


def embedding_forward_ref64(ids, weight):
    return weight.double()[ids.long()]


def embedding_ref64(ids, dout, dweight):
    """The topic's reference, the backward: dweight + the scatter-add of dout, in float64."""
    d = dweight.shape[-1]
    return dweight.double().index_add(0, ids.reshape(-1).long(), dout.reshape(-1, d).double())


def embedding_input(shape, seed=0, device=None):
    """(ids, dout, dweight) for (tokens, vocabulary, width): ids drawn from the vocabulary
    (with repeats once tokens outnumber it), dweight nonzero, as after the tied LM head."""
    device = device or DEVICE
    g = generator(seed, device)
    n, vocab, dim = shape
    ids = torch.randint(0, vocab, (n,), generator=g, device=device)
    dout = torch.randn(n, dim, generator=g, device=device)
    dweight = torch.randn(vocab, dim, generator=g, device=device)
    return ids, dout, dweight


def embedding_tol(inputs, ref):
    """float32's tolerance, plus the rounding of a float32 sum of up to ``count`` terms."""
    ids, dout, dweight = inputs
    d = dweight.shape[-1]
    mags = dweight.double().abs().index_add(0, ids.reshape(-1).long(), dout.reshape(-1, d).double().abs())
    return 1e-5 + 1e-5 * ref.abs() + 4 * 2.0 ** -24 * mags


def embedding_bytes(shape) -> int:
    """Backward: read dout and the ids, read and write the rows of dweight the tokens touch."""
    n, vocab, dim = shape
    return FLOAT * n * dim + 8 * n + 2 * FLOAT * min(n, vocab) * dim


# ----------------------------------------------------------------------------------------
# Graders
# ----------------------------------------------------------------------------------------
def _shapes():
    # (tokens, vocabulary, width): one token; many repeats of few ids; a width that takes several
    # blocks of columns, with a tail past any power of two up to 128; more ids than tokens (most rows untouched)
    return [(1, 1, 1), (9, 3, 5), (40, 13, 37), (21, 50, 133)] if SIMULATE else \
        [(1, 1, 1), (9, 3, 5), (4096, 50, 768), (3000, 50304, 129)]


def _cases(g):
    cases = []
    for n, vocab, dim in _shapes():
        ids = torch.randint(0, vocab, (n,), generator=g.gen)
        dout = randn(g.gen, n, dim)
        dweight = randn(g.gen, vocab, dim)
        reps = int(n - ids.unique().numel())
        label = f"{n} tokens, a {vocab}x{dim} table" + (f" ({reps} repeated ids)" if reps else "")
        cases.append(_multi.case(label, (ids, dout, dweight), embedding_ref64(ids, dout, dweight)))
    return cases


_RACE_HINT = ("two tokens with the same id add into the same row of dweight: a plain += is a read, an add and "
              "a write, and two blocks (programs) can read the same old value, so one update is lost. Use an "
              "atomic add (atomicAdd, cuda.atomic.add, tl.atomic_add), or sort the ids so that each row of "
              "dweight has one owner that sums its tokens (deterministic).")


#: Where token i's gradient goes: what the hints about rows, positions and layouts say.
_ROW_MAJOR = ("Token i adds into row ids[i] of dweight (its id, loaded with tl.load(ids_ptr + i), not its position i), "
              "and dweight is row-major: its element (r, c) is at r * dim + c, so the row is dweight_ptr + "
              "ids[i] * dim + cols; token i's gradient is at dout_ptr + i * dim + cols.")


def _layout_hint(ids, dout, dweight, got, near):
    """The hint when dweight got the right additions in the wrong places: rows of positions, a
    column-major layout, or columns left out (the grid's tail), or None."""
    n, d = dout.shape
    v = dweight.shape[0]
    base, add = dweight.double(), dout.double()
    if n <= v and n > 1 and near(got, base.index_add(0, torch.arange(n), add)):
        return (f"rows 0..{n - 1} of dweight received the tokens' gradients in the tokens' order: the row is the "
                "token's position i, not its id. " + _ROW_MAJOR)
    cols = torch.arange(d)
    for stride, name in ((v, "the vocabulary size"), (d, "dim")):
        flat = (ids.long()[:, None] + cols[None, :] * stride).flatten()
        if d > 1 and int(flat.max()) < v * d and near(got, base.flatten().index_add(0, flat, add.flatten()).view(v, d)):
            return (f"the gradients were added column-major: element (r, c) at r + c * {stride} ({name}), the row and "
                    "the column in each other's place. " + _ROW_MAJOR)
    # the first columns right, the last ones untouched: the grid's second dimension rounded down
    right = base.index_add(0, ids.long(), add)
    cols_ok = ((got - right).abs() <= 1e-4 * (1 + right.abs())).all(dim=0)
    untouched = (got == base).all(dim=0)
    k = int(cols_ok.long().cumprod(0).sum())
    if k < d and bool(untouched[k:].all()):
        grid = ("the grid's second dimension must cover every column: triton.cdiv(dim, BLOCK) programs, with "
                "mask=cols < dim in the last one (dim // BLOCK leaves out the last dim % BLOCK columns, and all of "
                "them when dim < BLOCK).")
        if k == 0:
            return f"nothing was added into dweight (none of its {d} columns changed): is the kernel launched? " + grid
        last = "its last column was" if d - k == 1 else f"its last {d - k} columns were"
        return f"dweight is right in its first {k} columns, but {last} never added: " + grid
    return None


def _diagnose(c, got):
    ids, dout, dweight = c.values
    d = dweight.shape[-1]
    scatter = torch.zeros_like(dweight, dtype=torch.float64).index_add(0, ids.long(), dout.double())
    near = lambda a, b: bool(((a - b).abs() <= 1e-4 * (1 + b.abs())).all())  # noqa: E731
    if near(got, scatter):
        return ("dweight holds the scatter-add alone: its old values were overwritten. The backward must ADD "
                "into dweight (dweight[ids[i]] += dout[i]): the LM head shares this weight, and its gradient "
                "is already there (tied weights); zeroing is the caller's job, once per step.")
    layout = _layout_hint(ids, dout, dweight, got, near)
    if layout:
        return layout
    # one token's gradient per id (the last writer wins): the lost updates of a plain +=
    counts = torch.bincount(ids.long(), minlength=dweight.shape[0])
    repeated = counts > 1
    rows_ok = ((got - c.expected).abs() <= 1e-4 * (1 + c.expected.abs())).all(dim=1)
    if bool(repeated.any()) and bool(rows_ok[~repeated].all()) and not bool(rows_ok[repeated].all()):
        r = int(torch.nonzero(repeated & ~rows_ok)[0])
        return (f"the rows of ids that appear once are right, those of repeated ids are not (row {r}: id {r} "
                f"appears {int(counts[r])} times): updates were lost. " + _RACE_HINT)
    wrong = torch.nonzero(~rows_ok).flatten().tolist()
    if wrong and all(_partial_sum(got[r], dout.double()[ids.long() == r]) for r in wrong[:8]):
        r = wrong[0]
        return (f"row {r} of dweight (and every wrong row checked) holds a sum of some of its tokens' gradients and "
                "nothing of the value dweight held before: the update overwrote the row (a store, or an atomic "
                "exchange) instead of adding into it. Add into dweight (dweight[ids[i]] += dout[i], with an atomic "
                "add where several tokens or programs share a row).")
    touched = counts > 0
    if bool((~touched).any()) and not bool(rows_ok[~touched].all()):
        return "rows of dweight whose id appears in no token changed: only the rows of the ids given may change."
    del d
    return None


def _explain_error(c, text):
    """The hint for an access outside dweight or dout that the interpreter reported: the program
    (i, j) is token i, so the hint can say which row it should have touched."""
    if "mask has unsupported dtype" in text:
        return _multi.MASK_DTYPE_HINT
    access = _multi.fault_access(text)
    if access is None:
        return None
    (i, _), _, name, offset = access
    ids, dout, dweight = c.values
    v, d = dweight.shape
    if name.startswith("dweight") and i < ids.numel():
        row = int(ids[i])
        if i >= v and i * d <= offset < (i + 1) * d:
            return (f"program {i} added into row {i} of dweight, past its {v} rows: row {i} is the token's position, "
                    f"and its id is ids[{i}] = {row}. " + _ROW_MAJOR)
        for stride, what in ((d, "dim"), (v, "the vocabulary size")):
            if offset >= row and (offset - row) % stride == 0 and offset // d >= v:
                return (f"program {i} added into dweight_ptr + {offset} = ids[{i}] + {(offset - row) // stride} * "
                        f"{stride} ({what}): a column-major index, r + c * {stride}, the row and the column in each "
                        "other's place. " + _ROW_MAJOR)
    return _ROW_MAJOR


def _partial_sum(row, grads, most: int = 10) -> bool:
    """Whether ``row`` is the sum of a nonempty subset of ``grads`` (a few tokens' gradients) alone."""
    k = grads.shape[0]
    if k == 0 or k > most:
        return False
    for pick in range(1, 2 ** k):
        s = sum(grads[i] for i in range(k) if pick >> i & 1)
        if bool(((row - s).abs() <= 1e-4 * (1 + s.abs())).all()):
            return True
    return False


def check_embedding_backward(fn, *, seed=None):
    """``fn(ids, dout, dweight)`` must add the embedding's gradient into ``dweight`` in place,
    ``dweight[ids[i]] += dout[i]`` for every token i, and return dweight. ids are int64 (tokens,)
    with repeats, dout float32 (tokens, D), dweight float32 (V, D) and nonzero (tied weights)."""
    g = Grader("check_embedding_backward", fn, seed)
    cases = _cases(g)

    def unpack(run):
        out = run.out[0] if isinstance(run.out, (tuple, list)) and len(run.out) == 1 else run.out
        if out is None:
            g.fail("your function returned None: return dweight (the tensor you added into).")
        return (out,)

    def in_place(run):
        c, dweight_in, out = run.case, run.inputs[2], run.outputs["dweight"]
        if out.data_ptr() != dweight_in.data_ptr() and torch.equal(dweight_in.detach().cpu(), c.values[2]):
            g.fail("dweight itself was not changed: the gradient must be added into the dweight passed in "
                   "(in place), so that the tied LM head's gradient and the embedding's end up together.")

    def outputs(c):
        return [Output("dweight", c.expected, tol=embedding_tol(c.values, c.expected),
                       diagnose=lambda run, got, bad: _diagnose(run.case, got))]

    worst = grade(g, cases, outputs, inputs=("ids", "dout", "dweight"), written=("dweight",), unpack=unpack,
                  check=in_place, order=largest_first, race_hint=_RACE_HINT, race_report_hint=_RACE_HINT,
                  explain_error=_explain_error)
    success("check_embedding_backward", cases, worst,
            "shapes " + ", ".join(f"{n} tokens x {v}x{d}" for n, v, d in _shapes()))


def check_embedding(fn, *, seed=None):
    """``fn(ids, weight)`` must return ``weight[ids]``: for each token its row of the table,
    shape ``ids.shape + (D,)``."""
    g = Grader("check_embedding", fn, seed)
    cases = []
    for n, vocab, dim in _shapes():
        ids = torch.randint(0, vocab, (n,), generator=g.gen)
        w = randn(g.gen, vocab, dim)
        cases.append(_multi.case(f"{n} tokens, a {vocab}x{dim} table", (ids, w), embedding_forward_ref64(ids, w)))

    def outputs(c):
        return [Output("out", c.expected, tol=0.0,
                       diagnose=lambda run, got, bad: "out[i] = weight[ids[i]]: the row of the table is the token's "
                                                      "id (ids[i]), not the token's position i; each row is D floats.")]

    worst = grade(g, cases, outputs, inputs=("ids", "weight"), order=in_order)
    success("check_embedding", cases, worst, "shapes " + ", ".join(f"{n} tokens x {v}x{d}" for n, v, d in _shapes()))


SPEC = Spec(
    name="embedding", title="Embedding backward (scatter-add)", lesson=_multi.LESSON,
    reference=embedding_ref64, make_input=embedding_input, nbytes=embedding_bytes,
    tolerance=embedding_tol, result_shape=lambda shape: (shape[1], shape[2]),
    checks={"check_embedding": check_embedding, "check_embedding_backward": check_embedding_backward},
    torch_ops_allowed=("sort",),
    main_shapes=lambda sizes: [(16384, 50304, 768)] if not SIMULATE else [(64, 50, 32)],
    sweep_shapes=lambda sizes: [(16384, 50304, 768)] if not SIMULATE else [(64, 50, 32)],
    check_shapes=lambda sizes: [(1, 1, 1), (9, 3, 5), (40, 13, 70)],
)

#: The H100 goal (benchmarks/lessons/gpt_kernels.py): the deterministic backward (v4) at 16 x 1024
#: tokens of width 768 at least as fast as torch eager's embedding backward.
TARGETS = [Target("cuda", "torch", 1.0, shape=(16384, 50304, 768)),
           Target("triton", "torch", 1.0, shape=(16384, 50304, 768))]
