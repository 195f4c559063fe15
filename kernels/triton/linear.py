"""The model's matmuls in Triton: lesson 06's matmuls (v2 blocked, v3 persistent with TMA) with
what a GPT's layers need.

    linear(x, w, b=None, out=None)    out = x w^T + b, the bias added in the matmul's epilogue
    matmul_into(a, b, out, splits=None)
                                      out = a b into a given (possibly strided, float32) buffer,
                                      split along K when the tiles of out are too few to fill the GPU
    linear_into(a, b, out, bias, splits, tma)
                                      the same with no checks (for the training step's known shapes);
                                      by default the fastest of lesson 06's v3 (persistent, TMA, on
                                      the stored layouts: transposes read as stored) and the blocked
                                      kernel with a few splits, timed once for each problem

**The bias in the epilogue.** ``x w^T + b`` as a matmul, then a bias-add kernel, writes the
product and reads it back (2 x 2 bytes an element in bfloat16) only to add a vector. Here the
program adds ``b[col]`` to its fp32 accumulator before the one store.

**Split-K.** A weight's gradient ``dW = dY^T X`` of a 768 x 768 layer is a small matrix summed
over a long K (every token of the batch, 16384). With 128 x 128 tiles that is 36 programs for
132 SMs: three quarters of the GPU idle while each program walks 16384 / 64 = 256 steps. Split
K in ``splits`` ranges: grid (tiles, splits), program (t, s) sums its range into its own float32
slice of a workspace, and ``split_sum_kernel`` adds the slices into ``out``. Every sum is then
formed in a fixed order, so the result is the same on every run (atomic adds into ``out``
would not be: float addition is not associative).

**Which kernel.** By default (``splits=None``) each problem (shapes, strides, dtypes, bias)
is timed once on a GPU over the persistent TMA kernel, where TMA can read the operands, and
the blocked kernel with 1, 2, 4, 8 or ``splits_for`` splits; the fastest is kept in
``CHOICES``. In simulation the rule of ``_rule`` decides, untimed. The tiles are autotuned on
a GPU (in simulation the first, small config runs). Operands are float16 or bfloat16 (or
float32, exact products, blocked kernel only); strides are passed, so ``dY^T`` is read
without a copy; ``out`` may be any float dtype.
"""
from __future__ import annotations

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import sm_count
from kernels.frames.matmul import HALF, check_operands
from kernels.triton.matmul import TMA_SHAPES, _tile_of
from runtime.backends.triton.compat import autotune

import triton
import triton.language as tl

#: A split's K range is a multiple of this (so of every config's BLOCK_K), and at least it.
MIN_SPLIT_K = 32 if runtime.SIMULATE else 1024
#: Split until the grid has about this many programs an SM.
PROGRAMS_PER_SM = 2
#: The tile splits_for counts the tiles of C in (the configs' usual size).
SPLIT_TILE = 32 if runtime.SIMULATE else 128
SUM_BLOCK = 64 if runtime.SIMULATE else 1024


def _configs():
    small = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2)]
    if runtime.SIMULATE:
        return small
    shapes = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
              (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (64, 128, 64, 4, 4)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for m, n, k, w, s in shapes] + small


@triton.jit
def linear_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, K_SPLIT,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
                  HAS_BIAS: tl.constexpr, EXACT_FP32: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # the tile of C: lesson 06's grouped ordering
    pid = tl.program_id(axis=0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    # this program's range of K: [k_lo, k_hi)
    split = tl.program_id(axis=1)
    k_lo = split * K_SPLIT
    k_hi = min(K, k_lo + K_SPLIT)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = k_lo + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] + (k0 - k_lo) < k_hi), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] + (k0 - k_lo) < k_hi) & (rn[None, :] < N), other=0.0)
        if EXACT_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:  # the epilogue: the bias joins the fp32 sums before the one rounding
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + split.to(tl.int64) * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


linear_autotuned = autotune(configs=_configs(), key=["M", "N", "K", "K_SPLIT", "stride_am", "stride_bk", "HAS_BIAS"])(
    linear_kernel)


def _tma_configs():
    small = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2)]
    if runtime.SIMULATE:
        return small
    shapes = TMA_SHAPES + [(128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 4)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": g}, num_warps=w, num_stages=st)
            for m, n, k, g, w, st in shapes]


