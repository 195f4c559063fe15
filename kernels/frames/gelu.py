"""GELU's frame, shared by the CUDA C++, Numba and Triton modules: the PyTorch reference and
the PyTorch baselines the lesson compares the kernels with. (The launchers take the elementwise
rule of every language, ``inputs_and_output`` of ``kernels/_launch.py``.)

    gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

    gelu_ref             the reference: float64 tanh-GELU, cast back to the input dtype
    gelu_unfused_torch   the formula written op by op: one kernel (and one round trip
                         through memory) per operation
    gelu_torch           F.gelu(x, approximate="tanh"): PyTorch's own fused kernel
    gelu_compiled        torch.compile(gelu_unfused_torch): the compiler fuses the ops
    BASELINES            name -> (description, function) of the three baselines
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SQRT_2_OVER_PI = 0.7978845608  # sqrt(2 / pi)
COEFF = 0.044715


def gelu_ref(x: torch.Tensor) -> torch.Tensor:
    """The reference: tanh-GELU computed in float64, returned in the input's dtype."""
    return F.gelu(x.double(), approximate="tanh").to(x.dtype)


def gelu_unfused_torch(x: torch.Tensor) -> torch.Tensor:
    """The formula written op by op. Eager PyTorch runs each operation as its own kernel,
    which reads its inputs from memory and writes its result back: 9 kernels, 9 round trips."""
    return 0.5 * x * (1 + torch.tanh(SQRT_2_OVER_PI * (x + COEFF * x * x * x)))


def gelu_torch(x: torch.Tensor) -> torch.Tensor:
    """PyTorch's own fused GELU kernel (tanh approximation)."""
    return F.gelu(x, approximate="tanh")


_compiled_unfused = None


def gelu_compiled(x: torch.Tensor) -> torch.Tensor:
    """``torch.compile(gelu_unfused_torch)``: Inductor fuses the 9 ops into one kernel
    (Triton on a GPU, C++ on a CPU). Compiled on the first call (seconds)."""
    global _compiled_unfused
    if _compiled_unfused is None:
        _compiled_unfused = torch.compile(gelu_unfused_torch)
    return _compiled_unfused(x)


#: The PyTorch variants of the fusion comparison: name -> (description, function). The
#: names are the ``variant`` names of the recorded benchmark results.
BASELINES = {
    "torch op-by-op": ("the formula op by op (one kernel per op)", gelu_unfused_torch),
    "torch": ('F.gelu(x, approximate="tanh")', gelu_torch),
    "torch.compile": ("torch.compile of the op-by-op formula", gelu_compiled),
}
