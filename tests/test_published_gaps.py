"""Patterns of published CUDA code that the emulator once refused
(benchmarks/simulators/published_survey.py): cooperative-groups tiles of several warps, a kernel
whose source also has a grid-synchronizing kernel, `extern __shared__` in a header of the
kernel's folder, a `half` passed by value."""
import struct

import pytest
import torch

import utils

emulator_only = pytest.mark.skipif(not utils.SIMULATE, reason="what the CPU emulator reports on its own")

# ---------------------------------------------------------------------------------------
# Tiles of several warps (CUDA 12: 64 to 1024 threads)
# ---------------------------------------------------------------------------------------
MULTI_WARP = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cooperative_groups/scan.h>
namespace cg = cooperative_groups;

template <class T, class Group> __device__ T group_sum(T v, Group& g) { return cg::reduce(g, v, cg::plus<T>()); }

// As the reduction sample's multi-warp kernel: partial sums per tile, then one per block.
template <class T, size_t BlockSize, size_t TileSize>
__global__ void tile_reduce(const T* in, T* out, unsigned n) {
    extern __shared__ unsigned char smem[];
    T* partial = reinterpret_cast<T*>(smem);
    __shared__ cg::block_tile_memory<BlockSize> scratch;
    auto block = cg::this_thread_block(scratch);
    auto tile = cg::tiled_partition<TileSize>(block);
    T v = 0;
    for (unsigned i = blockIdx.x * BlockSize + threadIdx.x; i < n; i += BlockSize * gridDim.x) v += in[i];
    v = group_sum(v, tile);
    if (tile.thread_rank() == 0) partial[tile.meta_group_rank()] = v;
    cg::sync(block);
    if (threadIdx.x == 0) {
        T total = 0;
        for (unsigned k = 0; k < tile.meta_group_size(); ++k) total += partial[k];
        out[blockIdx.x] = total;
    }
}

// The other collectives of such a tile, and its barrier between warps.
template <int TileSize>
__global__ void tile_collectives(const int* x, int* scan, int* from_rank5, int* votes, int* rotated) {
    __shared__ int s[1024];
    auto tile = cg::tiled_partition<TileSize>(cg::this_thread_block());
    int v = x[threadIdx.x];
    scan[threadIdx.x] = cg::inclusive_scan(tile, v, cg::plus<int>());
    from_rank5[threadIdx.x] = tile.shfl(v, 5);
    votes[threadIdx.x] = tile.any(v > 90) + 2 * tile.all(v >= 0);
    s[threadIdx.x] = v;
    tile.sync();
    int base = threadIdx.x - tile.thread_rank();
    rotated[threadIdx.x] = s[base + (tile.thread_rank() + 32) % TileSize];
}
"""


def test_a_tile_of_two_warps_reduces_as_in_the_reduction_sample():
    n, blocks = 5000, 8
    x = torch.randn(n, device=utils.DEVICE)
    out = torch.full((blocks,), float("nan"), device=utils.DEVICE)
    utils.cuda_kernel(MULTI_WARP, "tile_reduce<float, 256, 64>")[blocks, 256, 256 * 4](x, out, n)
    block_of = (torch.arange(n) // 256) % blocks  # the grid-stride loop's share of each block
    want = torch.zeros(blocks, dtype=torch.float64).index_add_(0, block_of, x.cpu().double())
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("tile", [64, 256])
def test_tiles_of_several_warps_scan_shuffle_vote_and_sync(tile):
    block = 512
    x = torch.randint(0, 90, (block,), dtype=torch.int32, device=utils.DEVICE)
    x[3 * tile // 2] = 95  # one tile (the second) has a value above 90
    outs = [torch.full((block,), -1, dtype=torch.int32, device=utils.DEVICE) for _ in range(4)]
    utils.cuda_kernel(MULTI_WARP, f"tile_collectives<{tile}>")[1, block](x, *outs)
    scan, from_rank5, votes, rotated = (o.cpu().view(-1, tile) for o in outs)
    xs = x.cpu().view(-1, tile)
    assert torch.equal(scan, xs.cumsum(1).int())
    assert torch.equal(from_rank5, xs[:, 5:6].expand(-1, tile))
    assert torch.equal(votes, (2 + (xs > 90).any(1, keepdim=True).int()).expand(-1, tile))
    assert torch.equal(rotated, xs.roll(-32, 1))


@emulator_only
def test_a_tile_barrier_orders_its_warps_but_not_other_tiles():
    src = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void neighbours(int* out, int other_tile) {
    __shared__ int s[256];
    auto tile = cg::tiled_partition<128>(cg::this_thread_block());
    s[threadIdx.x] = threadIdx.x;
    tile.sync();
    int base = threadIdx.x - tile.thread_rank();
    if (other_tile) base = (base + 128) % 256;
    out[threadIdx.x] = s[base + (tile.thread_rank() + 64) % 128];
}
"""
    out = torch.zeros(256, dtype=torch.int32, device=utils.DEVICE)
    k = utils.cuda_kernel(src, "neighbours")
    k[1, 256](out, 0)
    assert torch.equal(out.cpu().view(2, 128), torch.arange(256, dtype=torch.int32).view(2, 128).roll(-64, 1))
    with pytest.raises(utils.KernelRace, match="data race"):
        k[1, 256](out, 1)


