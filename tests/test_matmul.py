"""Lesson 06, matrix multiplication: every version of every language against the float64
reference on awkward shapes, the launchers' input rules, the emulator's half precision and
wmma (with the GPU's rules), and check_matmul: a diagnosis for each classic mistake, and
right kernels written differently accepted."""
from __future__ import annotations

import re

import pytest
import torch

import kernels
import utils
from utils.topics.matmul import make_inputs, tolerance_for

CASES = [("cuda", "matmul", v) for v in ("v1", "v2", "v3", "v4")] + [
    ("cuda", "matmul_fp16", "v5"), ("numba", "matmul", "v1"), ("numba", "matmul", "v2"), ("numba", "matmul_fp16", "v1"),
    ("triton", "matmul", "v1"), ("triton", "matmul_fp16", "v2"), ("triton", "matmul_fp16", "v3")]
SHAPES = [(37, 45, 29), (1, 1, 1), (20, 7, 1), (130, 132, 36), (5, 3, 0), (0, 4, 3), (4, 0, 3)]


def _dtype(topic):
    return torch.float16 if topic == "matmul_fp16" else torch.float32


def _close(got, a, b, dtype):
    ref = a.double() @ b.double()
    tol = tolerance_for(a, b, ref, dtype=dtype)
    assert got.shape == ref.shape
    assert got.dtype in (torch.float32, dtype)
    torch.testing.assert_close(got.double(), ref, atol=tol["atol"], rtol=tol["rtol"])


@pytest.mark.parametrize("lang,topic,version", CASES)
def test_versions_match_reference(lang, topic, version):
    fn = kernels.get(topic, lang, version)
    dtype = _dtype(topic)
    for shape in SHAPES:
        if lang == "numba" and shape[0] * shape[1] * max(shape[2], 1) > 50_000:
            continue  # the Numba simulator runs one Python thread per CUDA thread
        a, b = make_inputs(shape, seed=sum(shape), dtype=dtype)
        _close(fn(a, b), a, b, dtype)


@pytest.mark.parametrize("lang,topic,version", CASES)
def test_transposed_and_sliced_inputs(lang, topic, version):
    fn = kernels.get(topic, lang, version)
    dtype = _dtype(topic)
    a, _ = make_inputs((24, 1, 40), seed=1, dtype=dtype)
    bt, _ = make_inputs((20, 1, 40), seed=2, dtype=dtype)
    b = bt.t()                      # (40, 20), not contiguous
    a_sliced = torch.cat([a, a], dim=1)[:, ::2]  # every other column: strided
    _close(fn(a, b), a, b, dtype)
    _close(fn(a_sliced, b), a_sliced, b, dtype)


@pytest.mark.parametrize("lang,topic,version", CASES)
def test_bad_inputs_are_refused_clearly(lang, topic, version):
    fn = kernels.get(topic, lang, version)
    dtype = _dtype(topic)
    dev = utils.DEVICE
    a = torch.zeros(4, 3, dtype=dtype, device=dev)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        fn(a, torch.zeros(4, 2, dtype=dtype, device=dev))
    with pytest.raises(TypeError, match="must be"):
        fn(a.double(), torch.zeros(3, 2, device=dev).double())
    with pytest.raises(ValueError, match="2-D"):
        fn(a.reshape(-1), torch.zeros(3, 2, dtype=dtype, device=dev))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn([[1.0]], torch.zeros(1, 1, dtype=dtype, device=dev))
    if dev.type == "cuda":
        with pytest.raises(ValueError, match="move it"):
            fn(a.cpu(), torch.zeros(3, 2, dtype=dtype))


def test_vec4_shapes_and_fallback():
    from kernels.cuda import matmul as cm
    for name in cm.VEC4_KERNELS:
        a, b = make_inputs((70, 68, 36), seed=3)
        _close(cm.matmul_vec4(a, b, name), a, b, torch.float32)
    a, b = make_inputs((33, 35, 31), seed=4)  # K, N not multiples of 4: v3 runs
    _close(cm.matmul_vec4(a, b), a, b, torch.float32)


