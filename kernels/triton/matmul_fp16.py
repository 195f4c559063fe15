"""Matrix multiplication on tensor cores in Triton (topic ``matmul_fp16``).

    matmul_fp16(a, b)     v2: float16 or bfloat16 A and B, fp32 accumulation, C in the
                          inputs' dtype like torch.mm (autotuned tiles, grouped ordering)

The kernel is the one of kernels/triton/matmul.py (v1 is its exact-fp32 twin).
"""
from __future__ import annotations

from collections import OrderedDict

from kernels.triton.matmul import matmul_fp16, matmul_ref

VERSIONS = OrderedDict(
    v2=("fp16/bf16 in, fp32 accumulate: tl.dot on tensor cores, autotuned tiles, grouped ordering", matmul_fp16),
)
REFERENCE = "v2"
matmul_fp16_ref = matmul_ref
