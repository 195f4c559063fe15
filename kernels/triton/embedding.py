"""Token embedding in Triton: the forward gather and three backwards (plain load-add-store,
atomics, sorted and deterministic), as in ``kernels/cuda/embedding.cu``. The backward adds
into ``dweight`` in place (tied weights) and returns it.

Versions (``VERSIONS``, naive to best):

    v1  load + add + store into dweight: repeated ids race (lost updates on a GPU, reported in simulation)
    v2  tl.atomic_add into dweight: right, but the sums' order (and last bits) change between runs
    v3  ids sorted, one owner per row sums its tokens in order: deterministic, no atomics
    v4  v3 with long runs cut into chunks and joined in order: deterministic, balanced
"""
from __future__ import annotations

import torch

import utils
from kernels._launch import version_index
from kernels.cuda.embedding import (  # noqa: F401  (input rules and references, defined once)
    check_embedding_backward_inputs,
    check_embedding_inputs,
    embedding_forward_ref,
    embedding_ref,
)

import triton
import triton.language as tl

#: Columns per program (GPT-2's 768 in one block on a GPU; smaller in simulation so that
#: a row takes several programs).
BLOCK_D = 32 if utils.SIMULATE else 1024


def _block(dim):
    return min(BLOCK_D, triton.next_power_of_2(max(int(dim), 1)))


