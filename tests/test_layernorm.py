"""LayerNorm / RMSNorm: every version against float64 on awkward shapes, bad input, and the
graders' diagnoses for the classic mistakes (one test per diagnosis)."""
from __future__ import annotations

import pytest
import torch

import kernels
import kernels.ops  # the torch.library ops (torch.ops.course.layernorm_triton)
import utils
from utils.grading import GradingError
from utils.topics import layernorm as spec

LANGS = ("cuda", "numba", "triton")
# Numba's simulator runs one Python thread per CUDA thread: its shapes stay small.
# Triton's interpreter takes about 5 ms per program here (1823 rows: 9 s a version), so its
# tall shape is 61 rows; the CUDA emulator runs 1823 rows.
SHAPES = {"cuda": [(1823, 781), (1, 1), (1, 5), (7, 1), (3, 1500)],
          "triton": [(61, 781), (1, 1), (1, 5), (7, 1), (3, 1500)],
          "numba": [(37, 781), (1, 1), (1, 5), (7, 1), (3, 1500)]}


def _close(got, want, x, w, what):
    # float32 x of a row around 1000 carries 6e-5 of rounding into y: scale atol by |x|
    scale = x.double().abs().amax(dim=-1, keepdim=True) * w.double().abs().max() if what == "y" else 1.0
    tol = 1e-5 + 4 * 2.0 ** -24 * scale * 4
    err = (got.double() - want).abs() - tol - 1e-5 * want.abs()
    assert not bool((err > 0).any()), f"{what}: max error {float((got.double() - want).abs().max()):.3g}"


def _mod(lang):
    return kernels.module("layernorm", lang)


def _params():
    return [(lang, v) for lang in LANGS for v in _mod(lang).VERSIONS]


