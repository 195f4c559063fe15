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

    from runtime.backends.triton.tensor_core import tf32_round, tf32_truncate
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


# ---------------------------------------------------------------------------------------
# The CUDA emulator: fast intrinsics and half conversions as the GPU computes them.
# ---------------------------------------------------------------------------------------
INTRINSICS = r"""
#include <cuda_fp16.h>
__global__ void intrinsics_kernel(const float* x_ptr, const float* y_ptr, float* out_ptr,
                                  unsigned short* h_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = x_ptr[i], y = y_ptr[i];
        out_ptr[0 * n + i] = __expf(x);
        out_ptr[1 * n + i] = __logf(fabsf(x) + 1e-3f);
        out_ptr[2 * n + i] = __fdividef(x, y);
        out_ptr[3 * n + i] = __frcp_rn(y);
        h_ptr[i] = __half_as_ushort(__float2half_rn(x * y));
    }
}
"""


def test_emulator_fast_intrinsics_and_half_rounding():
    if not utils.SIMULATE:
        pytest.skip("about the CPU emulator")
    k = utils.cuda_kernel(INTRINSICS, "intrinsics_kernel")
    g = torch.Generator().manual_seed(3)
    n = 4096
    x = (torch.rand(n, generator=g) * 160 - 80)
    y = torch.randn(n, generator=g) * 4
    y[:4] = torch.tensor([2.0 ** 127, -3e38, 1.5, 2.0 ** 126])  # __fdividef's documented 0 range
    out = torch.empty(4 * n)
    h = torch.empty(n, dtype=torch.int16)
    k[(n + 255) // 256, 256](x, y, out, h, n)
    e, lg, div, rcp = out.view(4, n).double()
    xd, yd = x.double(), y.double()
    # __expf: ex2.approx(x * log2 e) with the product rounded to float, as on the GPU: exactly
    # that product's exp2, and within CUDA's documented 2 + floor(|1.16 x|) ulp of exp(x).
    prod = (x * torch.tensor(1.44269502, dtype=torch.float32)).double()
    normal = torch.exp(xd) > 1.2e-38  # .ftz: subnormal results are 0
    torch.testing.assert_close(e[normal], torch.exp2(prod)[normal], rtol=2.5e-7, atol=0)
    assert (e[~normal] == 0).all()
    ulp = torch.exp(xd).float().double().abs() * 2.0 ** -23
    assert ((e - torch.exp(xd)).abs()[normal] <= (2 + (1.16 * xd.abs()).floor())[normal] * ulp[normal]).all()
    # __logf within CUDA's bound (2^-21.41 absolute for x in [0.5, 2], else 3 ulp); here 3 ulp.
    want_log = torch.log(xd.abs() + 1e-3)
    assert ((lg - want_log).abs() <= 3 * 2.0 ** -23 * want_log.abs() + 2.0 ** -21.41).all()
    # __fdividef: 0 for 2^126 < |y| < 2^128, else within 2 ulp; __frcp_rn correctly rounded.
    assert div[:2].tolist() == [0.0, 0.0] and div[3].item() != 0.0
    torch.testing.assert_close(div[4:], (xd / yd)[4:], rtol=2.5e-7, atol=0)
    assert torch.equal(rcp.float(), (1.0 / yd).float())
    # __float2half_rn: round to nearest even, as torch's .half() (and the GPU's cvt.rn.f16.f32).
    want_h = (x * y).half().view(torch.int16)
    assert torch.equal(h, want_h)
