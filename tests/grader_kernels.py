"""Right and wrong kernels that the grader tests run: the mistakes learners really make,
and right kernels written in unusual ways that the graders must still accept.

Each launcher follows the course convention: contiguous float32 tensors on
``utils.DEVICE`` in, a tensor out. Names say what the kernel does: ``*_ok`` kernels are
right, the others carry the mistake in their name.
"""
from __future__ import annotations

import math

import torch
from cuda_sources import TREE_SUM

import utils  # before numba/triton: picks the simulator or the GPU
from utils import to_numba

import triton
import triton.language as tl
from numba import cuda
from numba import float32 as numba_float32


# ======================================================================================
# Triton: elementwise
# ======================================================================================
@triton.jit
def nothing_kernel(x_ptr):
    """Launched beside values computed on the host: it does nothing."""
    pass


@triton.jit
def read_only_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Launched beside values computed on the host: it reads its input and stores nothing."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)


@triton.jit
def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def _relu_nomask_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # missing bounds check: the tail program loads and stores past n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0))


@triton.jit
def _relu_first_block_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # forgot program_id: every program redoes the first block
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def _relu_off_by_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # reads x[i + 1] for y[i]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs + 1, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def _relu_grid_stride_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # a fixed number of programs, each striding over the whole tensor
    start = tl.program_id(0) * BLOCK
    step = tl.num_programs(0) * BLOCK
    for base in range(start, n, step):
        offs = base + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def _relu_multi_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    # several blocks' worth of elements per program
    base = tl.program_id(0) * BLOCK * PER_PROGRAM
    for k in tl.static_range(PER_PROGRAM):
        offs = base + k * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


BLOCK = 256


def _elementwise(kernel, x, block=BLOCK, grid=None, **meta):
    """``y = kernel(x)``: a new y, one program per ``block`` elements unless ``grid`` is given."""
    y = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), block) if grid is None else grid,)](x, y, x.numel(), BLOCK=block, **meta)
    return y


def relu_ok(x):
    return _elementwise(_relu_kernel, x)


def relu_zeros_out_ok(x):
    """Right, with the output made by torch.zeros and written in place."""
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    _relu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def relu_two_launches_ok(x):
    """Right, the output written in two launches (the first half, then the rest)."""
    y = torch.empty_like(x)
    half = x.numel() // 2
    for lo, hi in ((0, half), (half, x.numel())):
        if hi > lo:
            _relu_kernel[(triton.cdiv(hi - lo, BLOCK),)](x[lo:hi], y[lo:hi], hi - lo, BLOCK=BLOCK)
    return y


def relu_half_on_host(x):
    """Wrong: the kernel writes the first half, the host the rest (a copy from a host buffer)."""
    y = torch.empty_like(x)
    half = x.numel() // 2
    if half:
        _relu_kernel[(triton.cdiv(half, BLOCK),)](x, y, half, BLOCK=BLOCK)
    rest = x[half:].detach().cpu().numpy().clip(min=0)
    y[half:].copy_(torch.from_numpy(rest))
    return y


def relu_python_loop(x):
    """Wrong: a kernel that only reads, and the values set one by one from Python."""
    y = torch.empty_like(x)
    read_only_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, x.numel(), BLOCK=BLOCK)
    for i, v in enumerate(x.tolist()):
        y[i] = max(v, 0.0)
    return y


def relu_nomask(x):
    return _elementwise(_relu_nomask_kernel, x)


def relu_first_block_only(x):
    return _elementwise(_relu_first_block_kernel, x)


def relu_no_pid_big_block(x):
    """Forgot pid * BLOCK, with a block of 1024: at n = 1025 only the last element is missing."""
    return _elementwise(_relu_first_block_kernel, x, block=1024)


