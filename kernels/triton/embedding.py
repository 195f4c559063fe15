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

import runtime
from kernels._launch import version_index
from kernels.frames.embedding import CHUNK, backward_frame, chunk_partials, forward_frame

import triton
import triton.language as tl

#: Columns per program (GPT-2's 768 in one block on a GPU; smaller in simulation so that
#: a row takes several programs).
BLOCK_D = 32 if runtime.SIMULATE else 1024


def _block(dim):
    return min(BLOCK_D, triton.next_power_of_2(max(int(dim), 1)))


@triton.jit
def _token_block(ids_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    """Program (i, j) owns token i and its columns j * BLOCK_SIZE, ...: (i, cols, the token's id
    on every lane (a vector for the masks), the mask of the columns that lie in the row and in
    the table: an id outside [0, vocab) masks them all)."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tok = tl.load(ids_ptr + i) + 0 * cols
    return i, cols, tok, (cols < dim) & (tok >= 0) & (tok < vocab)


@triton.jit
def embedding_kernel(ids_ptr, w_ptr, out_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    i, cols, tok, mask = _token_block(ids_ptr, vocab, dim, BLOCK_SIZE)
    v = tl.load(w_ptr + tok * dim + cols, mask=mask, other=float("nan"))  # an id outside the table: NaN
    tl.store(out_ptr + i * dim + cols, v, mask=cols < dim)


@triton.jit
def embedding_position_kernel(ids_ptr, wte_ptr, wpe_ptr, out_ptr, vocab, dim, T, BLOCK_SIZE: tl.constexpr):
    """GPT's input: token i of a (B, T) batch gets wte[ids[i]] + wpe[i % T], summed in the
    tables' float32 and stored in out's dtype (one pass: no separate add of the positions)."""
    i, cols, tok, mask = _token_block(ids_ptr, vocab, dim, BLOCK_SIZE)
    v = tl.load(wte_ptr + tok * dim + cols, mask=mask, other=float("nan"))  # an id outside the table: NaN
    v += tl.load(wpe_ptr + (i % T) * dim + cols, mask=cols < dim, other=0.0)
    tl.store(out_ptr + i * dim + cols, v.to(out_ptr.dtype.element_ty), mask=cols < dim)


@triton.jit
def embedding_backward_plain_kernel(ids_ptr, dout_ptr, dw_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    """v1: load, add, store: two programs with one id race (one update is lost)."""
    i, cols, tok, mask = _token_block(ids_ptr, vocab, dim, BLOCK_SIZE)
    d = tl.load(dout_ptr + i * dim + cols, mask=mask, other=0.0)
    old = tl.load(dw_ptr + tok * dim + cols, mask=mask, other=0.0)
    tl.store(dw_ptr + tok * dim + cols, old + d, mask=mask)


@triton.jit
def embedding_backward_atomic_kernel(ids_ptr, dout_ptr, dw_ptr, vocab, dim, BLOCK_SIZE: tl.constexpr):
    """v2: an atomic add: every update lands."""
    i, cols, tok, mask = _token_block(ids_ptr, vocab, dim, BLOCK_SIZE)
    tl.atomic_add(dw_ptr + tok * dim + cols, tl.load(dout_ptr + i * dim + cols, mask=mask, other=0.0), mask=mask)


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


def _grid(tokens, dim):
    return tokens, triton.cdiv(dim, _block(dim))


def embedding(ids, weight):
    def launch(flat, weight, out):
        vocab, dim = weight.shape
        embedding_kernel[_grid(flat.numel(), dim)](flat, weight, out, vocab, dim, BLOCK_SIZE=_block(dim))
    return forward_frame(ids, weight, launch)


def _scatter(k, ids, dout, dweight):
    def launch(flat, dout, dweight):
        vocab, dim = dweight.shape
        k[_grid(flat.numel(), dim)](flat, dout, dweight, vocab, dim, BLOCK_SIZE=_block(dim))
    return backward_frame(ids, dout, dweight, launch)


def embedding_backward_plain(ids, dout, dweight):
    return _scatter(embedding_backward_plain_kernel, ids, dout, dweight)


def embedding_backward_atomic(ids, dout, dweight):
    return _scatter(embedding_backward_atomic_kernel, ids, dout, dweight)


def embedding_backward_sorted(ids, dout, dweight):
    def launch(sorted_ids, perm, dout, dweight):
        (vocab, dim), n = dweight.shape, sorted_ids.numel()
        embedding_backward_sorted_kernel[_grid(n, dim)](sorted_ids, perm, dout, dweight, n, vocab, dim,
                                                        BLOCK_SIZE=_block(dim))
    return backward_frame(ids, dout, dweight, launch, sort=True)


def embedding_backward_chunked(ids, dout, dweight):
    def launch(sorted_ids, perm, dout, dweight):
        (vocab, dim), n = dweight.shape, sorted_ids.numel()
        chunks, head, tail = chunk_partials(sorted_ids, dim)
        grid, b = _grid(chunks, dim), _block(dim)
        embedding_backward_chunk_kernel[grid](sorted_ids, perm, dout, dweight, head, tail, n, vocab, dim,
                                              CHUNK=CHUNK, BLOCK_SIZE=b)
        embedding_backward_join_kernel[grid](sorted_ids, head, tail, dweight, n, vocab, dim, CHUNK=CHUNK, BLOCK_SIZE=b)
    return backward_frame(ids, dout, dweight, launch, sort=True)


VERSIONS = version_index(
    __doc__, v1=embedding_backward_plain, v2=embedding_backward_atomic, v3=embedding_backward_sorted,
    v4=embedding_backward_chunked)
REFERENCE = "v4"
embedding_backward = VERSIONS[REFERENCE][1]
