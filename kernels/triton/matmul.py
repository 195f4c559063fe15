"""Matrix multiplication C = A @ B in Triton, on tensor cores through ``tl.dot``.

Versions (``VERSIONS`` here, v2 and v3 in matmul_fp16.py; ``matmul`` is the reference of topic matmul):

    v1  fp32: tl.dot with exact fp32 products, autotuned tiles, grouped ordering
        matmul_fp32: float32 inputs, no TF32, float32 C
    v2  fp16/bf16 in, fp32 accumulate: tl.dot on tensor cores, autotuned tiles, grouped ordering
        matmul_fp16: the same kernel, C in the inputs' dtype like torch.mm (the sums are fp32,
        rounded once)
    v3  v2 persistent (a program per SM) with TMA tensor descriptors; unaligned rows copied aligned first
        matmul_tma: one program per SM walks the tiles and moves them with TMA tensor
        descriptors (``tl.make_tensor_descriptor``); operands whose rows are not 16-byte
        aligned are copied into aligned buffers first

One kernel serves both: a program computes a BLOCK_M x BLOCK_N tile of C, stepping along
K by BLOCK_K, and Triton turns ``tl.dot`` of two tiles into tensor-core instructions
(or FMAs for exact fp32). The tile sizes are autotuned on a GPU
(``runtime.triton_compat.autotune``: in simulation the first config runs, untimed).
The programs are numbered in GROUP_M-row groups ("grouped ordering"): programs that run
at the same time share rows of A and columns of B, which then stay in the L2 cache.
Strides are passed, so transposed or sliced inputs work without a copy.
"""
from __future__ import annotations

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import version_index
from kernels.frames.matmul import FP32, HALF, check_operands, matmul_ref  # noqa: F401  (shared rules, reference)
from runtime.backends.triton.compat import autotune

import triton
import triton.language as tl


def _configs(fp32: bool):
    """Configs to try on a GPU; the first is what simulation runs (small, so it is quick)."""
    small = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2)]
    if runtime.SIMULATE:
        return small
    if fp32:
        shapes = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                  (64, 64, 32, 4, 4), (128, 256, 16, 8, 3)]
    else:
        # the four fastest of a sweep on an H100 (4096^3 and 4095 x 4097 x 4093, fp16 and bf16)
        shapes = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 256, 32, 8, 4), (256, 128, 64, 8, 3)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for m, n, k, w, s in shapes] + small


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, EXACT_FP32: tl.constexpr):
    # Grouped ordering: walk the tiles of C column by column inside groups of GROUP_M rows of
    # tiles, so the programs in flight reuse a few rows of A and columns of B from L2.
    pid = tl.program_id(axis=0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 accumulation for every input dtype
    for k0 in range(0, K, BLOCK_K):
        # Masked loads: the edges of A and B read as 0, which adds nothing to the sums.
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)
        if EXACT_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")  # true fp32 products, no TF32
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    # The store converts to C's element type: fp32 stays, fp16/bf16 is rounded once here.
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


matmul_fp32_kernel = autotune(configs=_configs(True), key=["M", "N", "K"])(matmul_kernel)
matmul_fp16_kernel = autotune(configs=_configs(False), key=["M", "N", "K"])(matmul_kernel)


# ---------------------------------------------------------------------------------------
# v3: persistent + TMA. A tensor descriptor names a 2-D tensor (base, shape, strides) and a
# block shape; ``desc.load([row, col])`` asks the Tensor Memory Accelerator to copy that tile
# into shared memory: one instruction instead of a load per thread, the edges filled with 0
# by the hardware (no masks), the address arithmetic off the SMs. A persistent grid (one
# program per SM, each walking tiles pid, pid + #SMs, ...) starts each SM once and lets the
# next tile's loads overlap the last tile's epilogue.
def _tma_configs():
    small = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2)]
    if runtime.SIMULATE:
        return small
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": g}, num_warps=w, num_stages=st)
            for m, n, k, g, w, st in TMA_SHAPES]


#: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) tried by the autotuner on a GPU.
#: The fastest at 4096^3 on an H100 (fp16 and bf16: benchmarks/tune/layernorm_tune.py) first.
TMA_SHAPES = [(128, 256, 64, 16, 8, 3), (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4)]


@triton.jit
def _tile_of(tile, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_rows, (tile % per_group) // group_rows


@triton.jit
def matmul_tma_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_m * num_n, NUM_SMS):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])   # out-of-range parts read as 0
            b = b_desc.load([kt * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))  # clipped at the edges


