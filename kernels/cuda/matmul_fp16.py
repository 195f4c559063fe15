"""Matrix multiplication on tensor cores in CUDA C++ (topic ``matmul_fp16``): the lesson's v5.

    matmul_fp16(a, b)     v5: nvcuda::wmma, float16 or bfloat16 A and B, float32 C

The kernel lives in ``matmul.cu`` beside v1-v4 (see kernels/cuda/matmul.py).
"""
from __future__ import annotations

from collections import OrderedDict

from kernels.cuda.matmul import matmul_ref, matmul_wmma

VERSIONS = OrderedDict(
    v5=("tensor cores (wmma): fp16/bf16 inputs, fp32 accumulation, 64 x 64 tiles, fp32 C", matmul_wmma),
)
REFERENCE = "v5"
matmul_fp16 = VERSIONS[REFERENCE][1]
matmul_fp16_ref = matmul_ref