def relu_grid_rounded_down(x):
    """Grid n // BLOCK: the tail block is never launched."""
    y = torch.empty_like(x)
    grid = x.numel() // BLOCK
    if grid:
        _relu_kernel[(grid,)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def relu_off_by_one(x):
    return _elementwise(_relu_off_by_one_kernel, x)


def relu_grid_stride_ok(x):
    return _elementwise(_relu_grid_stride_kernel, x, block=128, grid=2)


def relu_multi_ok(x):
    per = 4
    return _elementwise(_relu_multi_kernel, x, block=64, grid=triton.cdiv(x.numel(), 64 * per), PER_PROGRAM=per)


def relu_in_place(x):
    """Wrong: overwrites its input and returns it."""
    _relu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, x, x.numel(), BLOCK=BLOCK)
    return x


def relu_wrong_dtype(x):
    return relu_ok(x).double()


def relu_stub(x):
    raise NotImplementedError("not solved yet: launch relu_kernel over every element of x")


# -- ReLU backward ----------------------------------------------------------------------
@triton.jit
def _relu_backward_kernel(g_ptr, x_ptr, out_ptr, n, STRICT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask)
    x = tl.load(x_ptr + offs, mask=mask)
    if STRICT:
        keep = x > 0.0
    else:
        keep = x >= 0.0          # wrong at x == 0
    tl.store(out_ptr + offs, tl.where(keep, g, 0.0), mask=mask)


def relu_backward_ok(g, x):
    out = torch.empty_like(x)
    _relu_backward_kernel[(triton.cdiv(x.numel(), BLOCK),)](g, x, out, x.numel(), STRICT=True, BLOCK=BLOCK)
    return out


def relu_backward_ge(g, x):
    out = torch.empty_like(x)
    _relu_backward_kernel[(triton.cdiv(x.numel(), BLOCK),)](g, x, out, x.numel(), STRICT=False, BLOCK=BLOCK)
    return out


# -- add, 1-D and 2-D -------------------------------------------------------------------
@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add_ok(x, y):
    out = torch.empty_like(x)
    _add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


