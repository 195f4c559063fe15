"""Matrix multiplication on tensor cores in Triton (topic ``matmul_fp16``).

    v2  fp16/bf16 in, fp32 accumulate: tl.dot on tensor cores, autotuned tiles, grouped ordering
        matmul_fp16(a, b): C in the inputs' dtype like torch.mm
    v3  v2 persistent (a program per SM) with TMA tensor descriptors; unaligned rows copied aligned first
        matmul_tma(a, b), the reference: a persistent kernel whose tiles move by TMA tensor
        descriptors; operands with unaligned rows are copied into aligned buffers first

The kernels are in kernels/triton/matmul.py (v1 is v2's exact-fp32 twin).
"""
from __future__ import annotations

from collections import OrderedDict

from kernels.triton.matmul import matmul_fp16, matmul_ref, matmul_tma

VERSIONS = OrderedDict(
    v2=("fp16/bf16 in, fp32 accumulate: tl.dot on tensor cores, autotuned tiles, grouped ordering", matmul_fp16),
    v3=("v2 persistent (a program per SM) with TMA tensor descriptors; unaligned rows copied aligned first",
        matmul_tma),
)
REFERENCE = "v3"
matmul_fp16_ref = matmul_ref
