"""Matrix multiplication on tensor cores (lesson 06): float16 inputs, float32 accumulation.

The same product as ``matmul`` (its grader is ``check_matmul(fn, dtype=torch.float16)``),
measured against ``torch.mm`` in float16: CUDA C++ through nvcuda::wmma and Triton's tl.dot.
"""
from __future__ import annotations

import torch

from ._spec import Baseline, Target, eager
from .matmul import check_matmul, make_inputs, matmul_spec, nbytes_of, spec_tolerance

HALF = 2  # bytes per float16


def check_matmul_fp16(fn, *, seed=None):
    """``check_matmul(fn, dtype=torch.float16)``: float16 A and B, float32 sums; C in float32
    or float16 (rounded once, as torch.mm returns it)."""
    return check_matmul(fn, dtype=torch.float16, seed=seed)


def matmul_fp16_input(shape, seed=0, device=None):
    return make_inputs(shape, seed, device, torch.float16)


SPEC = matmul_spec(
    name="matmul_fp16", title="Matmul fp16 (tensor cores)", make_input=matmul_fp16_input,
    nbytes=nbytes_of(HALF, HALF),
    tolerance=spec_tolerance(torch.float16),
    out_dtypes=(torch.float32, torch.float16),
    checks={"check_matmul_fp16": check_matmul_fp16},
    baselines=[Baseline("torch", "mm", "torch.mm (cuBLAS), fp16 in and out, fp32 accumulation", eager(torch.mm))],
    baseline_label="torch.mm fp16",
    targets=[Target("triton", "torch", 0.9, shape=(4096, 4096, 4096))],
)
