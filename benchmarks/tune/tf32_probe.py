"""How a GPU's tensor cores read float32 inputs in ``tl.dot``, measured, to check the
interpreter's model of it (``runtime/backends/triton/tensor_core.py``).

For each ``input_precision`` ("tf32", the default; "tf32x3"; "ieee") one Triton kernel
multiplies a float32 tile pair with a single ``tl.dot``. The result is compared with float64
products of the inputs read three ways: truncated to TF32 (the low 13 mantissa bits dropped),
rounded to TF32 (``cvt.rna``: nearest, ties away from zero) and exact. The model that matches
the GPU to float32 accumulation error is the one the GPU uses. In simulation the same script
compares the interpreter with the same models, so it is tested before the GPU call.

    python -m benchmarks.tune.tf32_probe [OUT.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import torch

import utils  # first: picks the GPU or the interpreter
from runtime.backends.triton.tensor_core import tf32_round, tf32_truncate

import triton
import triton.language as tl


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               PRECISION: tl.constexpr):
    rm = tl.arange(0, M)[:, None]
    rn = tl.arange(0, N)[None, :]
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn)
    tl.store(c_ptr + rm * N + rn, tl.dot(a, b, input_precision=PRECISION))


def probe(precision: str, m=64, n=64, k=128, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    c = torch.empty(m, n, device=utils.DEVICE)
    dot_kernel[(1,)](a.to(utils.DEVICE), b.to(utils.DEVICE), c, m, n, k, precision)
    got = c.cpu().double().numpy()
    an, bn = a.numpy(), b.numpy()
    models = {
        "truncated to TF32": tf32_truncate(an).astype(np.float64) @ tf32_truncate(bn).astype(np.float64),
        "rounded to TF32 (rna)": tf32_round(an).astype(np.float64) @ tf32_round(bn).astype(np.float64),
        "exact float32": an.astype(np.float64) @ bn.astype(np.float64),
    }
    scale = float(np.abs(models["exact float32"]).max())
    errors = {name: float(np.abs(got - ref).max()) / scale for name, ref in models.items()}
    return {"input_precision": precision, "shape": [m, n, k],
            "max error relative to max |C|": errors,
            "closest model": min(errors, key=errors.get)}


def main(argv):
    out = {"commit": utils.source_commit(), "mode": utils.MODE, "device": utils.describe(),
           "probes": [probe(p) for p in ("tf32", "tf32x3", "ieee")]}
    text = json.dumps(out, indent=1)
    print(text)
    if len(argv) > 1:
        Path(argv[1]).write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv)
