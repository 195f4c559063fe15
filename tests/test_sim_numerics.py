"""Simulation computes what the GPU computes: tensor-core products, shuffles, conversions."""
import pytest
import torch

import utils
import triton
import triton.language as tl

sim_only = pytest.mark.skipif(not utils.SIMULATE, reason="about the simulators")


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               OUT_F16: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    if OUT_F16:
        c = tl.dot(a, b, out_dtype=tl.float16)
    else:
        acc = tl.full((M, N), 1.0, tl.float32)
        c = tl.dot(a, b, acc)  # with an accumulator: acc + a @ b
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


def run_dot(a, b, out_f16=False):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=torch.float16 if out_f16 else torch.float32)
    dot_kernel[(1,)](a, b, c, M, N, K, OUT_F16=out_f16)
    return c


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dot_low_precision_inputs_accumulate_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(dtype).to(utils.DEVICE)
    b = torch.randn(32, 16, generator=g).to(dtype).to(utils.DEVICE)
    got = run_dot(a, b).double().cpu()
    # Products of two bf16 or fp16 values are exact in float32: only the float32 sums round.
    want = a.double().cpu() @ b.double().cpu() + 1.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_dot_fp16_with_fp16_output():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 16, generator=g).half().to(utils.DEVICE)
    b = torch.randn(16, 16, generator=g).half().to(utils.DEVICE)
    got = run_dot(a, b, out_f16=True)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double().cpu(), a.double().cpu() @ b.double().cpu(),
                               rtol=2e-2, atol=2e-2)


@sim_only
def test_dot_bf16_output_is_refused_as_on_a_gpu():
    @triton.jit
    def bad(a_ptr, c_ptr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, a, out_dtype=tl.bfloat16))

    a = torch.ones(16, 16, dtype=torch.bfloat16, device=utils.DEVICE)
    with pytest.raises(Exception, match="out_dtype=bfloat16 is unsupported"):
        bad[(1,)](a, torch.empty_like(a))


# ---------------------------------------------------------------------------------------
# float32 tl.dot: TF32 on the tensor cores unless input_precision="ieee".
# ---------------------------------------------------------------------------------------
@triton.jit
def f32_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                   PRECISION: tl.constexpr, LEGACY_ALLOW_TF32: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    if LEGACY_ALLOW_TF32 == 0:
        c = tl.dot(a, b, allow_tf32=False)
    elif PRECISION == "default":
        c = tl.dot(a, b)
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


def f32_rel_error(precision="default", legacy=-1):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(32, 64, generator=g).to(utils.DEVICE)
    b = torch.randn(64, 32, generator=g).to(utils.DEVICE)
    c = torch.empty(32, 32, device=a.device)
    f32_dot_kernel[(1,)](a, b, c, 32, 32, 64, PRECISION=precision, LEGACY_ALLOW_TF32=legacy)
    want = a.double().cpu() @ b.double().cpu()
    return ((c.double().cpu() - want).abs().max() / want.abs().max()).item()


@sim_only
def test_f32_dot_default_is_tf32_and_ieee_is_exact(monkeypatch):
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    tf32, ieee = f32_rel_error(), f32_rel_error("ieee")
    assert 1e-4 < tf32 < 1e-2, tf32      # 10 mantissa bits: errors ~1e-3 of the largest value
    assert ieee < 1e-6, ieee
    assert f32_rel_error("tf32") == tf32
    assert f32_rel_error("tf32x3") < 1e-6  # three TF32 products recover float32 accuracy
    assert f32_rel_error(legacy=0) == ieee  # allow_tf32=False is "ieee"
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    assert f32_rel_error() == ieee


def test_tf32_truncation_and_rounding():
    import numpy as np
    from utils.backends.triton.tensor_core import tf32_round, tf32_truncate
    ulp = 2.0 ** -10
    x = np.array([1 + ulp / 2, 1 + ulp * 1.5, -(1 + ulp / 2), 1 + ulp * 0.49, np.inf],
                 dtype=np.float32)
    # The tensor core drops the 13 low mantissa bits; cvt.rna rounds half away from zero.
    np.testing.assert_array_equal(tf32_truncate(x), [1, 1 + ulp, -1, 1, np.inf])
    np.testing.assert_array_equal(tf32_round(x), [1 + ulp, 1 + 2 * ulp, -(1 + ulp), 1, np.inf])


@triton.jit
def bf16_cast_kernel(x_ptr, y_ptr, z_ptr, w_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = x.to(tl.bfloat16)
    tl.store(y_ptr + offs, y, mask=m)                      # float32 -> bfloat16
    tl.store(z_ptr + offs, y.to(tl.float64), mask=m)       # bfloat16 -> float64
    tl.store(w_ptr + offs, y.to(tl.int32), mask=m)         # bfloat16 -> int32


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_bf16_casts_round_to_nearest_even():
    x = torch.tensor([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -9, -2.7, 300.6, 3.4e38, -0.0,
                      float("inf"), float("nan")], device=utils.DEVICE)
    n = x.numel()
    y = torch.empty(n, dtype=torch.bfloat16, device=x.device)
    z = torch.empty(n, dtype=torch.float64, device=x.device)
    w = torch.empty(n, dtype=torch.int32, device=x.device)
    bf16_cast_kernel[(1,)](x, y, z, w, n, BLOCK=16)
    want = x.to(torch.bfloat16)  # torch rounds to nearest even, as the GPU's cvt.rn.bf16.f32
    torch.testing.assert_close(y.cpu(), want.cpu(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(z.cpu(), want.double().cpu(), rtol=0, atol=0, equal_nan=True)
    assert w[:5].tolist() == [1, 1, 1, -2, 300]
