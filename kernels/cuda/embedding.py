"""Token embedding in CUDA C++: launchers for ``embedding.cu``.

    embedding(ids, weight)                     the forward gather: out[..., :] = weight[ids[...], :]
    embedding_backward(ids, dout, dweight)     the reference backward (v4): dweight[ids[i]] += dout[i]
    embedding_backward_plain(...)              v1: `+=` in global memory: a race on repeated ids
    embedding_backward_atomic(...)             v2: atomicAdd: right, not bitwise reproducible
    embedding_backward_sorted(...)             v3: ids sorted, one owner per row: deterministic
    embedding_backward_chunked(...)            v4: v3 with long runs of one id split into chunks

The backward adds into ``dweight`` in place and returns it: with tied weights (the LM head
shares the embedding's table) both gradients must end up in the same tensor.
``ids`` are int64 of any shape; ``dout`` has shape ``ids.shape + (D,)``. An id outside
[0, V) gives a row of NaN in the forward and adds nothing in the backward.
"""
from __future__ import annotations

import functools

import torch

import runtime
from kernels._launch import cdiv, version_index
from runtime.inputs import INT32_MAX, check_indices, check_input, check_tensor

SOURCE = runtime.KERNELS_DIR / "cuda" / "embedding.cu"
THREADS = 64 if runtime.SIMULATE else 256


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return runtime.cuda_kernel(SOURCE, name)


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


def embedding(ids, weight):
    """out[..., :] = weight[ids[...], :]: one block per token, threads over the columns."""
    def launch(flat, weight, out):
        vocab, dim = weight.shape
        kernel("embedding_kernel")[(flat.numel(), cdiv(dim, THREADS)), THREADS](flat, weight, out, vocab, dim)
    return forward_frame(ids, weight, launch)


def _scatter(name, ids, dout, dweight):
    def launch(flat, dout, dweight):
        vocab, dim = dweight.shape
        kernel(name)[(flat.numel(), cdiv(dim, THREADS)), THREADS](flat, dout, dweight, vocab, dim)
    return backward_frame(ids, dout, dweight, launch)


def embedding_backward_plain(ids, dout, dweight):
    """v1: dweight[ids[i]] += dout[i] with a plain `+=`: two tokens of one id race."""
    return _scatter("embedding_backward_plain_kernel", ids, dout, dweight)


def embedding_backward_atomic(ids, dout, dweight):
    """v2: atomicAdd: every update lands, in an order that changes from run to run."""
    return _scatter("embedding_backward_atomic_kernel", ids, dout, dweight)


def embedding_backward_sorted(ids, dout, dweight):
    """v3: sort the ids (torch.sort, stable), then one block per position; the first position
    of each run of equal ids sums the run in order and adds it once: the same bits every run."""
    def launch(sorted_ids, perm, dout, dweight):
        (vocab, dim), n = dweight.shape, sorted_ids.numel()
        kernel("embedding_backward_sorted_kernel")[(n, cdiv(dim, THREADS)), THREADS](
            sorted_ids, perm, dout, dweight, n, vocab, dim)
    return backward_frame(ids, dout, dweight, launch, sort=True)


def embedding_backward_chunked(ids, dout, dweight):
    """v4: v3 with runs of equal ids cut into chunks (pass 1 sums the pieces, pass 2 joins the
    pieces of runs that span chunks, in order): deterministic, and a frequent id no longer makes
    one block add hundreds of rows alone."""
    def launch(sorted_ids, perm, dout, dweight):
        (vocab, dim), n = dweight.shape, sorted_ids.numel()
        chunks, head, tail = chunk_partials(sorted_ids, dim)
        grid = (chunks, cdiv(dim, THREADS))
        kernel("embedding_backward_chunk_kernel")[grid, THREADS](sorted_ids, perm, dout, dweight, head, tail, n,
                                                                 vocab, dim, CHUNK)
        kernel("embedding_backward_join_kernel")[grid, THREADS](sorted_ids, head, tail, dweight, n, vocab, dim, CHUNK)
    return backward_frame(ids, dout, dweight, launch, sort=True)


VERSIONS = version_index(
    SOURCE, v1=embedding_backward_plain, v2=embedding_backward_atomic, v3=embedding_backward_sorted,
    v4=embedding_backward_chunked)
REFERENCE = "v4"
embedding_backward = VERSIONS[REFERENCE][1]


def embedding_ref(ids, dout, dweight):
    """torch's answer for the topic's reference (the backward): dweight + the scatter-add of dout."""
    d = dweight.shape[-1]
    return dweight.clone().index_add_(0, ids.reshape(-1).long(), dout.reshape(-1, d).to(dweight.dtype))


def embedding_forward_ref(ids, weight):
    return torch.nn.functional.embedding(ids, weight)
