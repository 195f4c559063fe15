"""The pattern kernels of kernels/cuda/patterns.cu compute what their comments say, launched
exactly as benchmarks/simulators/ncu_patterns.py launches them for the profiler comparison."""
import pytest
import torch

import utils
from benchmarks.simulators.ncu_patterns import CASES, N, launch


def _copy(args):
    return args[1], args[0][:N]


def _reference(name, args):
    """(output tensor, expected value) of a pattern case."""
    if name == "copy_coalesced":
        return _copy(args)
    if name == "copy_strided_2":
        return args[1], args[0][::2]
    if name == "copy_strided_32":
        return args[1], args[0][::32]
    if name == "copy_misaligned":
        return args[1], args[0][1:N + 1]
    if name == "aos":
        return args[1], args[0].view(N, 3).sum(1)
    if name == "soa":
        return args[3], args[0] + args[1] + args[2]
    if name == "copy_float4":
        return _copy(args)
    if name.startswith("transpose"):
        return args[1], args[0].t()
    if name == "reduce_strided_index":
        return args[1], args[0].view(-1, 256).sum(1)
    if name.startswith("branch"):
        x = args[0].clone()
        idx = torch.arange(N, device=x.device) % 256
        first = {"branch_odd_even": idx % 2 == 0, "branch_half_warp": idx % 32 < 16,
                 "branch_warp_aligned": (idx // 32) % 2 == 0}[name]
        a, b = x.clone(), x.clone()
        for _ in range(16):  # spin_a and spin_b of patterns.cu
            a = a * 0.999 + 1.0
            b = b * 1.001 - 1.0
        return args[1], torch.where(first, a, b)
    if name == "atomic_one_address":
        return args[1], args[0].sum().reshape(1)
    if name == "atomic_distinct":
        return args[1], args[0]
    if name == "atomic_ticket":  # every ticket 0..N-1 handed out once, in any order
        return args[1].sort().values, torch.arange(N, dtype=torch.int32, device=args[1].device)
    raise KeyError(name)


PATTERNS = [c for c in CASES.values() if c.kind == "pattern"]


def test_at_least_twelve_patterns_each_its_own_kernel():
    assert len(PATTERNS) >= 12
    assert len({c.kernel for c in PATTERNS}) >= 12
    for c in PATTERNS:
        assert c.kernel.endswith("_kernel") and c.bytes > 0


@pytest.mark.parametrize("case", PATTERNS, ids=lambda c: c.name)
def test_pattern_computes_what_it_says(case):
    made = case.make_args(utils.DEVICE)
    launch(case, made)
    out, want = _reference(case.name, made[0])
    torch.testing.assert_close(out.reshape(want.shape), want, rtol=1e-4, atol=1e-3)