@triton.jit
def _add_2d_kernel(a_ptr, b_ptr, out_ptr, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    # a 2-D launch: axis 0 walks the columns, axis 1 the rows
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    r = tl.program_id(1) * BR + tl.arange(0, BR)
    idx = r[:, None] * cols + c[None, :]
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    tl.store(out_ptr + idx, tl.load(a_ptr + idx, mask=mask) + tl.load(b_ptr + idx, mask=mask), mask=mask)


def add_2d_ok(a, b):
    rows, cols = a.shape
    out = torch.empty_like(a)
    grid = (triton.cdiv(cols, 16), triton.cdiv(rows, 16))
    _add_2d_kernel[grid](a, b, out, rows, cols, BR=16, BC=16)
    return out


def add_2d_swapped(a, b):
    """The grid is sized for (columns, rows) but the kernel is told rows and cols the other
    way round for its axes: the classic 'blockIdx.x is the row' mix-up."""
    rows, cols = a.shape
    out = torch.empty_like(a)
    grid = (triton.cdiv(cols, 16), triton.cdiv(rows, 16))
    _add_2d_swapped_kernel[grid](a, b, out, rows, cols, BR=16, BC=16)
    return out


@triton.jit
def _add_2d_swapped_kernel(a_ptr, b_ptr, out_ptr, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)      # wrong: axis 0 was sized for columns
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    idx = r[:, None] * cols + c[None, :]
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    tl.store(out_ptr + idx, tl.load(a_ptr + idx, mask=mask) + tl.load(b_ptr + idx, mask=mask), mask=mask)


# -- ReLU over a pitched 2-D view -------------------------------------------------------
@triton.jit
def _relu_2d_kernel(x_ptr, y_ptr, rows, cols, x_row_stride, BC: tl.constexpr):
    # one program per row, looping over the row in BC-wide chunks
    r = tl.program_id(0)
    for start in range(0, cols, BC):
        c = start + tl.arange(0, BC)
        mask = c < cols
        x = tl.load(x_ptr + r * x_row_stride + c, mask=mask)
        tl.store(y_ptr + r * cols + c, tl.maximum(x, 0.0), mask=mask)


def relu_2d_ok(x):
    rows, cols = x.shape
    y = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if x.numel():
        _relu_2d_kernel[(rows,)](x, y, rows, cols, x.stride(0), BC=64)
    return y


def relu_2d_ignores_stride(x):
    rows, cols = x.shape
    y = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if x.numel():
        _relu_2d_kernel[(rows,)](x, y, rows, cols, cols, BC=64)   # wrong: assumes a packed matrix
    return y


# -- GELU -------------------------------------------------------------------------------
@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, FORM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if FORM == 0:      # tanh(u) = 1 - 2 / (exp(2u) + 1): finite for every u
        u = 0.79788456 * (x + 0.044715 * x * x * x)
        t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        y = 0.5 * x * (1.0 + t)
    elif FORM == 1:    # the source material's (exp(2u) - 1) / (exp(2u) + 1)
        u = 0.79788456 * (x + 0.044715 * x * x * x)
        e = tl.exp(2.0 * u)
        y = 0.5 * x * (1.0 + (e - 1.0) / (e + 1.0))
    elif FORM == 2:    # tanh through sigmoid: tanh(u) = 2 sigmoid(2u) - 1
        u = 0.79788456 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (2.0 * tl.sigmoid(2.0 * u))
    else:              # erf GELU: right function, wrong lesson
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


def _gelu(form):
    def launch(x):
        return _elementwise(_gelu_kernel, x, FORM=form)
    return launch


gelu_exp_ok = _gelu(0)
gelu_exp_ratio_ok = _gelu(1)
gelu_sigmoid_ok = _gelu(2)
gelu_erf = _gelu(3)


@triton.jit
def _gelu_fast_exp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    u = 0.79788456 * (x + 0.044715 * x * x * x)
    e = tl.exp2((2.0 * u) * 1.4426950408889634)
    wobble = tl.where(offs % 2 == 0, 1.0, -1.0)
    e = e * (1.0 + 4.76837158203125e-07 * wobble)  # 4 ulp of 1.0 (4 * 2**-23), alternating in sign
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + (1.0 - 2.0 / (e + 1.0))), mask=mask)


def gelu_fast_exp_ok(x):
    """tanh-GELU in float32 with a fast, slightly inexact exp: exp through exp2 (what
    ``__expf`` does on a GPU) with an error of 4 ulp added on purpose, more than
    ``ex2.approx.f32`` makes."""
    return _elementwise(_gelu_fast_exp_kernel, x)


# ======================================================================================
# Triton: reductions
# ======================================================================================
@triton.jit
def _sum_atomic_kernel(x_ptr, out_ptr, n, FIRST_ONLY: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    s = tl.sum(x, axis=0)
    if FIRST_ONLY:
        if pid == 0:             # wrong: the other blocks' partial sums are dropped
            tl.store(out_ptr, s)
    else:
        tl.atomic_add(out_ptr, s)


def sum_atomic_ok(x):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _sum_atomic_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), FIRST_ONLY=False, BLOCK=BLOCK)
    return out


def sum_first_block_only(x):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _sum_atomic_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), FIRST_ONLY=True, BLOCK=BLOCK)
    return out


def sum_misses_tail(x):
    """Grid rounded down: the last partial block is never summed."""
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    grid = x.numel() // 64
    if grid:
        _sum_atomic_kernel[(grid,)](x, out, x.numel(), FIRST_ONLY=False, BLOCK=64)
    return out


def sum_empty_accumulator(x):
    """Wrong: atomically adds into torch.empty (garbage), not torch.zeros."""
    out = torch.empty(1, dtype=torch.float32, device=x.device)
    _sum_atomic_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), FIRST_ONLY=False, BLOCK=BLOCK)
    return out