@pytest.mark.parametrize("lang,version", _params())
def test_forward_versions(lang, version):
    f = _mod(lang).VERSIONS[version][1]
    for shape in SHAPES[lang]:
        if lang == "cuda" and version == "v2" and shape[0] == 1823:
            shape = (97, 781)  # the warp kernel's rows are short by design; one big case suffices
        x, w, b = spec.layernorm_input(shape, seed=1)
        y, mean, rstd = f(x, w, b, stats=True)
        m64, r64 = spec.layernorm_stats64(x)
        _close(y, spec.layernorm_ref64(x, w, b), x, w, "y")
        assert torch.allclose(mean.double(), m64, rtol=1e-6, atol=1e-5)
        assert torch.allclose(rstd.double(), r64, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("version", ["atomic", "partials"])
def test_backward_versions(lang, version):
    f = _mod(lang).BACKWARD_VERSIONS[version][1]
    for shape in [(37, 781), (1, 1), (1, 5), (7, 1), (3, 1500)]:
        x, w, _ = spec.layernorm_input(shape, seed=2)
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(x.device)
        mean, rstd = spec.layernorm_stats64(x)
        dx, dw, db = f(dy, x, w, mean.float(), rstd.float())
        rdx, rdw, rdb = spec.layernorm_backward_ref64(dy, x, w)
        assert torch.allclose(dx.double(), rdx, atol=1e-4, rtol=1e-4)
        assert torch.allclose(dw.double(), rdw, atol=1e-4 * shape[0], rtol=1e-4)
        assert torch.allclose(db.double(), rdb, atol=1e-4 * shape[0], rtol=1e-4)


def test_cuda_vec_backward_and_bfloat16():
    """CUDA C++ v5 and its backward: float32 with 16-byte vectors (test_rmsnorm runs rows of odd
    length through the same kernels), and bfloat16. Each instantiation of the templates is one
    more compilation for the emulator: few shapes."""
    m = _mod("cuda")
    for shape in [(37, 780)]:
        x, w, _ = spec.layernorm_input(shape, seed=2)
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(x.device)
        mean, rstd = spec.layernorm_stats64(x)
        dx, dw, db = m.layernorm_backward_vec(dy, x, w, mean.float(), rstd.float())
        rdx, rdw, rdb = spec.layernorm_backward_ref64(dy, x, w)
        assert torch.allclose(dx.double(), rdx, atol=1e-4, rtol=1e-4)
        assert torch.allclose(dw.double(), rdw, atol=1e-4 * shape[0], rtol=1e-4)
        assert torch.allclose(db.double(), rdb, atol=1e-4 * shape[0], rtol=1e-4)
    x, w, b = spec.layernorm_input((9, 264), seed=5, dtype=torch.bfloat16)
    y, mean, rstd = m.layernorm(x, w, b, stats=True)
    assert y.dtype == torch.bfloat16 and mean.dtype == torch.float32
    assert torch.allclose(y.double(), spec.layernorm_ref64(x, w, b), atol=3e-2, rtol=2e-2)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(x.device, torch.bfloat16)
    dx, dw, db = m.layernorm_backward(dy, x, w, mean, rstd)
    rdx, rdw, rdb = spec.layernorm_backward_ref64(dy, x, w, mean=mean, rstd=rstd)
    assert dw.dtype == torch.bfloat16
    assert torch.allclose(dx.double(), rdx, atol=5e-2, rtol=3e-2)
    assert torch.allclose(dw.double(), rdw, atol=0.3, rtol=3e-2)


@pytest.mark.parametrize("lang", LANGS)
def test_rmsnorm(lang):
    m = _mod(lang)
    x, w, _ = spec.layernorm_input((5, 257), seed=4)
    x = x - 1000.0 * (x.abs() > 500)  # RMSNorm keeps the mean: ordinary rows only
    y, rstd = m.rmsnorm(x, w, stats=True)
    assert torch.allclose(y.double(), spec.rmsnorm_ref64(x, w), atol=1e-5, rtol=1e-5)
    dy = torch.randn(x.shape, device=x.device)
    dx, dw = m.rmsnorm_backward(dy, x, w, rstd)
    rdx, rdw = spec.rmsnorm_backward_ref64(dy, x, w)
    assert torch.allclose(dx.double(), rdx, atol=1e-4, rtol=1e-4)
    assert torch.allclose(dw.double(), rdw, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("lang", LANGS)
def test_bad_input(lang):
    f = _mod(lang).layernorm
    x, w, b = spec.layernorm_input((6, 10))
    # non-contiguous rows: a correct result
    xt = torch.randn(10, 6, device=utils.DEVICE).t()
    _close(f(xt, w, b), spec.layernorm_ref64(xt, w, b), xt, w, "y")
    # 3-D input: rows are all leading dims
    x3 = x.reshape(2, 3, 10)
    assert f(x3, w, b).shape == (2, 3, 10)
    # empty
    assert f(x[:0], w, b).shape == (0, 10)
    with pytest.raises(ValueError, match="shape"):
        f(x, w[:5], b)
    with pytest.raises(TypeError, match="float32"):
        f(x.int(), w, b)
    with pytest.raises(ValueError, match="on"):
        f(x.to("meta"), w, b)


def test_triton_bfloat16():
    f = _mod("triton").layernorm
    x, w, b = spec.layernorm_input((5, 100), seed=5)
    x = x - 1000.0 * (x.abs() > 500)
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    y, mean, rstd = f(xb, wb, bb, stats=True)
    assert y.dtype == torch.bfloat16 and mean.dtype == torch.float32
    want = spec.layernorm_ref64(xb, wb, bb)
    assert torch.allclose(y.double(), want, **utils.tolerance(torch.bfloat16))


# ---------------------------------------------------------------------------------------
# Graders: the references pass, each classic mistake gets its diagnosis.
def _stats_fn(f):
    return lambda x, w, b: f(x, w, b, stats=True)


def test_check_layernorm_accepts_references():
    utils.check_layernorm(_stats_fn(_mod("triton").layernorm), seed=0)
    utils.check_layernorm(_stats_fn(_mod("cuda").layernorm), seed=1)


def test_check_layernorm_backward_accepts_references():
    utils.check_layernorm_backward(_mod("triton").layernorm_backward, seed=0)
    utils.check_layernorm_backward(_mod("cuda").layernorm_backward_atomic, seed=1)


def test_check_rmsnorm_accepts_reference():
    utils.check_rmsnorm(lambda x, w: _mod("triton").rmsnorm(x, w, stats=True), seed=0)


def _torch_forward(var_fn, rstd_fn):
    def f(x, w, b):
        mean = x.mean(dim=1)
        rstd = rstd_fn(var_fn(x, mean))
        return (x - mean[:, None]) * rstd[:, None] * w + b, mean, rstd
    return f


def _biased(x, mean):
    return ((x - mean[:, None]) ** 2).mean(dim=1)


def _diagnosis(check, fn, seed=0):
    with pytest.raises(GradingError) as e:
        check(fn, seed=seed)
    return str(e.value)


def test_diagnosis_unbiased_variance():
    fn = _torch_forward(lambda x, m: x.var(dim=1, unbiased=True), lambda v: 1 / torch.sqrt(v + 1e-5))
    assert "unbiased" in _diagnosis(utils.check_layernorm, fn)


def test_diagnosis_eps_outside_sqrt():
    fn = _torch_forward(_biased, lambda v: 1 / (torch.sqrt(v) + 1e-5))
    assert "outside the square root" in _diagnosis(utils.check_layernorm, fn)


def test_diagnosis_cancellation():
    fn = _torch_forward(lambda x, m: (x * x).mean(dim=1) - m * m, lambda v: 1 / torch.sqrt(v.clamp_min(0) + 1e-5))
    assert "E[x^2] - E[x]^2 cancels" in _diagnosis(utils.check_layernorm, fn)


def test_diagnosis_stats_not_saved():
    def fn(x, w, b):
        y = _mod("triton").layernorm(x, w, b)
        return y, torch.empty(x.shape[0], device=x.device), torch.empty(x.shape[0], device=x.device)
    assert "mean was never written" in _diagnosis(utils.check_layernorm, fn)


def test_diagnosis_rmsnorm_with_mean():
    def fn(x, w):
        y, m, r = _mod("triton").layernorm(x, w, torch.zeros_like(w), stats=True)
        return y, r
    assert "does not subtract the mean" in _diagnosis(utils.check_rmsnorm, fn)


def test_diagnosis_dw_one_block_only():
    ref = _mod("triton").layernorm_backward

    def fn(dy, x, w, mean, rstd):
        dx, dw, db = ref(dy, x, w, mean, rstd)
        k = min(4, x.shape[0])  # "one block" of 4 rows
        _, dw1, db1 = ref(dy[:k], x[:k], w, mean[:k], rstd[:k])
        return dx, dw1, db1
    assert "summed over one block's rows" in _diagnosis(utils.check_layernorm_backward, fn)


# Real kernels for the two race diagnoses (the emulator's race detector reports them).
MISTAKES = r"""
#include "common.h"
template <int BARRIER>
__device__ float block_sum(float v, float* scratch) {
    // BARRIER 0 is wrong: without a __syncthreads() before writing scratch, a second call
    // overwrites the first call's partials while a slow warp still reads them
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (BARRIER) __syncthreads();
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < blockDim.x / 32 ? scratch[threadIdx.x % 32] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// PLAIN_ADD 1: dw/db accumulated with a plain += across blocks (reductions right);
// PLAIN_ADD 0: atomics right, but no barrier between the two row reductions
template <int PLAIN_ADD>
__device__ void bwd(const float* dy_ptr, const float* x_ptr, const float* w, const float* mean_ptr,
                    const float* rstd_ptr, float* dx_ptr, float* dw, float* db, int cols) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* dy = dy_ptr + row * cols;
    const float* x = x_ptr + row * cols;
    float mean = mean_ptr[row], rstd = rstd_ptr[row], s1 = 0.0f, s2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float g = dy[c] * w[c];
        s1 += g * (x[c] - mean) * rstd;
        s2 += g;
    }
    float c1 = block_sum<PLAIN_ADD>(s1, scratch) / cols;
    float c2 = block_sum<PLAIN_ADD>(s2, scratch) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float xhat = (x[c] - mean) * rstd;
        dx_ptr[row * cols + c] = (dy[c] * w[c] - xhat * c1 - c2) * rstd;
        if (PLAIN_ADD) { dw[c] += dy[c] * xhat; db[c] += dy[c]; }
        else { atomicAdd(&dw[c], dy[c] * xhat); atomicAdd(&db[c], dy[c]); }
    }
}
__global__ void bwd_nobarrier_kernel(const float* dy, const float* x, const float* w, const float* mean,
                                     const float* rstd, float* dx, float* dw, float* db, int cols) {
    bwd<0>(dy, x, w, mean, rstd, dx, dw, db, cols);
}
__global__ void bwd_plainadd_kernel(const float* dy, const float* x, const float* w, const float* mean,
                                    const float* rstd, float* dx, float* dw, float* db, int cols) {
    bwd<1>(dy, x, w, mean, rstd, dx, dw, db, cols);
}
"""


def _mistake_launcher(name, threads=64):
    k = utils.cuda_kernel(MISTAKES, name)

    def fn(dy, x, w, mean, rstd):
        rows, cols = x.shape
        dx = torch.empty_like(x)
        dw = torch.zeros(cols, device=x.device)
        db = torch.zeros(cols, device=x.device)
        k[rows, threads](dy, x, w, mean, rstd, dx, dw, db, cols)
        return dx, dw, db
    return fn


@pytest.mark.skipif(not utils.SIMULATE, reason="the race detector is the emulator's")
def test_diagnosis_plain_add_across_blocks():
    msg = _diagnosis(utils.check_layernorm_backward, _mistake_launcher("bwd_plainadd_kernel"))
    assert "race" in msg and "dw" in msg and "plain +=" in msg and "scratch" not in msg


@pytest.mark.skipif(not utils.SIMULATE, reason="the race detector is the emulator's")
def test_diagnosis_missing_barrier_between_reductions():
    msg = _diagnosis(utils.check_layernorm_backward, _mistake_launcher("bwd_nobarrier_kernel"))
    assert "race" in msg and "scratch" in msg and "two row reductions" in msg


def test_autograd_and_library_op():
    m = _mod("triton")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, generator=g).to(utils.DEVICE).requires_grad_()
    w = torch.randn(5, dtype=torch.float64, generator=g).to(utils.DEVICE).requires_grad_()
    b = torch.randn(5, dtype=torch.float64, generator=g).to(utils.DEVICE).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: m.LayerNormFunction.apply(x, w, b, 1e-5), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: kernels.ops.layernorm_op(x, w, b, 1e-5)[0], (x, w, b))
    x32 = torch.randn(4, 7, device=utils.DEVICE, requires_grad=True)
    w32 = torch.randn(7, device=utils.DEVICE, requires_grad=True)
    b32 = torch.randn(7, device=utils.DEVICE, requires_grad=True)
    torch.library.opcheck(kernels.ops.layernorm_op, (x32, w32, b32, 1e-5),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("lang", ["cuda", "numba", "triton"])
def test_a_shape_mismatch_names_both_shapes_as_tuples(lang):
    """The launchers' fast path (2-D inputs) gives the same messages as the general one."""
    mod = kernels.module("layernorm", lang)
    dev = utils.DEVICE
    x, w, b = torch.randn(4, 8, device=dev), torch.ones(8, device=dev), torch.zeros(8, device=dev)
    _, mean, rstd = mod.layernorm(x, w, b, stats=True)
    dy = torch.randn(2, 8, device=dev)
    with pytest.raises(ValueError, match=r"dy must have x's shape \(4, 8\), got \(2, 8\)"):
        mod.layernorm_backward(dy, x, w, mean, rstd)
    with pytest.raises(ValueError, match=r"w must have shape \(8,\) \(x's last dim\), got \(9,\)"):
        mod.layernorm(x, torch.ones(9, device=dev), b)
