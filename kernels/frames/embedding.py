"""Token embedding's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules,
what the forward and the backward launchers do around their kernels, v4's chunks and the PyTorch
references.

    check_ids, check_embedding_inputs, check_embedding_backward_inputs   the input rules
    forward_frame(ids, weight, launch)                 check, make out, launch unless there is nothing to gather
    backward_frame(ids, dout, dweight, launch[, sort]) check, launch (on the sorted ids), return dweight
    CHUNK, chunk_partials(sorted_ids, dim)             v4's chunks of sorted positions and their partials
    embedding_ref, embedding_forward_ref               torch's backward (index_add_) and forward

``ids`` are int64 of any shape; ``dout`` has shape ``ids.shape + (D,)``; the backward adds into
``dweight`` in place and returns it.
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv
from runtime.inputs import INT32_MAX, check_indices, check_input, check_tensor


def check_ids(ids, op):
    """The token ids checked, as a flat int64 tensor."""
    ids = check_indices(ids, "ids", op=op, what="token ids")
    if ids.numel() > INT32_MAX:
        raise ValueError(f"{op}: more than {INT32_MAX} ids: split them")
    return ids.reshape(-1)


def check_embedding_inputs(ids, weight, op="embedding"):
    """(flat ids, weight) checked: ids int64, weight a 2-D float32 table (V, D)."""
    flat = check_ids(ids, op)
    weight = check_input(weight, "weight", ndim=2, max_numel=INT32_MAX, op=op)
    return flat, weight


def check_embedding_backward_inputs(ids, dout, dweight, op="embedding_backward"):
    """(flat ids, dout as (N, D), dweight) checked. dweight is written in place, so it must be
    contiguous already (a copy would take the gradient away from the caller)."""
    flat = check_ids(ids, op)
    check_tensor(dweight, "dweight", op=op)
    if dweight.dim() != 2:
        raise ValueError(f"{op}: dweight must be 2-D (V, D), got shape {tuple(dweight.shape)}")
    if not dweight.is_contiguous():
        raise ValueError(f"{op}: dweight must be contiguous: the gradient is added into it in place "
                         "(a copy would not reach your tensor); pass dweight.contiguous() and use the result")
    dout = check_input(dout, "dout", op=op)
    want = tuple(ids.shape) + (dweight.shape[1],)
    if tuple(dout.shape) != want:
        raise ValueError(f"{op}: dout must have shape ids.shape + (D,) = {want}, got {tuple(dout.shape)}")
    return flat, dout.reshape(-1, dweight.shape[1]), dweight


#: Sorted positions per chunk of v4 (small in simulation, so that runs span chunks in the tests).
CHUNK = 4 if runtime.SIMULATE else 32


def forward_frame(ids, weight, launch):
    """What the forward launchers of the three languages do around their kernel: check the
    inputs, make ``out`` of shape ids.shape + (D,), call ``launch(flat_ids, weight, out)``
    unless there is nothing to gather, and return out."""
    flat, weight = check_embedding_inputs(ids, weight)
    out = torch.empty(tuple(ids.shape) + (weight.shape[1],), dtype=torch.float32, device=weight.device)
    if flat.numel() and weight.shape[1]:
        launch(flat, weight, out)
    return out


def backward_frame(ids, dout, dweight, launch, *, sort=False):
    """What the backward launchers of the three languages do around their kernels: check the
    inputs, call ``launch(flat_ids, dout, dweight)`` unless there is nothing to add, with
    ``sort`` ``launch(sorted_ids, perm, dout, dweight)`` (a stable sort: the tokens of one id in
    their order), and return dweight, added into in place."""
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    if flat.numel() and dweight.shape[1]:
        if sort:
            launch(*torch.sort(flat, stable=True), dout, dweight)
        else:
            launch(flat, dout, dweight)
    return dweight


def chunk_partials(sorted_ids, dim):
    """(chunks, head, tail) of v4: the chunks of CHUNK sorted positions, and the (chunks, dim)
    float32 buffers of the pieces of runs that cross a chunk's start (head) and end (tail)."""
    chunks = cdiv(sorted_ids.numel(), CHUNK)
    head, tail = torch.empty(2, chunks, dim, dtype=torch.float32, device=sorted_ids.device)
    return chunks, head, tail


def embedding_ref(ids, dout, dweight):
    """torch's answer for the topic's reference (the backward): dweight + the scatter-add of dout."""
    d = dweight.shape[-1]
    return dweight.clone().index_add_(0, ids.reshape(-1).long(), dout.reshape(-1, d).to(dweight.dtype))


def embedding_forward_ref(ids, weight):
    return torch.nn.functional.embedding(ids, weight)
