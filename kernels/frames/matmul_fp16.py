"""The frame of the topic ``matmul_fp16`` (tensor cores: float16 or bfloat16 A and B, float32
C): matmul's input rules (``kernels/frames/matmul.py``) with the half dtypes, and its reference.

    prepare_operands(a, b, op, dtypes=HALF)   the checked operands and a new float32 C
    matmul_fp16_ref(a, b)                     A @ B in float32 (``matmul_ref``)
"""
from __future__ import annotations

from kernels.frames.matmul import HALF, matmul_ref, prepare_operands  # noqa: F401  (the shared input rules)

matmul_fp16_ref = matmul_ref
