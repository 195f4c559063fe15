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

import runtime
from kernels._launch import cdiv, cuda_kernels, version_index
from kernels.frames.embedding import (  # the frame: input rules and references, shared by the three languages
    CHUNK,
    backward_frame,
    check_embedding_backward_inputs,  # noqa: F401  (importable from here too)
    check_embedding_inputs,  # noqa: F401
    check_ids,  # noqa: F401
    chunk_partials,
    embedding_forward_ref,  # noqa: F401
    embedding_ref,  # noqa: F401
    forward_frame,
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "embedding.cu"
THREADS = 64 if runtime.SIMULATE else 256


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


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
