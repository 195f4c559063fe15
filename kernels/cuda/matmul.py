"""Matrix multiplication C = A @ B in CUDA C++: launchers for ``matmul.cu``, whose header lists
the versions.

    matmul(a, b)          the reference (v4): the fastest SIMT (CUDA-core) version, fp32
    matmul_naive(a, b)    v1
    matmul_tiled(a, b)    v2
    matmul_regtile(a, b)  v3
    matmul_vec4(a, b)     v4
    matmul_wmma(a, b)     v5, tensor cores: fp16 or bf16 in, fp32 out

A launcher takes A (M, K) and B (K, N) on ``runtime.DEVICE`` and returns a new float32 C
(M, N). Versions v1-v4 take float32 inputs; v5 takes float16 or bfloat16 and is also the
topic ``matmul_fp16`` (kernels/cuda/matmul_fp16.py), measured against torch.mm in fp16.
Non-contiguous inputs (a transposed view, a slice) are copied to contiguous ones.
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, cuda_source, version_index
from kernels.frames.matmul import (  # the frame: input rules and reference, shared by the three languages
    FP32,  # noqa: F401  (importable from here too)
    HALF,
    check_operands,  # noqa: F401
    matmul_ref,  # noqa: F401
    prepare_operands,
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "matmul.cu"


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str) -> str:
    """The text of one kernel or helper of matmul.cu (its comment block and body)."""
    return cuda_source(name, SOURCE)


def matmul_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element of C, blocks of 32 x 8 threads."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_naive")
    if c.numel() and K:
        kernel("matmul_naive_kernel")[(cdiv(N, 32), cdiv(M, 8)), (32, 8)](a, b, c, M, N, K)
    return c


TILE = 32


def matmul_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: TILE x TILE threads per block, tiles of A and B staged in shared memory."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_tiled")
    if c.numel() and K:
        kernel("matmul_tiled_kernel")[(cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE)](a, b, c, M, N, K)
    return c


def matmul_regtile(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: 128 x 128 tiles of C, 256 threads computing 8 x 8 outputs each."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_regtile")
    if c.numel() and K:
        kernel("matmul_regtile_kernel")[(cdiv(N, 128), cdiv(M, 128)), 256](a, b, c, M, N, K)
    return c


#: v4's kernels: name -> (BM, BN, threads). The first is the one the launcher uses (the
#: fastest on an H100; benchmarks/tune/matmul_tune.py compares them).
VEC4_KERNELS = {
    "matmul_vec4_kernel": (128, 64, 128),
    "matmul_vec4_128x128_kernel": (128, 128, 256),
    "matmul_vec4_bk16_kernel": (128, 64, 128),
    "matmul_vec4_64x64_kernel": (64, 64, 256),
}
VEC4_CONFIG = "matmul_vec4_kernel"


def vec4_ok(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> bool:
    """float4 access needs every row of A, B and C to start on a 16-byte boundary."""
    K, N = a.shape[1], b.shape[1]
    return K % 4 == 0 and N % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (a, b, c))


def matmul_vec4(a: torch.Tensor, b: torch.Tensor, config: str | None = None) -> torch.Tensor:
    """v4: float4 loads, A transposed in shared memory. Shapes with K or N not a multiple
    of 4 cannot use float4 rows: they run v3 instead."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_vec4")
    if not (c.numel() and K):
        return c
    if not vec4_ok(a, b, c):
        kernel("matmul_regtile_kernel")[(cdiv(N, 128), cdiv(M, 128)), 256](a, b, c, M, N, K)
        return c
    name = config or VEC4_CONFIG
    bm, bn, threads = VEC4_KERNELS[name]
    kernel(name)[(cdiv(N, bn), cdiv(M, bm)), threads](a, b, c, M, N, K)
    return c


WMMA_TILE = 64


def matmul_wmma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v5: tensor cores through nvcuda::wmma. A and B in float16 or bfloat16, C in float32
    (fp32 accumulation). 64 x 64 tiles of C, 4 warps per block."""
    a, b, c, M, N, K = prepare_operands(a, b, "matmul_wmma", HALF)
    if not (c.numel() and K):
        return c
    vec8 = int(K % 8 == 0 and N % 8 == 0 and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)
    name = "matmul_wmma_kernel" if a.dtype == torch.float16 else "matmul_wmma_bf16_kernel"
    kernel(name)[(cdiv(N, WMMA_TILE), cdiv(M, WMMA_TILE)), 128](a, b, c, M, N, K, vec8)
    return c


VERSIONS = version_index(SOURCE, v1=matmul_naive, v2=matmul_tiled, v3=matmul_regtile, v4=matmul_vec4)
REFERENCE = "v4"
matmul = VERSIONS[REFERENCE][1]
#: v5 (tensor cores, float16/bfloat16 inputs) is the topic matmul_fp16: kernels/cuda/matmul_fp16.py.
