"""What a tensor core computes, in NumPy: the number formats it reads and how ``tl.dot`` uses them.

Used by the simulators so that a product computed without a GPU is the one an H100 gives:

* **bfloat16** is the upper half of a float32: widening is exact (a shift by 16 bits), and a
  product of two bf16 values (8-bit significands) is exact in float32. Triton's interpreter
  keeps bf16 as raw ``uint16`` bits, so they must be widened before any arithmetic.
* **TF32** keeps float32's 8-bit exponent and 10 of its 23 mantissa bits. For a float32
  ``tl.dot`` with ``input_precision="tf32"`` (Triton's default on NVIDIA GPUs), Triton passes
  the float32 registers or shared memory straight to the tensor core (``mma``/``wgmma`` with
  ``.tf32`` operands), which reads the upper 19 bits: the low 13 mantissa bits are dropped,
  i.e. the inputs are *truncated* toward zero. Products of two TF32 values are exact in float32
  and are summed in float32. (Rounding with ``cvt.rna.tf32.f32`` first is what cuBLAS and a
  hand-written Triton kernel do when they want torch's TF32 results; Triton does it only in
  ``"tf32x3"``.)
* **tf32x3** splits each input into ``big = cvt.rna.tf32.f32(x)`` (round to nearest, ties away
  from zero) and ``small = x - big``, and sums three TF32 products,
  ``a_small @ b_big + a_big @ b_small`` then ``+ a_big @ b_big``, then adds the accumulator:
  nearly float32 accuracy (Triton's ``F32DotTC`` pass).
* **ieee** is plain float32 arithmetic (FMA units, no tensor core).
"""
from __future__ import annotations

import numpy as np

__all__ = ["bf16_bits_to_f32", "f32_to_bf16_bits", "cast_bf16", "tf32_truncate", "tf32_round",
           "f32_dot"]

_LOW13 = np.uint32(0x1FFF)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 stored as uint16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def cast_bf16(data: np.ndarray, src_bf16: bool, dst_np: np.dtype) -> np.ndarray:
    """A conversion to or from bfloat16 (kept as uint16 bits) as a GPU does it: widening is
    exact, narrowing rounds to nearest even (``cvt.rn.bf16.f32``); float64 and integers go
    through float32 (a second rounding only for values float32 cannot hold exactly)."""
    if src_bf16:
        return bf16_bits_to_f32(data).astype(dst_np)
    return f32_to_bf16_bits(np.asarray(data).astype(np.float32))


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (NaN stays NaN), as a GPU's
    ``cvt.rn.bf16.f32`` and torch's ``.to(torch.bfloat16)`` do."""
    x = np.array(x, dtype=np.float32)  # a contiguous copy, 0-d arrays stay 0-d
    u = x.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    # A NaN stays a (quiet) NaN: rounding up could carry its payload into infinity.
    quiet_nan = (u >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def tf32_truncate(x: np.ndarray) -> np.ndarray:
    """float32 -> the TF32 value a tensor core reads from it: the low 13 mantissa bits dropped."""
    u = np.array(x, dtype=np.float32).view(np.uint32)
    return (u & ~_LOW13).view(np.float32)


def tf32_round(x: np.ndarray) -> np.ndarray:
    """float32 -> TF32 as ``cvt.rna.tf32.f32``: round to nearest, ties away from zero
    (adding half an ulp to the magnitude, then truncating). Inf and NaN pass through."""
    x = np.array(x, dtype=np.float32)
    u = x.view(np.uint32)
    finite = np.isfinite(x)
    with np.errstate(over="ignore"):
        r = np.where(finite, (u + np.uint32(0x1000)) & ~_LOW13, u)
    return r.astype(np.uint32).view(np.float32)


def f32_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray, precision: str) -> np.ndarray:
    """``a @ b + acc`` for float32 ``a`` and ``b`` as ``tl.dot(..., input_precision=precision)``
    computes it on an NVIDIA GPU with tensor cores (``precision``: "ieee", "tf32", "tf32x3")."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    out_dtype = acc.dtype
    precision = precision.lower()
    if precision == "ieee":
        return np.matmul(a, b, dtype=np.float32).astype(out_dtype) + acc
    if precision == "tf32":
        return np.matmul(tf32_truncate(a), tf32_truncate(b), dtype=np.float32).astype(out_dtype) + acc
    if precision == "tf32x3":
        with np.errstate(invalid="ignore", over="ignore"):
            a_big, b_big = tf32_round(a), tf32_round(b)
            a_small, b_small = tf32_truncate(a - a_big), tf32_truncate(b - b_big)
            small = (np.matmul(a_small, b_big, dtype=np.float32)
                     + np.matmul(a_big, b_small, dtype=np.float32))
            return (small + np.matmul(a_big, b_big, dtype=np.float32)).astype(out_dtype) + acc
    raise ValueError(f"unknown input_precision {precision!r}: expected 'ieee', 'tf32' or 'tf32x3'")