@emulator_only
@pytest.mark.parametrize("body, block, what", [
    ("if (threadIdx.x < 100) t.sync();", 256, "that some threads of the tile never reach"),
    ("t.sync();", 96, "a block of 96 threads does not divide into tiles of 64 threads"),
    ("p[0] = t.shfl(1, threadIdx.x % 2);", 64, "every thread must name the same one"),
])
def test_what_a_tile_of_several_warps_cannot_do_is_reported(body, block, what):
    src = ("#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n"
           "__global__ void k(int* p) {\n    auto t = cg::tiled_partition<64>(cg::this_thread_block());\n"
           f"    {body}\n}}\n")
    with pytest.raises(utils.KernelFault, match=what):
        utils.cuda_kernel(src, "k")[1, block](torch.zeros(1, dtype=torch.int32, device=utils.DEVICE))


@emulator_only
@pytest.mark.parametrize("body, what", [
    ("p[0] = t.shfl_down(p[0], 1);", "shfl_down: CUDA has it for tiles of at most 32 threads only"),
    ("p[0] = t.ballot(p[0] > 0);", "ballot: CUDA has it for tiles of at most 32 threads only"),
    ("p[0] = cg::reduce(t, make_double2(1, 1), [](double2 a, double2 b) { return a; }).x;",
     "values of at most 8 bytes"),
])
def test_what_cuda_does_not_give_a_tile_of_several_warps_does_not_compile(body, what, monkeypatch):
    from runtime.backends.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)  # the emulator's own message (NVRTC refuses it too)
    src = ("#include <cooperative_groups.h>\n#include <cooperative_groups/reduce.h>\n"
           "namespace cg = cooperative_groups;\n"
           "__global__ void k(double* p) {\n    auto t = cg::tiled_partition<64>(cg::this_thread_block());\n"
           f"    {body}\n}}\n")
    with pytest.raises(utils.CudaCompileError, match=what):
        utils.cuda_kernel(src, "k")


# ---------------------------------------------------------------------------------------
# A source with a kernel that synchronizes its grid
# ---------------------------------------------------------------------------------------
GRID = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__device__ int aggregated_increment(int* counter) {
    cg::coalesced_group active = cg::coalesced_threads();
    int first = 0;
    if (active.thread_rank() == 0) first = atomicAdd(counter, active.size());
    return active.shfl(first, 0) + active.thread_rank();
}

__global__ void keep_positive(int* dst, int* count, const int* src, int n) {
    for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += gridDim.x * blockDim.x)
        if (src[i] > 0) dst[aggregated_increment(count)] = src[i];
}

__global__ void grid_ranks(long long* out) {
    cg::grid_group grid = cg::this_grid();
    out[grid.thread_rank()] = grid.size();
}

