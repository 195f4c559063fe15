"""utils.cuda_kernel: the same tests on a GPU (NVRTC) and on a CPU (the emulator).

Every kernel is checked against a torch reference computed in float64 where it matters.
"""
import math
import re
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_sources import TREE_SUM

import utils

DEV = utils.DEVICE
GEN = torch.Generator().manual_seed(1234)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN, dtype=dtype).to(DEV)


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------
# elementwise, indexing, parameters
# ---------------------------------------------------------------------------------------
SCALE = r"""
#include "common.h"
#define FACTOR_TIMES(a, v) ((a) * (v))
__device__ __forceinline__ float times(float a, float v) { return FACTOR_TIMES(a, v); }
__global__ void scale_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = times(a, x_ptr[i]);
}
"""


@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 4099])
def test_elementwise_awkward_sizes(n):
    k = utils.cuda_kernel(SCALE, "scale_kernel")
    x = randn(n)
    y = torch.full_like(x, float("nan"))
    k[(n + 127) // 128, 128](x, y, 3.0, n)
    sync()
    assert torch.equal(y, 3.0 * x)


def test_source_from_path(tmp_path):
    p = tmp_path / "scale.cu"
    p.write_text(SCALE)
    for src in (p, str(p)):
        k = utils.cuda_kernel(src, "scale_kernel")
        x = randn(100)
        y = torch.zeros_like(x)
        k[1, 128](x, y, -1.5, 100)
        sync()
        assert torch.equal(y, -1.5 * x)


def test_non_tensor_shapes_and_repr():
    k = utils.cuda_kernel(SCALE, "scale_kernel")
    assert "scale_kernel" in repr(k) and "float a" in repr(k)
    x = randn(10)
    y = torch.zeros_like(x)
    k[(1,), (16,)](x, y, 2, 10)  # an int for a float parameter is fine
    sync()
    assert torch.equal(y, 2 * x)


INDEX3D = r"""
__global__ void where_am_i(int* out) {
    int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int g = bx * (blockDim.x * blockDim.y * blockDim.z) + tx;
    int* o = out + 12 * g;
    o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
    o[3] = blockIdx.x;  o[4] = blockIdx.y;  o[5] = blockIdx.z;
    o[6] = blockDim.x;  o[7] = blockDim.y;  o[8] = blockDim.z;
    o[9] = gridDim.x;   o[10] = gridDim.y;  o[11] = gridDim.z;
}
"""


@pytest.mark.parametrize("grid,block", [(3, 5), ((2, 3), (4, 2)), ((2, 1, 3), (3, 2, 2)), (1, (8, 4, 2))])
def test_builtin_indices_1d_2d_3d(grid, block):
    k = utils.cuda_kernel(INDEX3D, "where_am_i")
    g = (grid,) if isinstance(grid, int) else grid
    b = (block,) if isinstance(block, int) else block
    g = tuple(g) + (1,) * (3 - len(g))
    b = tuple(b) + (1,) * (3 - len(b))
    nthreads = math.prod(g) * math.prod(b)
    out = torch.full((nthreads, 12), -1, dtype=torch.int32, device=DEV)
    k[grid, block](out)
    sync()
    exp = []
    for bz in range(g[2]):
        for by in range(g[1]):
            for bx in range(g[0]):
                for tz in range(b[2]):
                    for ty in range(b[1]):
                        for tx in range(b[0]):
                            exp.append([tx, ty, tz, bx, by, bz, *b, *g])
    assert torch.equal(out.cpu(), torch.tensor(exp, dtype=torch.int32))


SCALARS = r"""
__global__ void scalars(double* out, int a, unsigned b, long long c, size_t d, float e, double f, bool g,
                        unsigned long long h, long i) {
    out[0] = a; out[1] = b; out[2] = (double)c; out[3] = (double)d; out[4] = e; out[5] = f; out[6] = g;
    out[7] = (double)h; out[8] = (double)i;
}
"""


def test_scalar_parameter_types():
    k = utils.cuda_kernel(SCALARS, "scalars")
    out = torch.zeros(9, dtype=torch.float64, device=DEV)
    k[1, 1](out, -7, 4_000_000_000, -(2**40), 2**40, 0.5, 1e300, True, 2**63, -(2**35))
    sync()
    assert out.tolist() == [-7, 4_000_000_000, -(2**40), 2**40, 0.5, 1e300, 1, 2**63, -(2**35)]


TEMPLATED = r"""
template <typename T, int FACTOR>
__global__ void times_k(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * (T)FACTOR;
}
"""


def test_template_kernel():
    k = utils.cuda_kernel(TEMPLATED, "times_k<double, 3>")
    x = randn(50, dtype=torch.float64)
    y = torch.zeros_like(x)
    k[1, 64](x, y, 50)
    sync()
    assert torch.equal(y, 3 * x)
    kf = utils.cuda_kernel(TEMPLATED, "times_k<float, 2>")
    with pytest.raises(TypeError, match="float"):
        kf[1, 64](x, y, 50)  # double tensors for a float* parameter


# ---------------------------------------------------------------------------------------
# bad input: clear errors, never a crash
# ---------------------------------------------------------------------------------------
def test_bad_arguments():
    k = utils.cuda_kernel(SCALE, "scale_kernel")
    x = randn(64)
    y = torch.zeros_like(x)
    with pytest.raises(TypeError, match=r"takes 4 arguments"):
        k[1, 64](x, y, 2.0)
    with pytest.raises(TypeError, match=r"x_ptr.*float64"):
        k[1, 64](x.double(), y, 2.0, 64)
    with pytest.raises(ValueError, match="contiguous"):
        k[1, 64](randn(8, 8).t(), y, 2.0, 64)
    with pytest.raises(TypeError, match="on meta"):  # a device kernels never run on
        k[1, 64](torch.empty(64, device="meta"), y, 2.0, 64)
    if DEV.type == "cuda":
        with pytest.raises(TypeError, match="on cpu"):
            k[1, 64](x.cpu(), y, 2.0, 64)
    with pytest.raises(TypeError, match="integer"):
        k[1, 64](x, y, 2.0, 64.5)
    with pytest.raises(ValueError, match="does not fit"):
        k[1, 64](x, y, 2.0, 2**31)
    with pytest.raises(TypeError, match="tensor"):
        k[1, 64](x, 5, 2.0, 64)
    with pytest.raises(TypeError, match="number"):
        k[1, 64](x, y, torch.tensor(2.0), 64)
    with pytest.raises(ValueError, match="1024"):
        k[1, 2048](x, y, 2.0, 64)
    with pytest.raises(ValueError, match="positive"):
        k[1, 0](x, y, 2.0, 64)
    with pytest.raises(TypeError):
        k[1.5, 64](x, y, 2.0, 64)
    with pytest.raises(TypeError, match="configuration"):
        k(x, y, 2.0, 64)
    with pytest.raises(ValueError, match="shared memory"):
        k[1, 64, 1 << 20](x, y, 2.0, 64)


def test_empty_grid_is_a_no_op():
    k = utils.cuda_kernel(SCALE, "scale_kernel")
    x = torch.empty(0, device=DEV)
    y = torch.empty(0, device=DEV)
    k[0, 256](x, y, 2.0, 0)  # cdiv(0, 256) blocks: nothing to do
    sync()


def test_compile_error_points_at_the_line():
    src = "__global__ void broken(float* y) {\n    int i = threadIdx.x;\n\n    y[i] = undefined_name;\n}\n"
    with pytest.raises(utils.CudaCompileError) as e:
        utils.cuda_kernel(src, "broken")
    msg = str(e.value)
    assert "undefined_name" in msg
    assert re.search(r"broken\.cu[:(]4\b", msg), msg


def test_unknown_kernel_name():
    with pytest.raises(utils.CudaCompileError):
        utils.cuda_kernel(SCALE, "no_such_kernel")


def test_not_solved_yet_stub():
    src = "__global__ void todo_kernel(float* y, int n) {\n    // TODO (about 2 lines)\n    NOT_SOLVED_YET;\n}\n"
    k = utils.cuda_kernel(src, "todo_kernel")
    with pytest.raises(NotImplementedError, match="not solved yet: todo_kernel still has a TODO"):
        k[1, 32](torch.zeros(4, device=DEV), 4)


def test_compiled_code_is_cached():
    src = SCALE + "\n// cache probe\n"
    utils.cuda_kernel(src, "scale_kernel")
    t = time.perf_counter()
    utils.cuda_kernel(src, "scale_kernel")
    assert time.perf_counter() - t < 0.05


# ---------------------------------------------------------------------------------------
# shared memory and barriers
# ---------------------------------------------------------------------------------------
REDUCE = TREE_SUM + r"""
#define BLOCK 256
__global__ void block_sum(const float* x, float* partial, int n) {
    __shared__ float s[BLOCK];
    float total = block_tree_sum(x, s, n);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
__global__ void block_sum_dyn(const float* x, float* partial, int n) {
    extern __shared__ float s[];
    float total = block_tree_sum(x, s, n);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
"""


@pytest.mark.parametrize("n", [1, 255, 1000, 4099])
def test_static_shared_reduction(n):
    k = utils.cuda_kernel(REDUCE, "block_sum")
    x = randn(n)
    nb = (n + 255) // 256
    part = torch.full((nb,), float("nan"), device=DEV)
    k[nb, 256](x, part, n)
    sync()
    ref = torch.nn.functional.pad(x.double(), (0, nb * 256 - n)).view(nb, 256).sum(1)
    torch.testing.assert_close(part.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("block", [32, 128, 512])
def test_dynamic_shared_reduction(block):
    k = utils.cuda_kernel(REDUCE, "block_sum_dyn")
    n = 3000
    x = randn(n)
    nb = (n + block - 1) // block
    part = torch.zeros(nb, device=DEV)
    k[nb, block, block * 4](x, part, n)
    sync()
    ref = torch.nn.functional.pad(x.double(), (0, nb * block - n)).view(nb, block).sum(1)
    torch.testing.assert_close(part.double(), ref, rtol=1e-5, atol=1e-4)


STASH = r"""
// Each thread copies PER elements through its own slots of a large dynamic shared array.
__global__ void stash_copy(const float* x, float* y, int per) {
    extern __shared__ float big[];
    int t = threadIdx.x;
    for (int k = 0; k < per; k++) big[t + k * blockDim.x] = x[blockIdx.x * per * blockDim.x + t + k * blockDim.x];
    __syncthreads();
    for (int k = 0; k < per; k++) {  // read a neighbour's slot: the whole array must be there
        int j = (t + 1) % blockDim.x + k * blockDim.x;
        y[blockIdx.x * per * blockDim.x + t + k * blockDim.x] = big[j];
    }
}
"""


@pytest.mark.parametrize("shared_kib", [40, 100, 200])
def test_dynamic_shared_memory_above_48_kib(shared_kib):
    """Above 48 KiB a kernel must opt in on a GPU; the launcher does it, up to the GPU's limit
    (227 KiB on an H100). Past that limit a launch is refused before it reaches the driver."""
    if shared_kib * 1024 > utils.max_dynamic_shared():
        pytest.skip(f"this GPU gives a block at most {utils.max_dynamic_shared()} bytes of shared memory")
    k = utils.cuda_kernel(STASH, "stash_copy")
    block = 256
    per = shared_kib * 1024 // (4 * block)
    x = randn(2 * per * block)
    y = torch.full_like(x, float("nan"))
    k[2, block, per * block * 4](x, y, per)
    sync()
    ref = x.view(2, per, block).roll(-1, dims=2).reshape(-1)
    assert torch.equal(y, ref)
    with pytest.raises(ValueError, match="shared memory"):
        k[2, block, utils.max_dynamic_shared() + 16](x, y, per)


def test_random_schedule_keeps_a_correct_kernel_correct():
    k = utils.cuda_kernel(REDUCE, "block_sum")
    x = randn(2000)
    part = torch.zeros(8, device=DEV)
    with utils.emulation_schedule("random", seed=7):
        k[8, 256](x, part, 2000)
    sync()
    ref = torch.nn.functional.pad(x.double(), (0, 48)).view(8, 256).sum(1)
    torch.testing.assert_close(part.double(), ref, rtol=1e-5, atol=1e-4)


def test_emulation_schedule_rejects_unknown_modes():
    with pytest.raises(ValueError):
        with utils.emulation_schedule("backwards"):
            pass


SYNC_COUNT = r"""
__global__ void votes(const int* flags, int* out) {
    int f = flags[threadIdx.x];
    int c = __syncthreads_count(f);
    int a = __syncthreads_and(f);
    int o = __syncthreads_or(f);
    if (threadIdx.x == 0) { out[0] = c; out[1] = a; out[2] = o; }
}
"""


def test_syncthreads_count_and_or():
    k = utils.cuda_kernel(SYNC_COUNT, "votes")
    flags = (torch.rand(96, generator=GEN) < 0.3).int().to(DEV)
    out = torch.zeros(3, dtype=torch.int32, device=DEV)
    k[1, 96](flags, out)
    sync()
    s = int(flags.sum())
    assert out.tolist()[0] == s and bool(out[1]) == (s == 96) and bool(out[2]) == (s > 0)


# ---------------------------------------------------------------------------------------
# warps
# ---------------------------------------------------------------------------------------
WARPS = r"""
__global__ void warp_ops(const float* x, const int* p, float* sums, float* xors, float* scan, float* bcast,
                         unsigned* ballots, int* anys, int* alls) {
    int t = threadIdx.x, lane = t % 32, warp = t / 32;
    float v = x[t];
    // tree reduction down to lane 0
    float s = v;
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffff, s, off);
    if (lane == 0) sums[warp] = s;
    // butterfly: every lane ends with the total
    float b = v;
    for (int m = 16; m > 0; m /= 2) b += __shfl_xor_sync(0xffffffff, b, m);
    xors[t] = b;
    // inclusive scan
    float c = v;
    for (int off = 1; off < 32; off *= 2) {
        float up = __shfl_up_sync(0xffffffff, c, off);
        if (lane >= off) c += up;
    }
    scan[t] = c;
    __syncwarp();
    bcast[t] = __shfl_sync(0xffffffff, v, 5);
    unsigned bal = __ballot_sync(0xffffffff, p[t]);
    if (lane == 0) ballots[warp] = bal;
    anys[t] = __any_sync(0xffffffff, p[t]);
    alls[t] = __all_sync(0xffffffff, p[t]);
}
__global__ void shfl_width(const int* x, int* out) {
    int t = threadIdx.x;
    out[t] = __shfl_down_sync(0xffffffff, x[t], 2, 8) + 1000 * __shfl_sync(0xffffffff, x[t], 1, 8);
}
"""


def test_warp_collectives():
    k = utils.cuda_kernel(WARPS, "warp_ops")
    nt = 128
    x = torch.randint(-8, 8, (nt,), generator=GEN).float().to(DEV)  # exact in float
    p = (torch.rand(nt, generator=GEN) < 0.5).int().to(DEV)
    p[64:96] = 1  # warp 2: all true
    p[96:128] = 0  # warp 3: all false
    sums = torch.zeros(4, device=DEV)
    xors, scan, bcast = (torch.zeros(nt, device=DEV) for _ in range(3))
    ballots = torch.zeros(4, dtype=torch.int32, device=DEV)
    anys, alls = torch.zeros(nt, dtype=torch.int32, device=DEV), torch.zeros(nt, dtype=torch.int32, device=DEV)
    k[1, nt](x, p, sums, xors, scan, bcast, ballots, anys, alls)
    sync()
    xw = x.cpu().view(4, 32)
    pw = p.cpu().view(4, 32)
    assert torch.equal(sums.cpu(), xw.sum(1))
    assert torch.equal(xors.cpu(), xw.sum(1, keepdim=True).expand(4, 32).reshape(-1))
    assert torch.equal(scan.cpu(), xw.cumsum(1).reshape(-1))
    assert torch.equal(bcast.cpu(), xw[:, 5:6].expand(4, 32).reshape(-1))
    exp_ballot = [(int(sum(int(pw[w, l]) << l for l in range(32))) + 2**31) % 2**32 - 2**31 for w in range(4)]
    assert ballots.cpu().tolist() == exp_ballot
    assert torch.equal(anys.cpu(), pw.any(1, keepdim=True).int().expand(4, 32).reshape(-1))
    assert torch.equal(alls.cpu(), pw.all(1, keepdim=True).int().expand(4, 32).reshape(-1))


def test_shuffle_width_segments():
    k = utils.cuda_kernel(WARPS, "shfl_width")
    x = torch.arange(32, dtype=torch.int32, device=DEV)
    out = torch.zeros_like(x)
    k[1, 32](x, out)
    sync()
    exp = []
    for lane in range(32):
        seg = lane // 8 * 8
        down = lane + 2 if (lane - seg) + 2 < 8 else lane
        exp.append(down + 1000 * (seg + 1))
    assert out.cpu().tolist() == exp


# ---------------------------------------------------------------------------------------
# atomics
# ---------------------------------------------------------------------------------------
ATOMICS = r"""
__global__ void atomics(const int* bins_in, const float* x, int n, int* hist, float* fsum, unsigned* ucount,
                        int* imax, int* imin, int* cas_slot, int* exch) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&hist[bins_in[i]], 1);
    atomicAdd(fsum, x[i]);
    atomicAdd(ucount, 1u);
    atomicMax(imax, bins_in[i] * 7 - 3);
    atomicMin(imin, bins_in[i] * 7 - 3);
    // exactly one thread wins the compare-and-swap from -1 to its own index
    atomicCAS(cas_slot, -1, i);
    atomicExch(exch, 42);
}
"""


def test_atomics():
    k = utils.cuda_kernel(ATOMICS, "atomics")
    n = 3001
    bins = torch.randint(0, 17, (n,), generator=GEN, dtype=torch.int32).to(DEV)
    x = torch.randint(-4, 5, (n,), generator=GEN).float().to(DEV)
    hist = torch.zeros(17, dtype=torch.int32, device=DEV)
    fsum = torch.zeros(1, device=DEV)
    ucount = torch.zeros(1, dtype=torch.int32, device=DEV)
    imax = torch.full((1,), -(2**31), dtype=torch.int32, device=DEV)
    imin = torch.full((1,), 2**31 - 1, dtype=torch.int32, device=DEV)
    cas = torch.full((1,), -1, dtype=torch.int32, device=DEV)
    exch = torch.zeros(1, dtype=torch.int32, device=DEV)
    k[(n + 127) // 128, 128](bins, x, n, hist, fsum, ucount, imax, imin, cas, exch)
    sync()
    assert torch.equal(hist.cpu(), torch.bincount(bins.cpu().long(), minlength=17).int())
    assert fsum.item() == x.sum().item()  # small integers: exact in any order
    assert ucount.item() == n
    assert imax.item() == int(bins.max()) * 7 - 3 and imin.item() == int(bins.min()) * 7 - 3
    assert 0 <= cas.item() < n
    assert exch.item() == 42


# ---------------------------------------------------------------------------------------
# math, vector types, printf
# ---------------------------------------------------------------------------------------
MATH = r"""
#include <math.h>
#include <float.h>
__global__ void maths(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], a = fabsf(v) + 0.5f;
    float* o = out + 16 * i;
    o[0] = expf(v); o[1] = __expf(v); o[2] = logf(a); o[3] = tanhf(v); o[4] = erff(v);
    o[5] = sqrtf(a); o[6] = rsqrtf(a); o[7] = fmaxf(v, 0.25f); o[8] = fminf(v, 0.25f);
    o[9] = fabsf(v); o[10] = powf(a, 1.5f); o[11] = (float)min(i, 3); o[12] = (float)max(i, 3);
    o[13] = fmaxf(-INFINITY, v); o[14] = fminf(FLT_MAX, v); o[15] = (v < INFINITY) ? 1.0f : 0.0f;
}
"""


def test_math_functions():
    k = utils.cuda_kernel(MATH, "maths")
    n = 40
    x = (randn(n) * 2)
    out = torch.zeros(n, 16, device=DEV)
    k[1, 64](x, out, n)
    sync()
    d = x.double().cpu()
    a = d.abs() + 0.5
    i = torch.arange(n, dtype=torch.float64)
    ref = torch.stack([d.exp(), d.exp(), a.log(), d.tanh(), torch.erf(d), a.sqrt(), a.rsqrt(),
                       d.clamp(min=0.25), d.clamp(max=0.25), d.abs(), a.pow(1.5), i.clamp(max=3), i.clamp(min=3),
                       d, d, torch.ones(n, dtype=torch.float64)], 1)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=1e-5)


VEC = r"""
__global__ void copy4(const float4* __restrict__ x, float4* __restrict__ y, const int4* ix, int4* iy, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = __ldg(&x[i]);
        y[i] = make_float4(v.x * 2.0f, v.y + 1.0f, -v.z, v.w);
        int4 w = ix[i];
        iy[i] = make_int4(w.w, w.z, w.y, w.x);
    }
}
"""


def test_float4_int4_and_ldg():
    k = utils.cuda_kernel(VEC, "copy4")
    n4 = 37
    x = randn(n4 * 4)
    y = torch.zeros_like(x)
    ix = torch.arange(n4 * 4, dtype=torch.int32, device=DEV)
    iy = torch.zeros_like(ix)
    k[1, 64](x, y, ix, iy, n4)
    sync()
    xv = x.view(n4, 4)
    ref = torch.stack([xv[:, 0] * 2, xv[:, 1] + 1, -xv[:, 2], xv[:, 3]], 1).reshape(-1)
    assert torch.equal(y, ref)
    assert torch.equal(iy.view(n4, 4), ix.view(n4, 4).flip(1))


PRINTF = r"""
#include <cstdio>
__global__ void hello(int n) {
    if (threadIdx.x < n) printf("hello from block %d thread %d\n", blockIdx.x, threadIdx.x);
}
"""


def test_printf_reaches_python_stdout(capsys):
    k = utils.cuda_kernel(PRINTF, "hello")
    k[2, 8](2)
    sync()
    out = capsys.readouterr().out
    for b in range(2):
        for t in range(2):
            assert f"hello from block {b} thread {t}\n" in out
    assert "thread 2" not in out


# ---------------------------------------------------------------------------------------
# CHECK_INPUT / cdiv in common.h compile in both modes (the header is plain C++)
# ---------------------------------------------------------------------------------------
def test_common_header_cdiv_in_device_code():
    src = r"""
#include "common.h"
__global__ void blocks_needed(long long* out, long long n) {
    out[0] = cdiv(n, 256);
    out[1] = cdiv(1000, 256);
}
"""
    k = utils.cuda_kernel(src, "blocks_needed")
    out = torch.zeros(2, dtype=torch.int64, device=DEV)
    k[1, 1](out, 2**33 + 1)
    sync()
    assert out.tolist() == [(2**33 + 1 + 255) // 256, 4]


def test_cuda_ptx():
    try:
        ptx = utils.cuda_ptx(SCALE, "scale_kernel")
    except utils.ToolkitMissing:
        if sys.platform == "linux":
            raise  # requirements.txt installs NVRTC's wheel on Linux
        pytest.skip("no NVRTC wheel for this platform")
    assert ".entry" in ptx and "scale_kernel" in ptx