# Lesson 06's v3 (persistent, tiles moved by TMA) for the model's layouts. A descriptor needs
# the stored matrix (unit stride in its last dim), so a transposed operand (W^T in the forward,
# dY^T in a weight's gradient) is described as stored and its tile transposed in registers
# (``.T``): the tensor cores read either order from shared memory.
@triton.jit
def linear_tma_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_a, stride_b, stride_c,
                      A_T: tl.constexpr, B_T: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    if A_T:   # a is stored (K, M)
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[stride_a, 1], block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_T:   # b is stored (N, K), as nn.Linear stores a weight
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_m * num_n, NUM_SMS):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            if A_T:
                a = a_desc.load([kt * BLOCK_K, pid_m * BLOCK_M]).T
            else:
                a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            if B_T:
                b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K]).T
            else:
                b = b_desc.load([kt * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


linear_tma_autotuned = autotune(configs=_tma_configs(), key=["M", "N", "K", "A_T", "B_T", "HAS_BIAS"])(
    linear_tma_kernel)


def _stored(t):
    """(transposed?, row stride) of the matrix ``t`` views, if TMA can read it (unit stride in
    the stored last dim, 16-byte aligned rows and base), else None."""
    if t.stride(1) == 1 or t.shape[1] == 1:
        transposed, stride = False, t.stride(0)
    elif t.stride(0) == 1 or t.shape[0] == 1:
        transposed, stride = True, t.stride(1)
    else:
        return None
    if (stride * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return transposed, stride


def tma_layouts(a, b, out):
    """``(a's, b's)`` stored layouts when the TMA kernel can run ``out = a b``, else None."""
    if a.dtype not in HALF or out.stride(1) != 1 or (out.stride(0) * out.element_size()) % 16 \
            or out.data_ptr() % 16:
        return None
    la, lb = _stored(a), _stored(b)
    return (la, lb) if la and lb else None


@triton.jit
def split_sum_kernel(ws_ptr, out_ptr, SPLITS, M, N, stride_om, stride_on, BLOCK_SIZE: tl.constexpr):
    """out[m, n] = sum over s of ws[s, m, n], in the order s = 0, 1, ... (float32 sums)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < M * N
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    row, col = offs // N, offs % N
    tl.store(out_ptr + row * stride_om + col * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


def splits_for(M: int, N: int, K: int, sms: int | None = None) -> int:
    """How many K ranges: enough that the tiles (counted as SPLIT_TILE x SPLIT_TILE) times the
    splits give about ``PROGRAMS_PER_SM`` programs an SM, no range shorter than ``MIN_SPLIT_K``."""
    tiles = max(1, triton.cdiv(M, SPLIT_TILE) * triton.cdiv(N, SPLIT_TILE))
    want = triton.cdiv(PROGRAMS_PER_SM * (sms or sm_count()), tiles)
    return max(1, min(want, K // MIN_SPLIT_K))


def _check_out(out, M, N, op):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: out must be a tensor, got {type(out).__name__}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"{op}: out must have shape {(M, N)}, got {tuple(out.shape)}")
    if not out.dtype.is_floating_point:
        raise TypeError(f"{op}: out must be a float tensor, got {out.dtype}")


def _operands(a, b, op):
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.numel() and any(s < 0 for s in t.stride()):
            raise ValueError(f"{op}: {name} has a negative stride; pass {name}.contiguous()")
    check_operands(a, b, op=op, dtypes=HALF + (torch.float32,))  # validates; strided operands are fine here
    if a.device != b.device:
        raise ValueError(f"{op}: a is on {a.device} but b on {b.device}")
    return a.shape[0], b.shape[1], a.shape[1]


#: The method ``linear_into`` picked for each problem (shapes, strides, dtypes, bias): the
#: fastest candidate of one timing on a GPU, the rule of ``_rule`` in simulation.
CHOICES: dict = {}


def _capturing() -> bool:
    """Whether a CUDA Graph is being captured on the current stream (never in simulation)."""
    return not runtime.SIMULATE and torch.cuda.is_current_stream_capturing()


def _rule(a, b, out, splits):
    """The untimed choice: ``splits_for``'s splits, and TMA for one split where it can read."""
    M, K = a.shape
    splits = splits or splits_for(M, b.shape[1], K)
    return ("tma", 1) if splits == 1 and tma_layouts(a, b, out) else ("blocked", splits)


def _choose(a, b, out, bias):
    """Time every candidate once (each autotuned on its first call) and keep the fastest: the
    persistent TMA kernel where it can read, the blocked kernel with 1, 2, 4, 8 or ``splits_for``
    splits of K. Measured at GPT-2's shapes on an H200 (benchmarks/tune/gpt_launch_tune.py), no
    single rule wins: TMA is faster for most forward products and slower for 768 x 768 weights,
    split-K pays for some weight gradients only."""
    M, K = a.shape
    if runtime.SIMULATE:
        return _rule(a, b, out, None)
    from triton.testing import do_bench
    cands = [("tma", 1)] if tma_layouts(a, b, out) else []
    cands += [("blocked", s) for s in sorted({1, 2, 4, 8, splits_for(M, b.shape[1], K)})
              if s == 1 or K >= s * MIN_SPLIT_K]
    times = {}
    for method, splits in cands:
        def run(method=method, splits=splits):
            _run(a, b, out, bias, method, splits)
        run()
        times[(method, splits)] = do_bench(run, warmup=5, rep=20)
    return min(times, key=times.get)


def _run(a, b, out, bias, method, splits):
    M, K = a.shape
    N = b.shape[1]
    if method == "tma":
        (a_t, sa), (b_t, sb) = tma_layouts(a, b, out)
        sms = sm_count()

        def tma_grid(meta):
            return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)
        linear_tma_autotuned[tma_grid](a, b, out, bias if bias is not None else out, M, N, K, sa, sb, out.stride(0),
                                       A_T=a_t, B_T=b_t, HAS_BIAS=bias is not None, NUM_SMS=sms)
        return out
    k_split = triton.cdiv(triton.cdiv(K, splits), MIN_SPLIT_K) * MIN_SPLIT_K
    splits = triton.cdiv(K, k_split)
    target = out if splits == 1 else torch.empty(splits, M, N, dtype=torch.float32, device=out.device)
    strides = (0, *out.stride()) if splits == 1 else target.stride()

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), splits)
    linear_autotuned[grid](a, b, target, bias if bias is not None else target, M, N, K, k_split,
                           a.stride(0), a.stride(1), b.stride(0), b.stride(1), *strides,
                           HAS_BIAS=bias is not None, EXACT_FP32=a.dtype == torch.float32)
    if splits > 1:
        split_sum_kernel[(triton.cdiv(M * N, SUM_BLOCK),)](target, out, splits, M, N, out.stride(0), out.stride(1),
                                                           BLOCK_SIZE=SUM_BLOCK)
    return out