@triton.jit
def _partial_sums_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(part_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


def sum_two_pass_ok(x):
    """Right, without atomics: partial sums into a torch.empty buffer, then a second pass."""
    n = x.numel()
    parts = torch.empty(triton.cdiv(n, 64), dtype=torch.float32, device=x.device)
    _partial_sums_kernel[(parts.numel(),)](x, parts, n, BLOCK=64)
    while parts.numel() > 1:
        nxt = torch.empty(triton.cdiv(parts.numel(), 64), dtype=torch.float32, device=x.device)
        _partial_sums_kernel[(nxt.numel(),)](parts, nxt, parts.numel(), BLOCK=64)
        parts = nxt
    return parts.reshape(())


@triton.jit
def _sum_nomask_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)        # wrong: no mask, the tail block reads past the end of x
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


def sum_nomask(x):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _sum_nomask_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def sum_fixed_grid(x):
    """Wrong: 4 programs of 256 elements, one element per lane and no grid-stride loop, so
    elements past the first 1024 are never read (every block's sum is added, atomically)."""
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _sum_atomic_kernel[(4,)](x, out, x.numel(), FIRST_ONLY=False, BLOCK=256)
    return out


def sum_one_pass(x):
    """Wrong: one program sums one block of 1024 elements, whatever n is."""
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _sum_atomic_kernel[(1,)](x, out, x.numel(), FIRST_ONLY=False, BLOCK=1024)
    return out


# -- row max ----------------------------------------------------------------------------
@triton.jit
def _row_max_kernel(x_ptr, out_ptr, cols, OTHER: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0)
    acc = tl.full((BC,), OTHER, tl.float32)
    for start in range(0, cols, BC):
        c = start + tl.arange(0, BC)
        x = tl.load(x_ptr + r * cols + c, mask=c < cols, other=OTHER)
        acc = tl.maximum(acc, x)
    tl.store(out_ptr + r, tl.max(acc, axis=0))


def row_max_ok(x):
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _row_max_kernel[(x.shape[0],)](x, out, x.shape[1], OTHER=float("-inf"), BC=64)
    return out


def row_max_zero_init(x):
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _row_max_kernel[(x.shape[0],)](x, out, x.shape[1], OTHER=0.0, BC=64)
    return out


# -- softmax ----------------------------------------------------------------------------
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, cols, SUBTRACT_MAX: tl.constexpr, BC: tl.constexpr):
    # one row per program, the whole row in one block
    r = tl.program_id(0)
    c = tl.arange(0, BC)
    mask = c < cols
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=float("-inf"))
    if SUBTRACT_MAX:
        x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + r * cols + c, e / tl.sum(e, axis=0), mask=mask)


def softmax_ok(x):
    y = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], SUBTRACT_MAX=True, BC=triton.next_power_of_2(x.shape[1]))
    return y


def softmax_no_max(x):
    y = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], SUBTRACT_MAX=False, BC=triton.next_power_of_2(x.shape[1]))
    return y


@triton.jit
def _softmax_cols_kernel(x_ptr, y_ptr, rows, cols, BR: tl.constexpr):
    # wrong dim: one program per column, softmax down the column
    c = tl.program_id(0)
    r = tl.arange(0, BR)
    mask = r < rows
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=float("-inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + r * cols + c, e / tl.sum(e, axis=0), mask=mask)


def softmax_dim0(x):
    y = torch.empty_like(x)
    _softmax_cols_kernel[(x.shape[1],)](x, y, x.shape[0], x.shape[1], BR=triton.next_power_of_2(x.shape[0]))
    return y


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, cols, BC: tl.constexpr, FIRST_CHUNK_ONLY: tl.constexpr):
    # online softmax: running max and rescaled running sum over BC-wide chunks, then a
    # second pass that writes exp(x - max) / sum
    r = tl.program_id(0)
    m = tl.full((BC,), float("-inf"), tl.float32)
    s = tl.zeros((BC,), tl.float32)
    end = BC if FIRST_CHUNK_ONLY else cols
    for start in range(0, end, BC):
        c = start + tl.arange(0, BC)
        x = tl.load(x_ptr + r * cols + c, mask=c < cols, other=float("-inf"))
        m_new = tl.maximum(m, x)
        # lanes that have seen only -inf keep a zero sum (avoid exp(-inf - -inf) = nan)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        s = s * scale + tl.where(m_new == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for start in range(0, cols, BC):
        c = start + tl.arange(0, BC)
        x = tl.load(x_ptr + r * cols + c, mask=c < cols, other=float("-inf"))
        tl.store(y_ptr + r * cols + c, tl.exp(x - row_max) / total, mask=c < cols)