@triton.jit
def embedding_kernel(ids_ptr, w_ptr, out_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tok = tl.load(ids_ptr + i) + 0 * cols  # the id, on every lane (a vector mask below)
    ok = (tok >= 0) & (tok < vocab)  # an id outside the table: a row of NaN, no stray read
    v = tl.load(w_ptr + tok * dim + cols, mask=(cols < dim) & ok, other=float("nan"))
    tl.store(out_ptr + i * dim + cols, v, mask=cols < dim)


@triton.jit
def embedding_backward_plain_kernel(ids_ptr, dout_ptr, dw_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    """v1: load, add, store: two programs with one id race (one update is lost)."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tok = tl.load(ids_ptr + i) + 0 * cols  # the id, on every lane
    mask = (cols < dim) & (tok >= 0) & (tok < vocab)
    d = tl.load(dout_ptr + i * dim + cols, mask=mask, other=0.0)
    old = tl.load(dw_ptr + tok * dim + cols, mask=mask, other=0.0)
    tl.store(dw_ptr + tok * dim + cols, old + d, mask=mask)


@triton.jit
def embedding_backward_atomic_kernel(ids_ptr, dout_ptr, dw_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    """v2: an atomic add: every update lands."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tok = tl.load(ids_ptr + i) + 0 * cols  # the id, on every lane
    mask = (cols < dim) & (tok >= 0) & (tok < vocab)
    d = tl.load(dout_ptr + i * dim + cols, mask=mask, other=0.0)
    tl.atomic_add(dw_ptr + tok * dim + cols, d, mask=mask)


@triton.jit
def embedding_backward_sorted_kernel(sorted_ptr, perm_ptr, dout_ptr, dw_ptr, n, vocab, dim,
                                     BLOCK_SIZE: tl.constexpr):
    """v3: the program of the first position of each run of equal (sorted) ids sums the run
    in order and adds it once; the other programs return at once."""
    p = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tok = tl.load(sorted_ptr + p)
    prev = tl.load(sorted_ptr + p - 1, mask=p > 0, other=-1)
    if ((p == 0) | (prev != tok)) & (tok >= 0) & (tok < vocab):  # (& and |: conditions on tensors)
        mask = cols < dim
        acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        j = p
        cur = tok
        while cur == tok:
            src = tl.load(perm_ptr + j)
            acc += tl.load(dout_ptr + src * dim + cols, mask=mask, other=0.0)
            j += 1
            cur = tl.load(sorted_ptr + j, mask=j < n, other=-1)
        old = tl.load(dw_ptr + tok * dim + cols, mask=mask, other=0.0)
        tl.store(dw_ptr + tok * dim + cols, old + acc, mask=mask)


# v4: v3 with runs of equal ids cut into chunks of CHUNK sorted positions (see embedding.cu).
@triton.jit
def embedding_backward_chunk_kernel(sorted_ptr, perm_ptr, dout_ptr, dw_ptr, head_ptr, tail_ptr, n, vocab, dim,
                                    CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Pass 1: each piece of a run inside the chunk summed in order; a whole run added to dweight,
    a piece continuing a run from before to head[chunk], one going on into the next to tail[chunk]."""
    ch = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    cmask = cols < dim
    cs = ch * CHUNK
    ce = tl.minimum(cs + CHUNK, n)
    cont_prev = (cs > 0) & (tl.load(sorted_ptr + cs - 1, mask=cs > 0, other=-1) == tl.load(sorted_ptr + cs))
    cont_next = (ce < n) & (tl.load(sorted_ptr + ce, mask=ce < n, other=-1) == tl.load(sorted_ptr + ce - 1))
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    piece_start = cs
    for j in range(cs, ce):
        acc += tl.load(dout_ptr + tl.load(perm_ptr + j) * dim + cols, mask=cmask, other=0.0)
        tok = tl.load(sorted_ptr + j)
        nxt = tl.load(sorted_ptr + j + 1, mask=j + 1 < ce, other=-1)
        if (j + 1 == ce) | (nxt != tok):  # the piece ends at j
            first = piece_start == cs
            last = j + 1 == ce
            if first & cont_prev:
                tl.store(head_ptr + ch * dim + cols, acc, mask=cmask)
            elif last & cont_next:
                tl.store(tail_ptr + ch * dim + cols, acc, mask=cmask)
            elif (tok >= 0) & (tok < vocab):
                old = tl.load(dw_ptr + tok * dim + cols, mask=cmask, other=0.0)
                tl.store(dw_ptr + tok * dim + cols, old + acc, mask=cmask)
            acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            piece_start = j + 1


@triton.jit
def embedding_backward_join_kernel(sorted_ptr, head_ptr, tail_ptr, dw_ptr, n, vocab, dim, CHUNK: tl.constexpr,
                                   BLOCK_SIZE: tl.constexpr):
    """Pass 2: the chunk whose tail starts a run adds the heads of the chunks it spans, in order."""
    ch = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    cmask = cols < dim
    cs = ch * CHUNK
    ce = tl.minimum(cs + CHUNK, n)
    tok = tl.load(sorted_ptr + ce - 1)
    cont_prev = (cs > 0) & (tl.load(sorted_ptr + cs - 1, mask=cs > 0, other=-1) == tl.load(sorted_ptr + cs))
    cont_next = (ce < n) & (tl.load(sorted_ptr + ce, mask=ce < n, other=-1) == tok)
    single = tl.load(sorted_ptr + cs) == tok
    if cont_next & ((single & cont_prev) == 0):
        acc = tl.load(tail_ptr + ch * dim + cols, mask=cmask, other=0.0)
        k = ch + 1
        going = tok == tok  # (a tensor from the start: a loop-carried value keeps its type)
        while going:
            acc += tl.load(head_ptr + k * dim + cols, mask=cmask, other=0.0)
            ks = k * CHUNK
            ke = tl.minimum(ks + CHUNK, n)
            k_next = (ke < n) & (tl.load(sorted_ptr + ke, mask=ke < n, other=-2) == tok)
            going = (tl.load(sorted_ptr + ks) == tok) & (tl.load(sorted_ptr + ke - 1) == tok) & k_next
            k += 1
        if (tok >= 0) & (tok < vocab):
            old = tl.load(dw_ptr + tok * dim + cols, mask=cmask, other=0.0)
            tl.store(dw_ptr + tok * dim + cols, old + acc, mask=cmask)


def embedding(ids, weight):
    flat, weight = check_embedding_inputs(ids, weight)
    vocab, dim = weight.shape
    out = torch.empty(tuple(ids.shape) + (dim,), dtype=torch.float32, device=weight.device)
    if flat.numel() and dim:
        b = _block(dim)
        embedding_kernel[(flat.numel(), triton.cdiv(dim, b))](flat, weight, out, vocab, dim, BLOCK_SIZE=b)
    return out


def _scatter(k, ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    vocab, dim = dweight.shape
    if flat.numel() and dim:
        b = _block(dim)
        k[(flat.numel(), triton.cdiv(dim, b))](flat, dout, dweight, vocab, dim, BLOCK_SIZE=b)
    return dweight


def embedding_backward_plain(ids, dout, dweight):
    return _scatter(embedding_backward_plain_kernel, ids, dout, dweight)


def embedding_backward_atomic(ids, dout, dweight):
    return _scatter(embedding_backward_atomic_kernel, ids, dout, dweight)


def embedding_backward_sorted(ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    vocab, dim = dweight.shape
    n = flat.numel()
    if n and dim:
        sorted_ids, perm = torch.sort(flat, stable=True)
        b = _block(dim)
        embedding_backward_sorted_kernel[(n, triton.cdiv(dim, b))](sorted_ids, perm, dout, dweight, n, vocab, dim,
                                                                   BLOCK_SIZE=b)
    return dweight


#: Sorted positions per chunk of v4 (small in simulation, so that runs span chunks in the tests).
CHUNK = 4 if utils.SIMULATE else 32


def embedding_backward_chunked(ids, dout, dweight):
    flat, dout, dweight = check_embedding_backward_inputs(ids, dout, dweight)
    vocab, dim = dweight.shape
    n = flat.numel()
    if n and dim:
        sorted_ids, perm = torch.sort(flat, stable=True)
        b = _block(dim)
        chunks = triton.cdiv(n, CHUNK)
        head = torch.empty(chunks, dim, dtype=torch.float32, device=dweight.device)
        tail = torch.empty(chunks, dim, dtype=torch.float32, device=dweight.device)
        grid = (chunks, triton.cdiv(dim, b))
        embedding_backward_chunk_kernel[grid](sorted_ids, perm, dout, dweight, head, tail, n, vocab, dim,
                                              CHUNK=CHUNK, BLOCK_SIZE=b)
        embedding_backward_join_kernel[grid](sorted_ids, head, tail, dweight, n, vocab, dim, CHUNK=CHUNK, BLOCK_SIZE=b)
    return dweight


VERSIONS = version_index(
    __doc__, v1=embedding_backward_plain, v2=embedding_backward_atomic, v3=embedding_backward_sorted,
    v4=embedding_backward_chunked)
REFERENCE = "v4"
embedding_backward = VERSIONS[REFERENCE][1]