matmul_tma_autotuned = autotune(configs=_tma_configs(), key=["M", "N", "K"])(matmul_tma_kernel)


def _tma_scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors a kernel builds on the device (``tl.make_tensor_descriptor``)."""
    return torch.empty(size, dtype=torch.int8, device=runtime.DEVICE)


if not runtime.SIMULATE and hasattr(triton, "set_allocator"):
    triton.set_allocator(_tma_scratch)


def tma_ok(*tensors) -> bool:
    """TMA needs a unit stride in the last dim, 16-byte aligned row strides and base addresses."""
    for t in tensors:
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return True


def _num_sms() -> int:
    if runtime.SIMULATE:
        return 4
    return torch.cuda.get_device_properties(runtime.DEVICE).multi_processor_count


def launch_tma(kern, a, b, c, M, N, K, **meta):
    """v3's kernel on checked operands (``kern``: the autotuned one, or the bare kernel with
    ``meta`` = BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)."""
    sms = _num_sms()

    def grid(m):
        return (min(sms, triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"])),)
    kern[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), NUM_SMS=sms, **meta)
    return c


def _check(a, b, op, dtypes):
    """Like the CUDA launchers' checks, but strided inputs are fine: Triton gets the strides."""
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.numel() and any(s < 0 for s in t.stride()):
            raise ValueError(f"{op}: {name} has a negative stride; pass {name}.contiguous()")
    check_operands(a, b, op=op, dtypes=dtypes)  # validates; its contiguous copies are not needed
    M, K = a.shape
    N = b.shape[1]
    # every element of C is written by the kernel, except when K == 0 (no kernel runs: C = 0)
    return M, N, K, (torch.empty if K else torch.zeros)((M, N), dtype=a.dtype, device=a.device)


def _launch(kern, a, b, c, M, N, K, exact):
    if c.numel() == 0 or K == 0:
        return c

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    kern[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
               EXACT_FP32=exact)
    return c


def matmul_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: float32 A and B, exact fp32 products and sums (``input_precision="ieee"``)."""
    M, N, K, c = _check(a, b, "matmul_fp32", FP32)
    return _launch(matmul_fp32_kernel, a, b, c, M, N, K, True)


def matmul_fp16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: float16 or bfloat16 A and B, C in the same dtype (fp32 accumulation on tensor cores)."""
    M, N, K, c = _check(a, b, "matmul_fp16", HALF)
    return _launch(matmul_fp16_kernel, a, b, c, M, N, K, False)


def aligned_empty(rows: int, cols: int, dtype, device) -> torch.Tensor:
    """A (rows, cols) view of a wider buffer whose rows start a multiple of 16 bytes apart, as
    TMA needs (a (4095, 4093) float16 matrix has rows 8186 bytes apart)."""
    step = 16 // torch.empty(0, dtype=dtype).element_size()
    return torch.empty(rows, (cols + step - 1) // step * step, dtype=dtype, device=device)[:, :cols]


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in an ``aligned_empty`` buffer."""
    view = aligned_empty(*t.shape, t.dtype, t.device)
    view.copy_(t)
    return view


def matmul_tma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: float16/bfloat16, persistent with TMA descriptors. Operands whose rows are not 16-byte
    aligned (K = 4093 in float16) are copied into aligned buffers first: the copies take far less
    time than unaligned loads cost the kernel, and the descriptors' shapes stay the true ones, so
    the padding is never read (TMA fills what lies past the shape with zeros)."""
    M, N, K, c = _check(a, b, "matmul_tma", HALF)
    if c.numel() == 0 or K == 0:
        return c
    if tma_ok(a, b, c):
        return launch_tma(matmul_tma_autotuned, a, b, c, M, N, K)
    a2 = a if tma_ok(a) else aligned_copy(a)
    b2 = b if tma_ok(b) else aligned_copy(b)
    c2 = c if tma_ok(c) else aligned_empty(M, N, c.dtype, c.device)
    launch_tma(matmul_tma_autotuned, a2, b2, c2, M, N, K)
    return c if c2 is c else c2.contiguous()


VERSIONS = version_index(__doc__, v1=matmul_fp32)
REFERENCE = "v1"
matmul = VERSIONS[REFERENCE][1]
#: The fp16/bf16 version is the topic matmul_fp16: kernels/triton/matmul_fp16.py.
