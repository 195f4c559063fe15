"""Pieces the graders of lesson 11's topics share (cross-entropy, embedding, AdamW, the
fusions): inputs of any dtype (int64 class indices, bfloat16 logits) inside guarded,
poisoned buffers. Their outputs (several tensors, a scalar, tensors updated in place) and
tolerances (a tensor: one allowed error per element) are the grading loop's
(``utils.grading.grade``)."""
from __future__ import annotations

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
