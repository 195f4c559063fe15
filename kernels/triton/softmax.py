"""Softmax over the last dim of a 2-D tensor in Triton.

Versions (``VERSIONS``, naive to best):

    v1  naive: three kernels (max, exp-sum, normalize), x read 3 times      softmax_naive
    v2  fused: one program per row, the row in one block (rows <= 16384)    softmax_fused
    v3  online: per-lane running max + rescaled sum, then the output pass (any row length)
        softmax_online: a persistent grid of programs, each looping over rows
    v4  L2-resident online: one program per SM, evict_last then evict_first loads (any row length)
        softmax_l2: the row kept in L2 between its two reads
    v5  v2 for rows up to 16384 columns, v4 beyond                          softmax, the reference

Only ``tl.exp`` and friends are used: ``triton.language`` alone, no libdevice.
"""
from __future__ import annotations

import torch

import runtime  # noqa: F401  (configures the interpreter before triton loads)
from kernels._launch import sm_count, version_index
from kernels.frames.softmax import softmax_frame, softmax_ref  # noqa: F401  (the reference, defined once)
from kernels.triton.reduction import row_max_kernel

import triton
import triton.language as tl

#: The widest row v2 loads as one block. Past it the block no longer fits one program on
#: an H100 (at 65536 columns it cannot run at all), so long rows take the online version.
FUSED_MAX_COLS = 16384
#: Columns per loop step of the online version. 8192 with 16 warps: 16 values per thread
#: and per step, 32 KB in flight per program, one program per SM (see the kernel).
ONLINE_BLOCK = 8192
#: v4: columns per step and warps per program (one program per SM).
L2_BLOCK = 8192
L2_NUM_WARPS = 32
NAIVE_BLOCK = 1024



