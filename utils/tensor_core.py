"""What a tensor core computes, in NumPy: the number formats it reads.

Used by the simulators so that a product computed without a GPU is the one an H100 gives:

* **bfloat16** is the upper half of a float32: widening is exact (a shift by 16 bits), and a
  product of two bf16 values (8-bit significands) is exact in float32. Triton's interpreter
  keeps bf16 as raw ``uint16`` bits, so they must be widened before any arithmetic.
"""
from __future__ import annotations

import numpy as np

__all__ = ["bf16_bits_to_f32", "f32_to_bf16_bits"]

def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 stored as uint16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (NaN stays NaN), as a GPU's
    ``cvt.rn.bf16.f32`` and torch's ``.to(torch.bfloat16)`` do."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out