def softmax_online_ok(x):
    y = torch.empty_like(x)
    _softmax_online_kernel[(x.shape[0],)](x, y, x.shape[1], BC=32, FIRST_CHUNK_ONLY=False)
    return y


def softmax_first_chunk_sum(x):
    """Wrong: the statistics come from the first 32 columns only."""
    y = torch.empty_like(x)
    _softmax_online_kernel[(x.shape[0],)](x, y, x.shape[1], BC=32, FIRST_CHUNK_ONLY=True)
    return y


# ======================================================================================
# Numba (the CUDA simulator without a GPU)
# ======================================================================================
@cuda.jit
def _nb_relu_grid_stride(x, y):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.shape[0], step):
        y[i] = x[i] if x[i] > 0 else 0.0


@cuda.jit
def _nb_relu_nocheck(x, y):
    i = cuda.grid(1)
    y[i] = x[i] if x[i] > 0 else 0.0      # no `if i < n`: the tail block indexes past the end


def nb_relu_grid_stride_ok(x):
    y = torch.empty_like(x)
    _nb_relu_grid_stride[2, 64](to_numba(x), to_numba(y))
    return y


def nb_relu_device_arrays_ok(x):
    """Right, Numba's own way: device arrays in and out, the result copied back to the host."""
    d_x = cuda.to_device(x.detach().cpu().numpy())
    d_y = cuda.device_array_like(d_x)
    _nb_relu_grid_stride[2, 64](d_x, d_y)
    return torch.from_numpy(d_y.copy_to_host()).to(x.device)


def nb_relu_nocheck(x):
    y = torch.empty_like(x)
    n = x.numel()
    _nb_relu_nocheck[(n + 63) // 64, 64](to_numba(x), to_numba(y))
    return y


@cuda.jit
def _nb_add_2d(a, b, out):
    # a 2-D launch: cuda.grid(2) gives (x, y) = (row, col) here, matching the grid below
    r, c = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = a[r, c] + b[r, c]


def nb_add_2d_ok(a, b):
    out = torch.empty_like(a)
    rows, cols = a.shape
    _nb_add_2d[(math.ceil(rows / 8), math.ceil(cols / 8)), (8, 8)](to_numba(a), to_numba(b), to_numba(out))
    return out


NB_THREADS = 32


def _nb_block_sum_factory(with_barrier: bool):
    @cuda.jit
    def kernel(x, out):
        sh = cuda.shared.array(NB_THREADS, dtype=numba_float32)
        t = cuda.threadIdx.x
        acc = 0.0
        for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):   # grid-stride: any n
            acc += x[i]
        sh[t] = acc
        if with_barrier:
            cuda.syncthreads()
        s = NB_THREADS // 2
        while s > 0:
            if t < s:
                sh[t] += sh[t + s]
            if with_barrier:
                cuda.syncthreads()     # the next step reads what this step wrote
            s //= 2
        if t == 0:
            cuda.atomic.add(out, 0, sh[0])
    return kernel


_nb_sum_ok_kernel = _nb_block_sum_factory(True)
_nb_sum_nobarrier_kernel = _nb_block_sum_factory(False)


def nb_sum_ok(x):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _nb_sum_ok_kernel[2, NB_THREADS](to_numba(x), to_numba(out))
    return out


def nb_sum_no_barrier(x):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _nb_sum_nobarrier_kernel[2, NB_THREADS](to_numba(x), to_numba(out))
    return out