def test_wmma_bf16_and_scalar_loads():
    from kernels.cuda.matmul import matmul_wmma
    for shape in [(64, 64, 64), (70, 36, 20), (17, 9, 5)]:  # vec8 path and element-wise path
        a, b = make_inputs(shape, seed=5, dtype=torch.bfloat16)
        _close(matmul_wmma(a, b), a, b, torch.bfloat16)


# ---------------------------------------------------------------------------------------
# The emulator: half precision and wmma.
# ---------------------------------------------------------------------------------------
HALF_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__global__ void round_trip_kernel(const float* x_ptr, float* h_ptr, float* b_ptr, __half* hs_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half h = __float2half(x_ptr[i]);
    h_ptr[i] = __half2float(h);
    b_ptr[i] = __bfloat162float(__float2bfloat16(x_ptr[i]));
    hs_ptr[i] = __hadd(h, __float2half(1.0f));
}
__global__ void half_sum_kernel(const __half* x_ptr, const __nv_bfloat16* y_ptr, float* out_ptr, int n) {
    __half s = __float2half(0.0f);
    float t = 0.0f;
    for (int i = 0; i < n; ++i) { s = __hfma(x_ptr[i], x_ptr[i], s); t += __bfloat162float(y_ptr[i]); }
    out_ptr[0] = __half2float(s);
    out_ptr[1] = t;
}
"""


@pytest.mark.skipif(not utils.SIMULATE, reason="tests the CPU emulator's headers")
def test_emulated_half_conversions_round_like_torch():
    vals = [0.0, -0.0, 1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 1e6, -1e6,
            2**-24, 2**-25, 1.5 * 2**-25, 2**-14, 3 * 2**-16, 1e-8, float("inf"), float("-inf"), 3.14159, -2.71828]
    x = torch.tensor(vals + torch.randn(4000).mul(100).tolist(), dtype=torch.float32)
    n = x.numel()
    h, bb = torch.empty(n), torch.empty(n)
    hs = torch.empty(n, dtype=torch.float16)
    utils.cuda_kernel(HALF_SRC, "round_trip_kernel")[(n + 127) // 128, 128](x, h, bb, hs, n)
    assert torch.equal(h, x.half().float())
    assert torch.equal(bb, x.bfloat16().float())
    assert torch.equal(hs, x.half() + torch.tensor(1.0, dtype=torch.float16))
    nan = torch.tensor([float("nan")])
    utils.cuda_kernel(HALF_SRC, "round_trip_kernel")[1, 32](nan, h[:1], bb[:1], hs[:1], 1)
    assert torch.isnan(h[0]) and torch.isnan(bb[0])


@pytest.mark.skipif(not utils.SIMULATE, reason="tests the CPU emulator's argument checks")
def test_half_pointer_needs_a_half_tensor():
    k = utils.cuda_kernel(HALF_SRC, "half_sum_kernel")
    out = torch.empty(2)
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    y = torch.tensor([0.5, 0.25, 4.0], dtype=torch.bfloat16)
    k[1, 1](x, y, out, 3)
    assert out.tolist() == [14.0, 4.75]
    with pytest.raises(TypeError, match="__half"):
        k[1, 1](x.float(), y, out, 3)
    with pytest.raises(TypeError, match="__nv_bfloat16"):
        k[1, 1](x, y.half(), out, 3)


WMMA_SRC = r"""
#include <mma.h>
using namespace nvcuda;
// One warp: C (16x16, float) = A (16x16) @ B (16x16), A and B at a_ptr + offset with
// leading dimension ldm; `lanes`: how many lanes take part in the load.
__global__ void wmma_one_kernel(const __half* a_ptr, const __half* b_ptr, float* c_ptr, int offset, int ldm, int lanes) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
    if (threadIdx.x < lanes) wmma::load_matrix_sync(a, a_ptr + offset, ldm);
    else __syncwarp();
    wmma::load_matrix_sync(b, b_ptr, 16);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(c_ptr, c, 16, wmma::mem_row_major);
}
"""  # noqa: E501  (a kernel's signature on one line)


def _wmma(a, b, offset=0, ldm=16, lanes=32, threads=32):
    c = torch.zeros(16, 16)
    utils.cuda_kernel(WMMA_SRC, "wmma_one_kernel")[1, threads](a, b, c, offset, ldm, lanes)
    return c


@pytest.mark.skipif(not utils.SIMULATE, reason="tests the CPU emulator's wmma rules")
def test_emulated_wmma_computes_and_enforces_the_rules():
    a = torch.randn(16 * 32 + 32).half()
    b = torch.randn(16, 16).half()
    got = _wmma(a, b)
    ref = a[:256].float().reshape(16, 16) @ b.float().t()  # b is loaded col_major: B^T of the buffer
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    got = _wmma(a, b, offset=16, ldm=32)  # 32-byte aligned, rows 32 elements apart
    ref = a[16:16 + 512].float().reshape(16, 32)[:, :16] @ b.float().t()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(utils.KernelFault, match="not 32-byte"):
        _wmma(a, b, offset=8)
    with pytest.raises(utils.KernelFault, match="multiple of 16 bytes"):
        _wmma(a, b, ldm=20)
    with pytest.raises(utils.KernelFault, match="shorter than a row"):
        _wmma(a, b, ldm=8)
    with pytest.raises(utils.KernelFault, match="every lane of a warp must take part"):
        _wmma(a, b, lanes=16)
    with pytest.raises(utils.KernelFault, match="all 32 lanes"):
        _wmma(a, b, threads=16)


# ---------------------------------------------------------------------------------------
# check_matmul: right kernels written differently, and the classic mistakes.
# ---------------------------------------------------------------------------------------
GRADER_SRC = r"""
#define T 16
__global__ void naive_1d_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // one flat index per output
    if (i >= (long long)M * N) return;
    int row = i / N, col = i % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a_ptr[(long long)row * K + k] * b_ptr[(long long)k * N + col];
    c_ptr[i] = acc;
}
__global__ void naive_b_transposed_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a_ptr[row * K + k] * b_ptr[col * K + k];  // B read as (N, K)
    c_ptr[row * N + col] = acc;
}
// Tiles of T x T, looping over tiles of C with a grid-stride loop (few blocks, any shape).
// BARRIER1 / BARRIER2 / MASK_K remove one piece each, for the mistakes below.
template <int BARRIER1, int BARRIER2, int MASK_K>
__device__ void tiled(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    __shared__ float as[T][T];
    __shared__ float bs[T][T];
    int tx = threadIdx.x, ty = threadIdx.y;
    int tiles_n = (N + T - 1) / T, tiles = ((M + T - 1) / T) * tiles_n;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int row = (t / tiles_n) * T + ty, col = (t % tiles_n) * T + tx;
        float acc = 0.0f;
        for (int k0 = 0; k0 < K; k0 += T) {
            bool ka = MASK_K ? k0 + tx < K : true, kb = MASK_K ? k0 + ty < K : true;
            as[ty][tx] = (row < M && ka) ? a_ptr[row * K + k0 + tx] : 0.0f;
            bs[ty][tx] = (kb && col < N) ? b_ptr[(k0 + ty) * N + col] : 0.0f;
            if (BARRIER1) __syncthreads();
            for (int k = 0; k < T; ++k) acc += as[ty][k] * bs[k][tx];
            if (BARRIER2) __syncthreads();
        }
        if (row < M && col < N) c_ptr[row * N + col] = acc;
    }
}
__global__ void tiled_stride_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    tiled<1, 1, 1>(a_ptr, b_ptr, c_ptr, M, N, K);
}
__global__ void tiled_no_load_barrier_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    tiled<0, 1, 1>(a_ptr, b_ptr, c_ptr, M, N, K);
}
__global__ void tiled_no_overwrite_barrier_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    tiled<1, 0, 1>(a_ptr, b_ptr, c_ptr, M, N, K);
}
__global__ void tiled_unmasked_k_kernel(const float* a_ptr, const float* b_ptr, float* c_ptr, int M, int N, int K) {
    tiled<1, 1, 0>(a_ptr, b_ptr, c_ptr, M, N, K);
}
"""  # noqa: E501  (the kernels' signatures on one line each)

HALF_ACC_SRC = r"""
#include <cuda_fp16.h>
__global__ void half_acc_kernel(const __half* a_ptr, const __half* b_ptr, float* c_ptr, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    __half acc = __float2half(0.0f);  // the mistake: a float16 running sum
    for (int k = 0; k < K; ++k) acc = __hfma(a_ptr[row * K + k], b_ptr[k * N + col], acc);
    c_ptr[row * N + col] = __half2float(acc);
}
"""


def _launcher(src, name, kind):
    def fn(a, b):
        a, b = a.contiguous(), b.contiguous()
        M, K = a.shape
        N = b.shape[1]
        c = torch.zeros(M, N, device=a.device)
        if c.numel() == 0:
            return c
        k = utils.cuda_kernel(src, name)
        if kind == "1d":
            k[max(1, (M * N + 127) // 128), 128](a, b, c, M, N, K)
        elif kind == "2d":
            k[((N + 15) // 16, (M + 15) // 16), (16, 16)](a, b, c, M, N, K)
        else:  # a few blocks walking over all tiles
            k[3, (16, 16)](a, b, c, M, N, K)
        return c
    return fn


from numba import cuda as _cuda  # noqa: E402  (after utils: simulator or GPU)
from numba import float32 as _float32  # noqa: E402


@_cuda.jit
def _numba_tiled8_kernel(a, b, c):
    """A Numba tiled matmul with 8 x 8 tiles (the course's uses 16 x 16)."""
    sa = _cuda.shared.array((8, 8), _float32)
    sb = _cuda.shared.array((8, 8), _float32)
    tx, ty = _cuda.threadIdx.x, _cuda.threadIdx.y
    row, col = _cuda.blockIdx.y * 8 + ty, _cuda.blockIdx.x * 8 + tx
    acc = _float32(0.0)
    for k0 in range(0, a.shape[1], 8):
        sa[ty, tx] = a[row, k0 + tx] if row < a.shape[0] and k0 + tx < a.shape[1] else 0.0
        sb[ty, tx] = b[k0 + ty, col] if k0 + ty < b.shape[0] and col < b.shape[1] else 0.0
        _cuda.syncthreads()
        for k in range(8):
            acc += sa[ty, k] * sb[k, tx]
        _cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


def _numba_tiled_8(a, b):
    c = torch.zeros(a.shape[0], b.shape[1], device=a.device)
    if c.numel():
        _numba_tiled8_kernel[((b.shape[1] + 7) // 8, (a.shape[0] + 7) // 8), (8, 8)](
            utils.to_numba(a.contiguous()), utils.to_numba(b.contiguous()), utils.to_numba(c))
    return c


@pytest.mark.parametrize("fn", [
    _launcher(GRADER_SRC, "naive_1d_kernel", "1d"),
    _launcher(GRADER_SRC, "tiled_stride_kernel", "stride"),
], ids=["cuda-1d-launch", "cuda-grid-stride-tiles-16"])
def test_check_matmul_accepts_right_kernels(fn, capsys):
    utils.check_matmul(fn)
    assert "check_matmul: correct on" in capsys.readouterr().out


def test_check_matmul_accepts_numba_with_other_tiles(capsys):
    utils.check_matmul(_numba_tiled_8)
    assert "correct on" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_check_matmul_half_inputs(dtype, capsys):
    utils.check_matmul(kernels.get("matmul_fp16", "cuda"), dtype=dtype)
    fp32 = kernels.get("matmul", "cuda")  # a float32 product, rounded once to the half type
    utils.check_matmul(lambda a, b: fp32(a.float(), b.float()).to(dtype), dtype=dtype)
    assert capsys.readouterr().out.count("correct on") == 2


def test_check_matmul_accepts_a_clear_refusal_of_strided_input(capsys):
    def strict(a, b):
        if not (a.is_contiguous() and b.is_contiguous()):
            raise ValueError("matmul: a and b must be contiguous")
        return kernels.get("matmul", "cuda")(a, b)
    utils.check_matmul(strict)
    assert "refuses a transposed B clearly" in capsys.readouterr().out


def _rejects(fn, pattern, **kw):
    with pytest.raises(utils.GradingError) as e:
        utils.check_matmul(fn, seed=7, **kw)
    assert re.search(pattern, str(e.value), re.S), str(e.value)


def test_check_matmul_transposed_index():
    _rejects(_launcher(GRADER_SRC, "naive_b_transposed_kernel", "2d"), r"B is read transposed")


def test_check_matmul_transposed_index_square_probe():
    # On square matrices the same kernel stays in bounds and computes A @ B^T: named as such.
    fn = _launcher(GRADER_SRC, "naive_b_transposed_kernel", "2d")
    from utils.topics import matmul as spec
    with pytest.raises(utils.GradingError):
        utils.check_matmul(fn, seed=1)
    a, b = make_inputs(utils.SIZES.matmul_probe_shape, seed=1)
    torch.testing.assert_close(fn(a, b), a @ b.t(), atol=1e-4, rtol=1e-4)
    assert any("B is read transposed" in text for _, text in spec._alternatives(a, b))


@pytest.mark.skipif(not utils.SIMULATE, reason="the emulator's NaN-filled shared memory makes this deterministic")
@pytest.mark.parametrize("kernel,race,without_detection", [
    ("tiled_no_load_barrier_kernel", r"data race on `as\[", r"between loading a tile and using it"),
    ("tiled_no_overwrite_barrier_kernel", r"data race on `[ab]s\[", r"before the next tile overwrites")],
    ids=["after_load", "before_overwrite"])
def test_check_matmul_missing_barrier(kernel, race, without_detection):
    fn = _launcher(GRADER_SRC, kernel, "stride")
    # The race detector names both lines and the barrier that is missing between them ...
    _rejects(fn, race + r".*__syncthreads\(\) between line \d+ and line \d+")
    # ... and without it the grader still tells this mistake from the others.
    with utils.race_detection(False):
        _rejects(fn, without_detection)


def test_check_matmul_unmasked_tile_edges():
    _rejects(_launcher(GRADER_SRC, "tiled_unmasked_k_kernel", "stride"), r"edges masked")


def test_check_matmul_unmasked_edges_without_fault(allow_torch_ops):
    # A kernel whose edge tiles read neighbouring rows (in bounds): named an edge problem.
    # torch stands in for that kernel here, so the check that a kernel computed the result
    # is told to let torch's product through (an empty product is right whoever computes it).
    allow_torch_ops("check_matmul", {"mm", "cat"})

    def fn(a, b):
        M, K = a.shape
        pad = torch.cat([a, torch.ones(M, 16, device=a.device)], dim=1)  # garbage past column K
        K16 = ((K + 15) // 16) * 16
        return pad[:, :K16] @ torch.cat([b, torch.ones(K16 - K, b.shape[1], device=b.device)], dim=0)
    _rejects(fn, r"edges masked")


def test_check_matmul_accumulating_in_half():
    fn = _launcher(HALF_ACC_SRC, "half_acc_kernel", "2d")
    _rejects(fn, r"accumulated in\s+float16", dtype=torch.float16)


def test_check_matmul_reports_not_solved_yet():
    def stub(a, b):
        raise NotImplementedError("not solved yet: write the kernel")
    with pytest.raises(utils.GradingError, match="not solved yet"):
        utils.check_matmul(stub)