__device__ void wait_for_all_blocks(cg::grid_group& g) { g.sync(); }

__global__ void two_phase(int* x) {
    cg::grid_group grid = cg::this_grid();
    x[grid.thread_rank()] += 1;
    wait_for_all_blocks(grid);
    x[(grid.thread_rank() + blockDim.x) % grid.size()] *= 2;
}

#define GRID_SYNC(g) g.sync()
__global__ void two_phase_in_a_macro(int* x) {
    auto grid = cg::this_grid();
    x[grid.thread_rank()] += 1;
    GRID_SYNC(grid);
}
"""


def test_a_kernel_runs_beside_one_that_synchronizes_its_grid():
    n = 3000
    src = torch.randint(-10, 10, (n,), dtype=torch.int32, device=utils.DEVICE)
    dst = torch.full((n,), -1, dtype=torch.int32, device=utils.DEVICE)
    count = torch.zeros(1, dtype=torch.int32, device=utils.DEVICE)
    utils.cuda_kernel(GRID, "keep_positive")[4, 256](dst, count, src, n)
    want = src[src > 0]
    assert int(count) == want.numel()
    assert torch.equal(dst[:want.numel()].sort().values, want.sort().values)
    ranks = torch.zeros(3 * 64, dtype=torch.int64, device=utils.DEVICE)
    utils.cuda_kernel(GRID, "grid_ranks")[3, 64](ranks)  # this_grid() without its sync: any launch
    assert ranks.tolist() == [3 * 64] * (3 * 64)


@emulator_only
def test_only_the_kernel_that_synchronizes_its_grid_is_refused():
    with pytest.raises(utils.CudaCompileError, match=r"does not support grid-wide synchronization "
                                                     r"\(`g\.sync\(\)`\); this kernel runs only on a GPU"):
        utils.cuda_kernel(GRID, "two_phase")
    # a sync that the source's text hides stops the launch that reaches it
    k = utils.cuda_kernel(GRID, "two_phase_in_a_macro")
    with pytest.raises(utils.KernelFault, match="does not support grid-wide synchronization"):
        k[2, 32](torch.zeros(64, dtype=torch.int32, device=utils.DEVICE))


# ---------------------------------------------------------------------------------------
# `extern __shared__` in a header beside the kernel
# ---------------------------------------------------------------------------------------
def test_dynamic_shared_memory_declared_in_a_header_of_the_kernels_folder(tmp_path):
    (tmp_path / "shared_memory.cuh").write_text(r"""#ifndef SHARED_MEMORY_CUH
#define SHARED_MEMORY_CUH
// one name per type: extern __shared__ arrays of one name must have one type
template <typename T> struct Shared;
template <> struct Shared<float> {
    __device__ float* pointer() { extern __shared__ float shared_f32[]; return shared_f32; }
};
template <> struct Shared<int> {
    __device__ int* pointer() { extern __shared__ int shared_i32[]; return shared_i32; }
};
#include "detail/scale.cuh"
#endif
""")
    (tmp_path / "detail").mkdir()
    (tmp_path / "detail" / "scale.cuh").write_text(
        "template <class T> __device__ T scaled(T v) {\n    static __shared__ int factor;\n"
        "    if (threadIdx.x == 0) factor = blockDim.x;\n    __syncthreads();\n    return v * (T)factor;\n}\n")
    src = tmp_path / "templates.cu"
    src.write_text(r"""#include "shared_memory.cuh"