def linear_into(a, b, out, bias=None, splits=None, tma=None):
    """out = a b (+ bias) with no checks, for callers whose shapes are known (the training
    step): ``matmul_into`` and ``linear`` check, then call this. ``splits=None, tma=None``: the
    method picked for this problem (``CHOICES``, timed once on a GPU); ``tma=True``: the
    persistent TMA kernel (an error where it cannot read); otherwise the blocked kernel with
    ``splits`` splits of K (``None``: ``splits_for``)."""
    M, K = a.shape
    N = b.shape[1]
    if out.numel() == 0:
        return out
    if K == 0:
        return out.copy_(bias.expand(M, N)) if bias is not None else out.zero_()
    if tma:
        if splits not in (None, 1) or tma_layouts(a, b, out) is None:
            raise ValueError("linear_into: tma=True, but TMA cannot read these operands (half dtypes, one split, "
                             "a unit stride and 16-byte aligned rows)")
        return _run(a, b, out, bias, "tma", 1)
    if splits is None and tma is None:
        key = (M, N, K, a.stride(), b.stride(), out.stride(), a.dtype, out.dtype, bias is not None,
               a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0)
        choice = CHOICES.get(key)
        if choice is None and _capturing():
            choice = _rule(a, b, out, None)     # nothing can be timed while a CUDA Graph is captured: not kept
        elif choice is None:
            choice = CHOICES[key] = _choose(a, b, out, bias)
        return _run(a, b, out, bias, *choice)
    return _run(a, b, out, bias, "blocked", splits or splits_for(M, N, K))


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """out = a b (a (M, K), b (K, N), any strides; out (M, N) of any float dtype, written
    in place), split along K in ``splits`` ranges (``None``: the method ``linear_into`` picks)."""
    M, N, K = _operands(a, b, "matmul_into")
    _check_out(out, M, N, "matmul_into")
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"matmul_into: splits must be a positive int, got {splits!r}")
    return linear_into(a, b, out, None, splits)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """out = x w^T + b for x (M, K), w (N, K) as ``nn.Linear`` stores it, b (N,) or None;
    ``out`` (M, N) given or new in x's dtype. One kernel: the bias is added in the epilogue."""
    M, N, K = _operands(x, w.t() if isinstance(w, torch.Tensor) and w.dim() == 2 else w, "linear")
    if b is not None:
        if not isinstance(b, torch.Tensor) or tuple(b.shape) != (N,) or b.device != x.device:
            raise ValueError(f"linear: b must be a ({N},) tensor on {x.device}")
        if not b.dtype.is_floating_point:
            raise TypeError(f"linear: b must be a float tensor, got {b.dtype}")
        if b.stride(0) != 1:
            b = b.contiguous()
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _check_out(out, M, N, "linear")
    return linear_into(x, w.t(), out, b)


def linear_ref(x, w, b=None):
    """x w^T + b in float64."""
    y = x.double() @ w.double().t()
    return y if b is None else y + b.double()
