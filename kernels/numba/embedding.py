"""Token embedding in Numba (``numba.cuda.jit``): the forward gather and three backwards
(plain ``+=``, atomics, sorted and deterministic), as in ``kernels/cuda/embedding.cu``.
The backward adds into ``dweight`` in place (tied weights) and returns it.

Versions (``VERSIONS``, naive to best):

    v1  plain += into dweight: repeated ids race (lost updates on a GPU, reported in simulation)
    v2  atomic add into dweight: right, but the sums' order (and last bits) change between runs
    v3  ids sorted, one owner per row sums its tokens in order: deterministic, no atomics
    v4  v3 with long runs cut into chunks and joined in order: deterministic, balanced
"""
from __future__ import annotations

import math

import runtime
from kernels._launch import cdiv, version_index
from kernels.frames.embedding import CHUNK, backward_frame, chunk_partials, forward_frame

from numba import cuda

THREADS = 64 if runtime.SIMULATE else 256


@cuda.jit(device=True)
def token_column(ids, dw):
    """(i, c, id) of this thread: token i (a block each), column c of its row; id -1 where the
    column is past the row or the id outside [0, V) (nothing to add)."""
    i = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    tok = ids[i]
    if c >= dw.shape[1] or tok < 0 or tok >= dw.shape[0]:
        tok = -1
    return i, c, tok


@cuda.jit
def embedding_kernel(ids, w, out):
    i = cuda.blockIdx.x  # one block per token, threads over the columns
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if c >= w.shape[1]:
        return
    tok = ids[i]
    out[i, c] = w[tok, c] if 0 <= tok < w.shape[0] else math.nan


@cuda.jit
def embedding_backward_plain_kernel(ids, dout, dw):
    """v1: `+=` on global memory: two tokens with one id race (one update is lost)."""
    i, c, tok = token_column(ids, dw)
    if tok >= 0:
        dw[tok, c] += dout[i, c]


@cuda.jit
def embedding_backward_atomic_kernel(ids, dout, dw):
    """v2: an atomic add: every update lands."""
    i, c, tok = token_column(ids, dw)
    if tok >= 0:
        cuda.atomic.add(dw, (tok, c), dout[i, c])


@cuda.jit
def embedding_backward_sorted_kernel(sorted_ids, perm, dout, dw):
    """v3: the first position of each run of equal (sorted) ids sums the run in order."""
    p = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    tok = sorted_ids[p]
    if p > 0 and sorted_ids[p - 1] == tok:
        return
    if c >= dw.shape[1] or tok < 0 or tok >= dw.shape[0]:
        return
    acc = 0.0
    j = p
    while j < sorted_ids.shape[0] and sorted_ids[j] == tok:
        acc += dout[perm[j], c]
        j += 1
    dw[tok, c] += acc


@cuda.jit(device=True)
def chunk_span(sorted_ids, ch, chunk):
    """Chunk ch of the sorted positions, [cs, ce), and whether its first run began in the chunk
    before (cont_prev) and its last run goes on into the next one (cont_next)."""
    n = sorted_ids.shape[0]
    cs = ch * chunk
    ce = min(cs + chunk, n)
    return cs, ce, cs > 0 and sorted_ids[cs - 1] == sorted_ids[cs], ce < n and sorted_ids[ce - 1] == sorted_ids[ce]


@cuda.jit
def embedding_backward_chunk_kernel(sorted_ids, perm, dout, dw, head, tail, chunk):
    """v4, pass 1 (see embedding.cu): pieces of runs inside a chunk of sorted positions."""
    ch = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if c >= dw.shape[1]:
        return
    cs, ce, cont_prev, cont_next = chunk_span(sorted_ids, ch, chunk)
    acc = 0.0
    piece_start = cs
    for j in range(cs, ce):
        acc += dout[perm[j], c]
        if j + 1 < ce and sorted_ids[j + 1] == sorted_ids[j]:
            continue
        tok = sorted_ids[j]
        if piece_start == cs and cont_prev:
            head[ch, c] = acc
        elif j + 1 == ce and cont_next:
            tail[ch, c] = acc
        elif 0 <= tok < dw.shape[0]:
            dw[tok, c] += acc
        acc = 0.0
        piece_start = j + 1


@cuda.jit
def embedding_backward_join_kernel(sorted_ids, head, tail, dw, chunk):
    """v4, pass 2: the chunk whose tail starts a run adds the heads of the chunks it spans."""
    ch = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    n = sorted_ids.shape[0]
    cs, ce, cont_prev, cont_next = chunk_span(sorted_ids, ch, chunk)
    tok = sorted_ids[ce - 1]
    if c >= dw.shape[1] or not cont_next or (sorted_ids[cs] == tok and cont_prev):
        return  # no tail here, or a column past the row
    acc = tail[ch, c]
    k = ch + 1
    while True:
        acc += head[k, c]
        ks = k * chunk
        ke = min(ks + chunk, n)
        if not (sorted_ids[ks] == tok and ke < n and sorted_ids[ke] == tok):
            break
        k += 1
    if 0 <= tok < dw.shape[0]:
        dw[tok, c] += acc


def _nb(t):
    return runtime.to_numba(t)


def _grid(tokens, dim):
    return (tokens, cdiv(dim, THREADS)), THREADS


def embedding(ids, weight):
    def launch(flat, weight, out):
        dim = weight.shape[1]
        embedding_kernel[_grid(flat.numel(), dim)](_nb(flat), _nb(weight), _nb(out.reshape(-1, dim)))
    return forward_frame(ids, weight, launch)


def _scatter(k, ids, dout, dweight):
    def launch(flat, dout, dweight):
        k[_grid(flat.numel(), dweight.shape[1])](_nb(flat), _nb(dout), _nb(dweight))
    return backward_frame(ids, dout, dweight, launch)


def embedding_backward_plain(ids, dout, dweight):
    return _scatter(embedding_backward_plain_kernel, ids, dout, dweight)


def embedding_backward_atomic(ids, dout, dweight):
    return _scatter(embedding_backward_atomic_kernel, ids, dout, dweight)


def embedding_backward_sorted(ids, dout, dweight):
    def launch(sorted_ids, perm, dout, dweight):
        embedding_backward_sorted_kernel[_grid(sorted_ids.numel(), dweight.shape[1])](
            _nb(sorted_ids), _nb(perm), _nb(dout), _nb(dweight))
    return backward_frame(ids, dout, dweight, launch, sort=True)


def embedding_backward_chunked(ids, dout, dweight):
    def launch(sorted_ids, perm, dout, dweight):
        chunks, head, tail = chunk_partials(sorted_ids, dweight.shape[1])
        grid = _grid(chunks, dweight.shape[1])
        embedding_backward_chunk_kernel[grid](_nb(sorted_ids), _nb(perm), _nb(dout), _nb(dweight), _nb(head),
                                              _nb(tail), CHUNK)
        embedding_backward_join_kernel[grid](_nb(sorted_ids), _nb(head), _nb(tail), _nb(dweight), CHUNK)
    return backward_frame(ids, dout, dweight, launch, sort=True)


VERSIONS = version_index(
    __doc__, v1=embedding_backward_plain, v2=embedding_backward_atomic, v3=embedding_backward_sorted,
    v4=embedding_backward_chunked)
REFERENCE = "v4"
embedding_backward = VERSIONS[REFERENCE][1]
