"""Pieces the graders of lesson 11's topics share (cross-entropy, embedding, AdamW, the
fusions): inputs of any dtype (int64 class indices, bfloat16 logits) inside guarded,
poisoned buffers. Their outputs (several tensors, a scalar, tensors updated in place) and
tolerances (a tensor: one allowed error per element) are the grading loop's
(``utils.grading.grade``). Their hints read what Triton's interpreter reports: a mask it
refuses (``MASK_DTYPE_HINT``) and the program and offset of an access out of bounds
(``fault_access``)."""
from __future__ import annotations

import re

import torch

from runtime.config import DEVICE

from ..grading import INPUT_GUARD_BITS, Case, _Guarded

#: The lesson that teaches these topics (its notebook is notebooks/<LESSON>.ipynb).
LESSON = "11_gpt"


def guarded(values: torch.Tensor):
    """``values`` (any dtype) copied into the middle of a guarded buffer on DEVICE: floats
    past the ends read NaN, integers a recognisable garbage value."""
    g = _Guarded(values.shape, values.dtype, DEVICE, INPUT_GUARD_BITS, "input")
    g.view.copy_(values)
    g.orig = values.detach().clone()
    return g.view, g


def maker(values):
    """A Case's ``make``: fresh guarded copies of ``values`` for every call (an in-place
    kernel may write over its inputs)."""
    def make():
        pairs = [guarded(v) for v in values]
        return tuple(p[0] for p in pairs), [p[1] for p in pairs]
    return make


def case(label, values, expected, kwargs=None, **extra):
    """A Case whose inputs keep their dtypes (``Case.values`` would all become float32);
    ``kwargs``: the keyword arguments of the call."""
    return Case(label, tuple(values), expected, make=maker(values), extra=extra, kwargs=kwargs)


#: Triton's interpreter refuses a mask made with ``&`` of a block of comparisons and a scalar one
#: ("mask has unsupported dtype": it gives the scalar comparison the type of the values compared),
#: which a GPU compiles. Both accept the forms below.
MASK_DTYPE_HINT = ("Triton's interpreter (simulation) refuses a mask that joins a block of comparisons and a "
                   "scalar one with &, such as (offs < cols) & counted with counted = t != -100 (a GPU compiles "
                   "it; (counted != 0) is refused too). Write the same mask a way both accept: "
                   "mask = tl.where(counted, offs < cols, False), or mask = offs < tl.where(counted, cols, 0).")

_FAULT = re.compile(r"program \((\d+), (\d+), \d+\) (loads|stores to|updates) (\w+) \+ (-?\d+) ")


def fault_access(text: str):
    """``(program (i, j), "loads" / "stores to" / "updates", pointer name, offset in elements)``
    of the out-of-bounds access that the Triton interpreter reported in ``text``, or None."""
    m = _FAULT.search(text)
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2))), m.group(3), m.group(4), int(m.group(5))
