"""Reductions in Triton: the sum of a vector, and the max of each row of a matrix.

A Triton program owns a whole block of elements, so a block's reduction is one call,
``tl.sum(x, axis=0)``: the compiler writes the warp shuffles and the shared memory. What
is left to us is the part across programs: atomics, or a second pass.

Versions of ``sum`` (``VERSIONS``; ``sum`` is the reference, v3):

    v1  tl.sum per program + tl.atomic_add (non-deterministic)
    v2  tl.sum per program, then a second pass over the partials (deterministic)
    v3  persistent grid-stride loop, vector accumulator, two passes (deterministic)

and ``row_max(x)``: the max of each row of a 2-D tensor, one program per row.
"""
from __future__ import annotations

import torch

import runtime  # noqa: F401  (configures the interpreter before triton loads)
from kernels._launch import version_index
from kernels.frames.reduction import num_blocks_grid_stride, row_max_frame, row_max_ref, sum_frame, sum_ref  # noqa: F401  (the references, defined once)

import triton
import triton.language as tl

BLOCK_SIZE = 1024        # elements per program and per loop step
PERSISTENT_BLOCK = 4096  # elements per loop step of the persistent version
FINAL_BLOCK = 1024       # the one program of the second pass sums up to this many partials per step



@triton.jit
def sum_atomic_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    """v1: each program sums its block, then adds it to out[0] with one atomic."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)  # 0 past the end: the identity of +
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


@triton.jit
def sum_partials_kernel(x_ptr, partials_ptr, n, BLOCK_SIZE: tl.constexpr):
    """v2, pass 1: each program writes its block's sum to partials[pid]; no atomics."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(partials_ptr + pid, tl.sum(x, axis=0))


@triton.jit
def sum_final_kernel(partials_ptr, out_ptr, m, BLOCK_SIZE: tl.constexpr):
    """Pass 2: one program sums the m partials, BLOCK_SIZE at a time, in a fixed order."""
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, m, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(partials_ptr + offsets, mask=offsets < m, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))


@triton.jit
def sum_persistent_kernel(x_ptr, partials_ptr, n, BLOCK_SIZE: tl.constexpr):
    """v3, pass 1: a few programs per SM, each looping over every num_programs-th block.

    The running sum stays a vector (one value per lane) until the end, so the loop has no
    cross-lane reduction at all: one tl.sum per program, one partial per program.
    """
    pid = tl.program_id(axis=0)
    nprog = tl.num_programs(axis=0)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(pid * BLOCK_SIZE, n, nprog * BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(partials_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def row_max_kernel(x_ptr, out_ptr, cols, stride_row, BLOCK_SIZE: tl.constexpr):
    """One program per row: a running max over BLOCK_SIZE columns at a time."""
    row = tl.program_id(axis=0).to(tl.int64)
    acc = tl.full([BLOCK_SIZE], float("-inf"), dtype=tl.float32)
    for start in range(0, cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        # -inf past the end: the identity of max.
        v = tl.load(x_ptr + row * stride_row + offsets, mask=offsets < cols, other=float("-inf"))
        acc = tl.maximum(acc, v)
    tl.store(out_ptr + row, tl.max(acc, axis=0))


def sum_atomic(x: torch.Tensor) -> torch.Tensor:
    """v1: tl.sum per program, then tl.atomic_add into out[0]."""
    def launch(x, out, n):
        sum_atomic_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return sum_frame(x, launch)


def _final(partials: torch.Tensor, out: torch.Tensor) -> None:
    sum_final_kernel[(1,)](partials, out, partials.numel(), BLOCK_SIZE=FINAL_BLOCK)


def sum_two_pass(x: torch.Tensor) -> torch.Tensor:
    """v2: one partial per program, then one program sums the partials (deterministic)."""
    def launch(x, out, n):
        blocks = triton.cdiv(n, BLOCK_SIZE)
        partials = torch.empty(blocks, dtype=torch.float32, device=x.device)
        sum_partials_kernel[(blocks,)](x, partials, n, BLOCK_SIZE=BLOCK_SIZE)
        _final(partials, out)
    return sum_frame(x, launch)


def sum_persistent(x: torch.Tensor) -> torch.Tensor:
    """v3: a grid of a few programs per SM looping over the data, then the second pass."""
    def launch(x, out, n):
        programs = num_blocks_grid_stride(n, PERSISTENT_BLOCK, per_thread=1)  # a few per SM, as CUDA C++'s v5
        partials = torch.empty(programs, dtype=torch.float32, device=x.device)
        sum_persistent_kernel[(programs,)](x, partials, n, BLOCK_SIZE=PERSISTENT_BLOCK, num_warps=8)
        _final(partials, out)
    return sum_frame(x, launch)


def row_max(x: torch.Tensor) -> torch.Tensor:
    """The max of each row of a 2-D tensor: shape (rows,). -inf for rows of length 0."""
    def launch(x, out, rows, cols):
        block = min(4096, triton.next_power_of_2(cols))
        row_max_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK_SIZE=block)
    return row_max_frame(x, launch)


VERSIONS = version_index(__doc__, v1=sum_atomic, v2=sum_two_pass, v3=sum_persistent)
REFERENCE = "v3"
sum = VERSIONS[REFERENCE][1]  # the topic's launcher is called sum
