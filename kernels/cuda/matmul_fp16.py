"""Matrix multiplication on tensor cores in CUDA C++ (topic ``matmul_fp16``): the lesson's v5.

    matmul_fp16(a, b)     v5: nvcuda::wmma, float16 or bfloat16 A and B, float32 C

The kernel lives in ``matmul.cu`` beside v1-v4 (see kernels/cuda/matmul.py).
"""
from __future__ import annotations

from kernels._launch import version_index
from kernels.cuda.matmul import SOURCE, matmul_wmma
from kernels.frames.matmul_fp16 import matmul_fp16_ref, matmul_ref  # noqa: F401  (the reference, defined once)

VERSIONS = version_index(SOURCE, v5=matmul_wmma)  # v5 of matmul.cu's index
REFERENCE = "v5"
matmul_fp16 = VERSIONS[REFERENCE][1]
