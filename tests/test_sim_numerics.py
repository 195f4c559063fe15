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