# ---------------------------------------------------------------------------------------
# v1, naive: three kernels, x read three times. The first is lesson 04's row_max_kernel
# (kernels/triton/reduction.py).
@triton.jit
def softmax_expsum_kernel(x_ptr, max_ptr, sum_ptr, cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    m = tl.load(max_ptr + row)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        v = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=float("-inf"))
        acc += tl.exp(v - m)  # exp(-inf) = 0 for the masked lanes
    tl.store(sum_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def softmax_normalize_kernel(x_ptr, max_ptr, sum_ptr, y_ptr, cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    block = tl.program_id(axis=1)
    offsets = block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < cols
    v = tl.load(x_ptr + row * cols + offsets, mask=mask)
    y = tl.exp(v - tl.load(max_ptr + row)) / tl.load(sum_ptr + row)
    tl.store(y_ptr + row * cols + offsets, y, mask=mask)


# ---------------------------------------------------------------------------------------
# v2, fused: one program per row. The row is loaded once into one block (registers), the
# max, the exps and the sum are computed on chip, and the result is stored once.
@triton.jit
def softmax_fused_kernel(x_ptr, y_ptr, cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)  # int64: row * cols can pass 2**31
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < cols
    # -inf past the end of the row: it cannot be the max, and exp(-inf) = 0 adds nothing.
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=float("-inf"))
    z = x - tl.max(x, axis=0)  # subtract the max: every exponent <= 0, no overflow
    num = tl.exp(z)
    y = num / tl.sum(num, axis=0)
    tl.store(y_ptr + row * cols + offsets, y, mask=mask)


# ---------------------------------------------------------------------------------------
# v3, online: the row in steps of BLOCK_SIZE columns.
# Pass 1 keeps a running max m and a running sum s of exp(x - m) PER LANE (vectors of
# BLOCK_SIZE): when a lane sees a larger value its sum is rescaled to the new max,
#     m' = max(m, v),  s' = s * exp(m - m') + exp(v - m').
# No cross-lane reduction happens inside the loop; the lanes are merged once at the end.
# Pass 2 walks the row backwards (the last steps read are the likeliest still in the L2
# cache) and writes exp(x - M) / S.
# The grid is persistent: about one program per SM, each looping over rows pid, pid +
# num_programs, ... Few rows in flight (132 x 256 KB at 65536 columns) fit in the 50 MB L2
# of an H100, so the second read of a row comes from the cache, not from memory.
@triton.jit
def online_row_stats(x_row, cols, BLOCK_SIZE: tl.constexpr, EVICTION: tl.constexpr):
    """Pass 1 over one row: its max and 1 / sum(exp(x - max)). ``EVICTION`` is the loads'
    L2 eviction policy ("" for the default)."""
    m = tl.full([BLOCK_SIZE], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        v = tl.load(x_row + offsets, mask=offsets < cols, other=float("-inf"), eviction_policy=EVICTION)
        m_new = tl.maximum(m, v)
        # A lane that has only seen -inf keeps m_new = -inf, and -inf - -inf is NaN:
        # shift by 0 there instead, so both exps below are exp(-inf) = 0.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.exp(v - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    # Every lane's sum rescaled to the row max; lanes that saw only -inf add nothing (and
    # must not compute exp(-inf - row_max) * 0 or, worse, exp(0 - row_max) * 0 = inf * 0).
    row_sum = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    return row_max, 1.0 / row_sum


@triton.jit
def softmax_online_kernel(x_ptr, y_ptr, rows, cols, BLOCK_SIZE: tl.constexpr):
    for row in range(tl.program_id(axis=0), rows, tl.num_programs(axis=0)):
        start_of_row = tl.cast(row, tl.int64) * cols  # int64: row * cols can pass 2**31
        x_row = x_ptr + start_of_row
        y_row = y_ptr + start_of_row
        row_max, inv = online_row_stats(x_row, cols, BLOCK_SIZE, "")
        num_steps = tl.cdiv(cols, BLOCK_SIZE)
        for k in range(0, num_steps):
            start = (num_steps - 1 - k) * BLOCK_SIZE  # backwards
            offsets = start + tl.arange(0, BLOCK_SIZE)
            mask = offsets < cols
            v = tl.load(x_row + offsets, mask=mask)
            tl.store(y_row + offsets, tl.exp(v - row_max) * inv, mask=mask)


# ---------------------------------------------------------------------------------------
# v4, L2-resident: Triton's answer to CUDA C++ v5, which keeps a long row on chip (registers
# and shared memory) so that it is read from DRAM once. A Triton program cannot choose
# where its values live, but it can say how long a load should stay in the L2 cache:
# * exactly one program per SM, so exactly one row per SM is in flight: 132 rows of 256 KB
#   (at 65536 columns) are 33 MB, inside the H100's 50 MB L2. Twice as many programs would
#   need up to 66 MB;
# * pass 1 (v3's running max and sum) loads with eviction_policy="evict_last": keep these lines;
# * pass 2 loads the same row with "evict_first" (this is its last use: make room for the
#   next row's lines) and stores the output.
# 32 warps of 8192 columns: 8 values per thread and step, many loads in flight per SM.
@triton.jit
def softmax_l2_kernel(x_ptr, y_ptr, rows, cols, BLOCK_SIZE: tl.constexpr):
    for row in range(tl.program_id(axis=0), rows, tl.num_programs(axis=0)):
        start_of_row = tl.cast(row, tl.int64) * cols  # int64: row * cols can pass 2**31
        x_row = x_ptr + start_of_row
        y_row = y_ptr + start_of_row
        row_max, inv = online_row_stats(x_row, cols, BLOCK_SIZE, "evict_last")
        for start in range(0, cols, BLOCK_SIZE):
            offsets = start + tl.arange(0, BLOCK_SIZE)
            mask = offsets < cols
            v = tl.load(x_row + offsets, mask=mask, eviction_policy="evict_first")
            tl.store(y_row + offsets, tl.exp(v - row_max) * inv, mask=mask)


# ---------------------------------------------------------------------------------------
def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """v1: three kernels."""
    def launch(x, y, rows, cols):
        block = min(NAIVE_BLOCK, triton.next_power_of_2(cols))
        row_max = torch.empty(rows, dtype=torch.float32, device=x.device)
        row_sum = torch.empty(rows, dtype=torch.float32, device=x.device)
        row_max_kernel[(rows,)](x, row_max, cols, x.stride(0), BLOCK_SIZE=block)
        softmax_expsum_kernel[(rows,)](x, row_max, row_sum, cols, BLOCK_SIZE=block)
        softmax_normalize_kernel[(rows, triton.cdiv(cols, block))](x, row_max, row_sum, y, cols, BLOCK_SIZE=block)
    return softmax_frame(x, launch)


def fused_num_warps(block: int) -> int:
    """More warps for wider rows, so each thread holds at most about 32 of its values."""
    if block >= 16384:
        return 16
    if block >= 4096:
        return 8
    return 4


def softmax_fused(x: torch.Tensor) -> torch.Tensor:
    """v2: one program per row, one read and one write."""
    def launch(x, y, rows, cols):
        block = triton.next_power_of_2(cols)
        if block > FUSED_MAX_COLS:
            raise ValueError(
                f"a row of {cols} columns needs a block of {block} > {FUSED_MAX_COLS}, more than one "
                "program can hold: use the online softmax (v3) for long rows")
        softmax_fused_kernel[(rows,)](x, y, cols, BLOCK_SIZE=block, num_warps=fused_num_warps(block))
    return softmax_frame(x, launch)


def softmax_online(x: torch.Tensor) -> torch.Tensor:
    """v3: online softmax, any row length: the statistics pass, then the output pass."""
    def launch(x, y, rows, cols):
        block = min(ONLINE_BLOCK, triton.next_power_of_2(cols))
        num_warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
        # Persistent: about 512 threads per SM (one program of 16 warps for long rows).
        programs = min(rows, sm_count() * max(1, 16 // num_warps))
        softmax_online_kernel[(programs,)](x, y, rows, cols, BLOCK_SIZE=block, num_warps=num_warps)
    return softmax_frame(x, launch)


def softmax_l2(x: torch.Tensor) -> torch.Tensor:
    """v4: online softmax whose second read of each row comes from L2 (one program per SM)."""
    def launch(x, y, rows, cols):
        block = min(L2_BLOCK, triton.next_power_of_2(cols))
        # One program per SM and no more: the rows in flight must fit in L2 (see the kernel).
        softmax_l2_kernel[(min(rows, sm_count()),)](x, y, rows, cols, BLOCK_SIZE=block,
                                                    num_warps=L2_NUM_WARPS if block >= 8192 else 8)
    return softmax_frame(x, launch)


def softmax_auto(x: torch.Tensor) -> torch.Tensor:
    """The reference: v2 where the row fits one block, v4 beyond."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and triton.next_power_of_2(x.shape[-1]) > FUSED_MAX_COLS:
        return softmax_l2(x)
    return softmax_fused(x)


VERSIONS = version_index(__doc__, v1=softmax_naive, v2=softmax_fused, v3=softmax_online, v4=softmax_l2, v5=softmax_auto)
REFERENCE = "v5"
softmax = VERSIONS[REFERENCE][1]
