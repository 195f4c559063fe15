"""Matrix multiplication on tensor cores in Triton (topic ``matmul_fp16``).

    matmul_fp16(a, b)     v2: C in the inputs' dtype like torch.mm
    matmul_tma(a, b)      v3, the reference: a persistent kernel whose tiles move by TMA tensor
                          descriptors; operands with unaligned rows are copied into aligned buffers first

The kernels, and the version index with v1 (v2's exact-fp32 twin), are in kernels/triton/matmul.py.
"""
from __future__ import annotations

from kernels._launch import version_index
from kernels.frames.matmul_fp16 import matmul_fp16_ref, matmul_ref  # noqa: F401  (the reference, defined once)
from kernels.triton import matmul as matmul_module
from kernels.triton.matmul import matmul_fp16, matmul_tma

VERSIONS = version_index(matmul_module.__doc__, v2=matmul_fp16, v3=matmul_tma)
REFERENCE = "v3"