# ======================================================================================
# CUDA C++ through utils.cuda_kernel (the emulator without a GPU)
# ======================================================================================
CUDA_SOURCE = TREE_SUM + r"""
__global__ void relu_float4_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    // 16-byte loads for the bulk, one float at a time for the n % 4 tail
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int n4 = n / 4;
    if (i < n4) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        reinterpret_cast<float4*>(y)[i] = v;
    }
    int t = 4 * n4 + i;
    if (i < 4 && t < n) y[t] = fmaxf(x[t], 0.f);
}

__global__ void relu_float4_no_tail_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    // wrong: the n % 4 elements after the last full float4 are never handled
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 4) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        reinterpret_cast<float4*>(y)[i] = v;
    }
}

__global__ void relu_nocheck_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = fmaxf(x[i], 0.f);          // no bounds check
}

template <bool BARRIER>
__device__ void block_sum(const float* x, float* out, int n) {
    __shared__ float sh[256];
    int t = threadIdx.x;
    float acc = 0.f;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) acc += x[i];
    sh[t] = acc;
    if (BARRIER) __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        if (BARRIER) __syncthreads();   // the next step reads what this step wrote
    }
    if (t == 0) atomicAdd(out, sh[0]);
}

__global__ void relu_barrier_in_branch_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = fmaxf(x[i], 0.f);
        __syncthreads();              // wrong: threads past n never reach this barrier
    }
}

__global__ void sum_dynamic_kernel(const float* x, float* out, int n) {
    extern __shared__ float dyn[];
    float total = block_tree_sum(x, dyn, n);
    if (threadIdx.x == 0) atomicAdd(out, total);
}

template <bool BARRIER>
__device__ void block_row_max(const float* x, float* out, int cols) {
    __shared__ float sh[128];
    int t = threadIdx.x;
    const float* row = x + (long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = t; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    sh[t] = m;
    if (BARRIER) __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = fmaxf(sh[t], sh[t + s]);
        if (BARRIER) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

__global__ void row_max_kernel(const float* x, float* out, int cols) { block_row_max<true>(x, out, cols); }
__global__ void row_max_nobarrier_kernel(const float* x, float* out, int cols) { block_row_max<false>(x, out, cols); }

__global__ void sum_kernel(const float* x, float* out, int n) { block_sum<true>(x, out, n); }
__global__ void sum_nobarrier_kernel(const float* x, float* out, int n) { block_sum<false>(x, out, n); }
"""


# an exercise stub, as the exercise generator writes it (in its own source: the loader
# treats a source with a NOT_SOLVED_YET marker as unsolved)
CUDA_STUB_SOURCE = r"""
__global__ void relu_stub_kernel(const float* x, float* y, int n) {
    // TODO (about 2 lines): y[i] = max(x[i], 0) for every i < n
    NOT_SOLVED_YET;
}
"""


def have_cuda_kernel() -> bool:
    return getattr(utils, "cuda_kernel", None) is not None


_cuda_cache = {}


def _cu(name):
    if name not in _cuda_cache:
        _cuda_cache[name] = utils.cuda_kernel(CUDA_SOURCE, name)
    return _cuda_cache[name]


