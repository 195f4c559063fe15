"""Matrix multiplication C = A @ B in Triton, on tensor cores through ``tl.dot``.

    matmul(a, b)          the reference of topic matmul (v1, float32)
    matmul_fp32(a, b)     v1: float32 inputs, exact fp32 products (no TF32), float32 C
    matmul_fp16(a, b)     v2: the same kernel with float16/bfloat16 inputs; C in the
                          inputs' dtype, like torch.mm (the sums are fp32, rounded once)

One kernel serves both: a program computes a BLOCK_M x BLOCK_N tile of C, stepping along
K by BLOCK_K, and Triton turns ``tl.dot`` of two tiles into tensor-core instructions
(or FMAs for exact fp32). The tile sizes are autotuned on a GPU
(``utils.triton_compat.autotune``: in simulation the first config runs, untimed).
The programs are numbered in GROUP_M-row groups ("grouped ordering"): programs that run
at the same time share rows of A and columns of B, which then stay in the L2 cache.
Strides are passed, so transposed or sliced inputs work without a copy.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

import utils  # configures the interpreter before triton loads
from kernels.cuda.matmul import HALF, check_operands, matmul_ref  # noqa: F401  (shared rules, reference)
from utils.backends.triton.compat import autotune

import triton
import triton.language as tl

FP32 = (torch.float32,)


def _configs(fp32: bool):
    """Configs to try on a GPU; the first is what simulation runs (small, so it is quick)."""
    small = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2)]
    if utils.SIMULATE:
        return small
    if fp32:
        shapes = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                  (64, 64, 32, 4, 4), (128, 256, 16, 8, 3)]
    else:
        shapes = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
                  (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 256, 32, 8, 4), (64, 64, 64, 4, 5),
                  (128, 256, 64, 8, 4), (256, 128, 64, 8, 4), (256, 256, 64, 8, 3), (128, 256, 128, 8, 3)]
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


def _check(a, b, op, dtypes):
    """Like the CUDA launchers' checks, but strided inputs are fine: Triton gets the strides."""
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.numel() and any(s < 0 for s in t.stride()):
            raise ValueError(f"{op}: {name} has a negative stride; pass {name}.contiguous()")
    check_operands(a, b, op=op, dtypes=dtypes)  # validates; its contiguous copies are not needed
    M, K = a.shape
    N = b.shape[1]
    return M, N, K, torch.zeros((M, N), dtype=a.dtype, device=a.device)


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


VERSIONS = OrderedDict(
    v1=("fp32: tl.dot with exact fp32 products, autotuned tiles, grouped ordering", matmul_fp32),
)
REFERENCE = "v1"
matmul = VERSIONS[REFERENCE][1]
#: The fp16/bf16 version is the topic matmul_fp16: kernels/triton/matmul_fp16.py.