template <class T> __global__ void scale_by_block(const T* in, T* out) {
    Shared<T> smem;
    T* s = smem.pointer();
    s[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = scaled(s[(threadIdx.x + 1) % blockDim.x]);
}
""")
    x = torch.randn(32, device=utils.DEVICE)
    y = torch.full_like(x, float("nan"))
    utils.cuda_kernel(src, "scale_by_block<float>")[1, 32, 32 * 4](x, y)
    torch.testing.assert_close(y, 32 * x.roll(-1))
    xi = torch.arange(64, dtype=torch.int32, device=utils.DEVICE)
    yi = torch.zeros_like(xi)
    utils.cuda_kernel(src, "scale_by_block<int>")[1, 64, 64 * 4](xi, yi)
    assert torch.equal(yi, 64 * xi.roll(-1))


@emulator_only
def test_an_error_in_a_header_of_the_kernels_folder_names_the_header(tmp_path):
    (tmp_path / "helpers.cuh").write_text("#pragma once\n\n"
                                          "__device__ float twice(float v) { return 2 * v + missing; }\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "helpers.cuh"\n__global__ void k(float* p) { p[0] = twice(p[0]); }\n')
    with pytest.raises(utils.CudaCompileError, match=r"helpers\.cuh:3:\d+: error: .missing. was not declared"):
        utils.cuda_kernel(src, "k")


@emulator_only
def test_a_function_that_the_file_declares_but_another_file_defines_is_named(monkeypatch):
    # the reduction sample's host wrapper calls isPow2, which another file of the sample defines
    from runtime.backends.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)  # host code: NVRTC sees the device part only
    src = ('extern "C" bool isPow2(unsigned x);\n__global__ void k(int* p) { p[0] = 1; }\n'
           "void launch(int* p, unsigned n) { if (isPow2(n)) k<<<1, 1>>>(p); }\n")
    with pytest.raises(utils.CudaCompileError, match="`isPow2` is declared but not defined in this source"):
        utils.cuda_kernel(src, "k")


# ---------------------------------------------------------------------------------------
# A half passed by value
# ---------------------------------------------------------------------------------------
HALF = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__global__ void haxpy(int n, half a, const half* x, half* y) {
    for (int i = threadIdx.x + blockDim.x * blockIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = __float2half(__half2float(a) * __half2float(x[i]) + __half2float(y[i]));
}
__global__ void fill(__half a, __nv_bfloat16 b, __half* h, __nv_bfloat16* bf) {
    h[threadIdx.x] = a;
    bf[threadIdx.x] = b;
}
"""


def _bits(t):
    return t.view(torch.int16).item() & 0xFFFF


def test_a_half_passed_by_value():
    n = 1001
    x = torch.randn(n, device=utils.DEVICE).half()
    y = torch.randn(n, device=utils.DEVICE).half()
    want = (2.0 * x.float() + y.float()).half()
    utils.cuda_kernel(HALF, "haxpy")[4, 256](n, 2.0, x, y)
    torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3)

    k = utils.cuda_kernel(HALF, "fill")
    h = torch.zeros(2, dtype=torch.float16, device=utils.DEVICE)
    bf = torch.zeros(2, dtype=torch.bfloat16, device=utils.DEVICE)
    # rounded to nearest even from the double, as __double2half does (through float it would be 1.0)
    v = 1 + 2**-11 + 2**-40
    k[1, 2](v, v, h, bf)
    assert _bits(h[0]) == 0x3C01 and _bits(bf[0]) == 0x3F80
    k[1, 2](0.1, -1e-40, h, bf)  # -1e-40: the smallest bfloat16 subnormal, 2^-133, is the nearest
    assert _bits(h[0]) == struct.unpack("<H", struct.pack("<e", 0.1))[0] and _bits(bf[0]) == 0x8001
    k[1, 2](70000.0, float("-inf"), h, bf)
    assert h[0].item() == float("inf") and bf[0].item() == float("-inf")
    a, b = torch.tensor(0.3, dtype=torch.float16), torch.tensor(-2.5, dtype=torch.bfloat16)
    k[1, 2](a, b, h, bf)  # 0-dim tensors: their bits as they are
    assert _bits(h[1]) == _bits(a) and _bits(bf[1]) == _bits(b)
    with pytest.raises(TypeError, match=r"argument `a` is `__half` \(passed by value\): pass a Python float .* "
                                        r"or a 0-dim torch.float16 tensor, got a torch.float16 tensor of shape \(1,\)"):
        k[1, 2](torch.tensor([0.3], dtype=torch.float16), 1.0, h, bf)
