"""What is measured for each topic: inputs, the float64 reference, bytes moved, tolerances,
and the PyTorch baselines.

Bytes are what a kernel must move at the least: every input element read once and every
output element written once (a sum writes one float). GB/s is bytes / median time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import utils

FLOAT = 4  # bytes per float32

# The course's tolerance for float32 results (utils/check.py): a different summation order
# or a fast-math exp fits, a different formula does not.
try:
    _TOL = utils.tolerance(torch.float32)
except Exception:  # utils.check not there yet
    _TOL = dict(atol=1e-5, rtol=1e-5)
ATOL, RTOL = float(_TOL["atol"]), float(_TOL["rtol"])
EPS32 = 2.0 ** -24  # unit roundoff of float32


def numel(shape) -> int:
    return int(math.prod(shape))


# --------------------------------------------------------------------------------------
# Inputs: seeded, on utils.DEVICE, with the values that expose typical mistakes.
# --------------------------------------------------------------------------------------
def _gen(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def relu_input(shape, seed=0, device=None):
    device = device or utils.DEVICE
    x = torch.randn(tuple(shape), generator=_gen(seed, device), device=device)
    x.view(-1)[::7] = 0.0  # exact zeros: relu(0) must be 0
    return x


def gelu_input(shape, seed=0, device=None):
    device = device or utils.DEVICE
    return 3.0 * torch.randn(tuple(shape), generator=_gen(seed, device), device=device)


def sum_input(shape, seed=0, device=None):
    # A positive mean keeps the sum well away from 0, so a missing block of elements shows
    # up as a clear relative error; the negatives catch a kernel that drops the sign.
    device = device or utils.DEVICE
    return torch.rand(tuple(shape), generator=_gen(seed, device), device=device) - 0.25


def softmax_input(shape, seed=0, device=None):
    # Each row shifted by up to +-200: exp() of such values overflows float32 (above 88.7),
    # so a softmax without max subtraction returns inf/nan and fails the check.
    device = device or utils.DEVICE
    g = _gen(seed, device)
    rows, cols = shape
    x = 4.0 * torch.randn(rows, cols, generator=g, device=device)
    x += 400.0 * (torch.rand(rows, 1, generator=g, device=device) - 0.5)
    return x


# --------------------------------------------------------------------------------------
# float64 references
# --------------------------------------------------------------------------------------
def relu_ref64(x):
    return torch.relu(x.double())


def gelu_ref64(x):
    # tanh-GELU, the formula the course teaches (not erf-GELU).
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def sum_ref64(x):
    return x.double().sum().reshape(1)


def softmax_ref64(x):
    return torch.softmax(x.double(), dim=-1)


# --------------------------------------------------------------------------------------
# Allowed error, elementwise: |out - ref| <= tol
# --------------------------------------------------------------------------------------
def elementwise_tol(x, ref):
    return ATOL + RTOL * ref.abs()


def exact_tol(x, ref):
    return torch.zeros((), dtype=ref.dtype, device=ref.device)


def sum_tol(x, ref):
    # Rounding in any summation order is bounded by a multiple of eps * sum|x|; reordering
    # (tree, atomics) gives a random walk of about sqrt(n) roundings. Small sizes keep this
    # tight enough that a missing block fails; large ones still catch gross errors.
    n = max(x.numel(), 1)
    abs_sum = x.double().abs().sum()
    return ATOL + RTOL * ref.abs() + 2.0 * EPS32 * math.sqrt(n) * abs_sum


# --------------------------------------------------------------------------------------
# PyTorch baselines. Factories: each call makes a fresh function (torch.compile state).
# --------------------------------------------------------------------------------------
def _gelu_unfused(x):
    # The formula op by op: each op is its own kernel that reads and writes the whole tensor.
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _softmax(x):
    return torch.softmax(x, dim=-1)


@dataclass
class Baseline:
    variant: str            # "torch", "torch.compile", "torch op-by-op"
    version: str            # "eager", "compile", "unfused"
    description: str
    factory: Callable[[bool], Callable]   # factory(dynamic) -> fn(x)


def _eager(fn):
    return lambda dynamic=False: fn


def _compile(fn):
    # Static shapes: one compilation per shape measured (see harness.configure_torch_compile).
    return lambda dynamic=False: torch.compile(fn, dynamic=False)


@dataclass
class Topic:
    name: str
    make_input: Callable
    reference: Callable
    tolerance: Callable
    nbytes: Callable          # shape -> bytes read + written
    baselines: list = field(default_factory=list)
    two_d: bool = False       # softmax: shapes are (rows, cols)

    def out_numel(self, shape) -> int:
        return 1 if self.name == "reduction" else numel(shape)


def _elementwise_bytes(shape):
    return 2 * FLOAT * numel(shape)


def _sum_bytes(shape):
    return FLOAT * numel(shape) + FLOAT


TOPICS = {
    "relu": Topic(
        "relu", relu_input, relu_ref64, exact_tol, _elementwise_bytes,
        [Baseline("torch", "eager", "F.relu", _eager(F.relu)),
         Baseline("torch.compile", "compile", "torch.compile(F.relu)", _compile(F.relu))]),
    "gelu": Topic(
        "gelu", gelu_input, gelu_ref64, elementwise_tol, _elementwise_bytes,
        [Baseline("torch", "eager", 'F.gelu(approximate="tanh")',
                  _eager(lambda x: F.gelu(x, approximate="tanh"))),
         Baseline("torch op-by-op", "unfused", "the tanh formula op by op (unfused)",
                  _eager(_gelu_unfused)),
         Baseline("torch.compile", "compile", "torch.compile of the op-by-op formula",
                  _compile(_gelu_unfused))]),
    "reduction": Topic(
        "reduction", sum_input, sum_ref64, sum_tol, _sum_bytes,
        [Baseline("torch", "eager", "torch.sum", _eager(torch.sum)),
         Baseline("torch.compile", "compile", "torch.compile(torch.sum)", _compile(torch.sum))]),
    "softmax": Topic(
        "softmax", softmax_input, softmax_ref64, elementwise_tol, _elementwise_bytes,
        [Baseline("torch", "eager", "torch.softmax(x, dim=-1)", _eager(_softmax)),
         Baseline("torch.compile", "compile", "torch.compile(torch.softmax)", _compile(_softmax))],
        two_d=True),
}


def copy_bytes(n: int) -> int:
    return 2 * FLOAT * n


# --------------------------------------------------------------------------------------
# Sizes: GPU sizes from utils.PROBLEM_SIZES["gpu"]; checks also run at awkward sizes.
# --------------------------------------------------------------------------------------
def main_shapes(topic: str, sizes) -> list[tuple]:
    """The shapes a topic is measured at (the targets' shapes)."""
    if TOPICS[topic].two_d:
        return [tuple(s) for s in sizes.softmax_bench_shapes]
    return [(int(sizes.bench_n),)]


def sweep_shapes(topic: str, sizes, cols: int = 4096) -> list[tuple]:
    """The shapes of the size sweep: n elements, softmax as rows of ``cols`` columns."""
    if TOPICS[topic].two_d:
        out = []
        for n in sizes.bench_sizes:
            rows = max(1, int(n) // cols)
            if (rows, cols) not in out:
                out.append((rows, cols))
        return out
    return [(int(n),) for n in sizes.bench_sizes]


def check_shapes(topic: str, simulate: bool) -> list[tuple]:
    """Awkward shapes every kernel must get right before it is timed (tails, one element)."""
    if TOPICS[topic].two_d:
        return [(1, 1), (7, 3), (5, 257)] if simulate else [(1, 1), (7, 3), (33, 4097)]
    return [(1,), (7,), (1025,)] if simulate else [(1,), (7,), (1025,), ((1 << 20) + 3,)]