def _cu_elementwise(kernel, x, blocks=None):
    """``y = kernel(x, y, n)`` with 128 threads a block, one element each unless ``blocks`` is given."""
    y = torch.empty_like(x)
    n = x.numel()
    kernel[(n + 127) // 128 if blocks is None else blocks, 128](x, y, n)
    return y


def _cu_sum(name, x, blocks, threads, shared=0):
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _cu(name)[blocks, threads, shared](x, out, x.numel())
    return out


def _cu_row_max(name, x):
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _cu(name)[x.shape[0], 128](x, out, x.shape[1])
    return out


def cu_relu_float4_ok(x):
    return _cu_elementwise(_cu("relu_float4_kernel"), x, blocks=max(1, (x.numel() // 4 + 127) // 128))


def cu_relu_float4_no_tail(x):
    return _cu_elementwise(_cu("relu_float4_no_tail_kernel"), x, blocks=max(1, (x.numel() // 4 + 127) // 128))


def cu_relu_nocheck(x):
    return _cu_elementwise(_cu("relu_nocheck_kernel"), x)


def cu_sum_ok(x):
    return _cu_sum("sum_kernel", x, 4, 256)


def cu_sum_no_barrier(x):
    return _cu_sum("sum_nobarrier_kernel", x, 4, 256)


def cu_row_max_ok(x):
    return _cu_row_max("row_max_kernel", x)


def cu_row_max_no_barrier(x):
    return _cu_row_max("row_max_nobarrier_kernel", x)


def cu_sum_too_many_threads(x):
    return _cu_sum("sum_kernel", x, 4, 512)   # the kernel's shared array holds 256


def cu_sum_shared_bytes_in_elements(x):
    return _cu_sum("sum_dynamic_kernel", x, (x.numel() + 255) // 256, 256, shared=256)   # 256 floats need 1024 bytes


def cu_sum_dynamic_ok(x):
    return _cu_sum("sum_dynamic_kernel", x, (x.numel() + 255) // 256, 256, shared=256 * 4)


def cu_relu_barrier_in_branch(x):
    return _cu_elementwise(_cu("relu_barrier_in_branch_kernel"), x)


def cu_relu_stub(x):
    return _cu_elementwise(utils.cuda_kernel(CUDA_STUB_SOURCE, "relu_stub_kernel"), x)


@triton.jit
def relu_stub_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    # an exercise's stub: on a GPU the compile meets the raise, in the interpreter the run does
    raise NotImplementedError("not solved yet: write relu_kernel (about 5 lines)")


def relu_triton_stub(x):
    y = torch.empty_like(x)
    relu_stub_kernel[(1,)](x, y, x.numel(), BLOCK_SIZE=128)
    return y


# Lesson 12: a TMA transpose written another way than the exercise's (two boxes of 32 rows a
# block, one barrier each, and the 128-byte swizzle undone when the tile is read).
HOPPER_SOURCE = r"""
#include "hopper.h"

__global__ void tma_transpose_two_boxes_kernel(const TmaDescriptor* x_map, __nv_bfloat16* out_ptr, int R, int C) {
    __shared__ alignas(1024) __nv_bfloat16 tile[2][32 * 64];
    __shared__ uint64_t bar[2];
    int t = threadIdx.x, row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    if (t == 0) {
        mbarrier_init(&bar[0], 1);
        mbarrier_init(&bar[1], 1);
        fence_barrier_init();
        tma_acquire(x_map);
    }
    __syncthreads();
    if (t == 0)
        for (int h = 0; h < 2; ++h) {
            mbarrier_arrive_expect_tx(&bar[h], 32 * 64 * 2);
            tma_load_2d(tile[h], x_map, col0, row0 + 32 * h, &bar[h]);
        }
    for (int h = 0; h < 2; ++h) {
        mbarrier_wait(&bar[h], 0);
        for (int i = t; i < 32 * 64; i += blockDim.x) {
            int c = i / 32, r = i % 32;                       // 16-byte chunk c / 8 of row r lands at chunk
            int at = r * 64 + ((c / 8) ^ (r % 8)) * 8 + c % 8;  // (c / 8) ^ (r % 8): the 128-byte swizzle
            int row = row0 + 32 * h + r, col = col0 + c;
            if (row < R && col < C) out_ptr[(size_t)col * R + row] = tile[h][at];
        }
    }
}
"""


def cu_tma_transpose_ok(x):
    R, C = x.shape
    out = torch.empty(C, R, dtype=x.dtype, device=x.device)
    if out.numel():
        k = _cuda_cache.get("tma_transpose") or utils.cuda_kernel(HOPPER_SOURCE, "tma_transpose_two_boxes_kernel")
        _cuda_cache["tma_transpose"] = k
        k[((C + 63) // 64, (R + 63) // 64), 128](utils.tensor_map(x, 32, 64, swizzle=128), out, R, C)
    return out
