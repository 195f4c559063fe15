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

import torch

import utils
from kernels._launch import cdiv, version_index
from kernels.cuda.embedding import (  # noqa: F401  (input rules and references, defined once)
    check_embedding_backward_inputs,
    check_embedding_inputs,
    embedding_forward_ref,
    embedding_ref,
)

from numba import cuda

THREADS = 64 if utils.SIMULATE else 256


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
    i = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    tok = ids[i]
    if c < dw.shape[1] and 0 <= tok < dw.shape[0]:
        dw[tok, c] += dout[i, c]


@cuda.jit
def embedding_backward_atomic_kernel(ids, dout, dw):
    """v2: an atomic add: every update lands."""
    i = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    tok = ids[i]
    if c < dw.shape[1] and 0 <= tok < dw.shape[0]:
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


@cuda.jit
def embedding_backward_chunk_kernel(sorted_ids, perm, dout, dw, head, tail, chunk):
    """v4, pass 1 (see embedding.cu): pieces of runs inside a chunk of sorted positions."""
    ch = cuda.blockIdx.x
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    n = sorted_ids.shape[0]
    if c >= dw.shape[1]:
        return
    cs = ch * chunk
    ce = min(cs + chunk, n)
    cont_prev = cs > 0 and sorted_ids[cs - 1] == sorted_ids[cs]
    cont_next = ce < n and sorted_ids[ce - 1] == sorted_ids[ce]
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
    if c >= dw.shape[1]:
        return
    cs = ch * chunk
    ce = min(cs + chunk, n)
    tok = sorted_ids[ce - 1]
    cont_prev = cs > 0 and sorted_ids[cs - 1] == sorted_ids[cs]
    cont_next = ce < n and sorted_ids[ce] == tok
    if not cont_next or (sorted_ids[cs] == tok and cont_prev):
        return
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
    return utils.to_numba(t)


def embedding(ids, weight):
    flat, weight = check_embedding_inputs(ids, weight)
    dim = weight.shape[1]
    out = torch.empty(tuple(ids.shape) + (dim,), dtype=torch.float32, device=weight.device)
    if flat.numel() and dim:
        embedding_kernel[(flat.numel(), cdiv(dim, THREADS)), THREADS](_nb(flat), _nb(weight),
                                                                     _nb(out.reshape(-1, dim)))
    return out


def _scatter(k, ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    dim = dweight.shape[1]
    if flat.numel() and dim:
        k[(flat.numel(), cdiv(dim, THREADS)), THREADS](_nb(flat), _nb(dout), _nb(dweight))
    return dweight


def embedding_backward_plain(ids, dout, dweight):
    return _scatter(embedding_backward_plain_kernel, ids, dout, dweight)


def embedding_backward_atomic(ids, dout, dweight):
    return _scatter(embedding_backward_atomic_kernel, ids, dout, dweight)


def embedding_backward_sorted(ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    dim = dweight.shape[1]
    if flat.numel() and dim:
        sorted_ids, perm = torch.sort(flat, stable=True)
        embedding_backward_sorted_kernel[(flat.numel(), cdiv(dim, THREADS)), THREADS](
            _nb(sorted_ids), _nb(perm), _nb(dout), _nb(dweight))
    return dweight


CHUNK = 4 if utils.SIMULATE else 32


def embedding_backward_chunked(ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    dim = dweight.shape[1]
    n = flat.numel()
    if n and dim:
        sorted_ids, perm = torch.sort(flat, stable=True)
        chunks = cdiv(n, CHUNK)
        head = torch.empty(chunks, dim, dtype=torch.float32, device=dweight.device)
        tail = torch.empty(chunks, dim, dtype=torch.float32, device=dweight.device)
        grid = (chunks, cdiv(dim, THREADS))
        embedding_backward_chunk_kernel[grid, THREADS](_nb(sorted_ids), _nb(perm), _nb(dout), _nb(dweight),
                                                       _nb(head), _nb(tail), CHUNK)
        embedding_backward_join_kernel[grid, THREADS](_nb(sorted_ids), _nb(head), _nb(tail), _nb(dweight), CHUNK)
    return dweight


VERSIONS = version_index(
    __doc__, v1=embedding_backward_plain, v2=embedding_backward_atomic, v3=embedding_backward_sorted,
    v4=embedding_backward_chunked)
REFERENCE = "v4"
embedding_backward = VERSIONS[REFERENCE][1]
