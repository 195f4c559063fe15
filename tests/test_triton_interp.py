"""The course's way around what Triton's interpreter lacks (see docs/simulation.md)."""
import math
import re
import warnings

import pytest
import torch
from copy_kernels import copy_tl_kernel

import utils
from runtime.backends.triton import compat as triton_compat
from runtime.backends.triton.compat import tanh

import triton
import triton.language as tl

sim_only = pytest.mark.skipif(not utils.SIMULATE, reason="about Triton's interpreter")
F32 = utils.TOLERANCES[torch.float32]  # the course's float32 tolerance


@triton.jit
def tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tanh(x), mask=mask)


def run_tanh(x):
    y = torch.empty_like(x)
    tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def test_tanh_matches_torch_to_float32_tolerance():
    x = torch.cat([torch.linspace(-30, 30, 3001), torch.randn(997) * 3,
                   torch.tensor([0.0, -0.0, 1e-30, -1e-7, 0.0624, 0.0625, -0.0626, 88.0, -104.0])])
    x = x.to(utils.DEVICE)
    got = run_tanh(x).double().cpu()
    want = torch.tanh(x.double()).cpu()
    torch.testing.assert_close(got, want, **F32)
    # A tiny x keeps its relative accuracy (the series branch), like libdevice's tanh.
    tiny = x.abs().cpu() < 0.0625
    rel = ((got - want).abs() / want.abs().clamp_min(1e-38))[tiny & (want != 0)]
    assert rel.max().item() < 1e-6


def test_tanh_of_inf_and_nan():
    x = torch.tensor([math.inf, -math.inf, math.nan], device=utils.DEVICE)
    y = run_tanh(x).cpu()
    assert y[0].item() == 1.0 and y[1].item() == -1.0 and math.isnan(y[2].item())


@triton.jit
def gelu_tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + tanh(u)), mask=mask)


def test_tanh_gelu_written_with_the_shim_matches_float64():
    x = (torch.randn(5000) * 4).to(utils.DEVICE)
    y = torch.empty_like(x)
    gelu_tanh_kernel[(triton.cdiv(x.numel(), 512),)](x, y, x.numel(), BLOCK=512)
    xd = x.double()
    want = 0.5 * xd * (1 + torch.tanh(0.7978845608028654 * (xd + 0.044715 * xd ** 3)))
    torch.testing.assert_close(y.double(), want, **F32)


@triton.jit
def libdevice_tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.extra.cuda.libdevice.tanh(x), mask=mask)


def test_libdevice_tanh_runs_in_both_modes():
    # in simulation through runtime/backends/libdevice.py (stock Triton's interpreter
    # fails on every libdevice call): the same kernel, the same values within an ulp or two
    x = (torch.randn(1000) * 4).to(utils.DEVICE)
    y = torch.empty_like(x)
    libdevice_tanh_kernel[(triton.cdiv(1000, 256),)](x, y, 1000, BLOCK=256)
    torch.testing.assert_close(y.double(), torch.tanh(x.double()), rtol=5e-7, atol=1e-7)


def test_do_bench_shim_returns_milliseconds():
    x = torch.randn(4096, device=utils.DEVICE)
    y = torch.empty_like(x)

    def call():
        tanh_kernel[(4,)](x, y, x.numel(), BLOCK=1024)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ms = triton_compat.do_bench(call, rep=20)
        q = triton_compat.do_bench(call, rep=20, quantiles=[0.2, 0.5, 0.8])
    assert ms > 0 and len(q) == 3 and q[0] <= q[1] <= q[2]
    if utils.SIMULATE:
        assert any("not GPU timings" in str(w.message) for w in caught)


def test_autotune_shim_runs_in_both_modes():
    autotuned_copy_kernel = triton_compat.autotune(configs=[triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
                                                            triton.Config({"BLOCK_SIZE": 256}, num_warps=8)],
                                                   key=["n"])(copy_tl_kernel)
    x = torch.randn(1000, device=utils.DEVICE)
    y = torch.zeros_like(x)
    autotuned_copy_kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK_SIZE"]),)](x, y, x.numel())
    torch.testing.assert_close(y, x)
    if utils.SIMULATE:
        assert autotuned_copy_kernel.best_config.kwargs == {"BLOCK_SIZE": 128}


# A kernel may read a module-level value only if it is a tl.constexpr: a GPU's Triton compiler
# refuses a plain int (CompilationError wrapping a NameError), and so does the simulation.
_PLAIN_FLAG = 1
_CONSTEXPR_FLAG = tl.constexpr(1)


@triton.jit
def _reads_plain_flag(x):
    if _PLAIN_FLAG == 1:
        x = x + 1
    return x


@triton.jit
def _kernel_calling_a_helper_with_a_plain_global(x_ptr):
    tl.store(x_ptr, _reads_plain_flag(tl.load(x_ptr)))


@triton.jit
def _kernel_with_a_constexpr_global(x_ptr):
    if _CONSTEXPR_FLAG == 1:
        tl.store(x_ptr, tl.load(x_ptr) + 1)


def test_a_global_that_is_not_a_constexpr_is_refused_as_on_a_gpu():
    x = torch.zeros(1, device=utils.DEVICE)
    _kernel_with_a_constexpr_global[(1,)](x)
    assert x.item() == 1
    with pytest.raises(Exception) as e:
        _kernel_calling_a_helper_with_a_plain_global[(1,)](x)
    chain = f"{e.value} {e.value.__cause__}"   # a GPU's CompilationError carries the NameError
    assert re.search(r"(?s)global variable _PLAIN_FLAG.*constexpr", chain), chain


@triton.jit
def _exchange_kernel(p_ptr, v_ptr, old_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(old_ptr + i, tl.atomic_xchg(p_ptr + i, tl.load(v_ptr + i)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_atomic_exchange_of_floats_runs_as_on_a_gpu(dtype):
    """tl.atomic_xchg exchanges a float's bits, as a GPU does (the stock interpreter takes
    integers only): the memory gets the new values, the result holds the old ones."""
    p = torch.tensor([1.5, -2.0, 3.25, 4.0, -0.0, 6.0, 1e-30, 8.0], device=utils.DEVICE).to(dtype)
    v = torch.tensor([9.0, 8.5, -7.0, 0.1, 5.0, -6.5, 2.0, 1e30], device=utils.DEVICE).to(dtype)
    before, old = p.clone(), torch.empty_like(p)
    _exchange_kernel[(1,)](p, v, old, N=8)
    assert torch.equal(p, v) and torch.equal(old, before)
