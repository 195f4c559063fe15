"""Published CUDA C++ runs in the emulator as written: cooperative groups, launches inside
macros, the usual qualifiers and intrinsics; what it cannot run gets one clear error."""
import pytest
import torch

import utils
from runtime.backends.cuda._source import adapt_for_emulator

CG = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
__global__ void __launch_bounds__(256) cg_sum(const float* __restrict__ x, float* out, int n) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    __shared__ float partial[8];
    int i = blockIdx.x * blockDim.x + block.thread_rank();
    float v = i < n ? __ldg(&x[i]) : 0.0f;
    v = cg::reduce(warp, v, cg::plus<float>());
    if (warp.thread_rank() == 0) partial[warp.meta_group_rank()] = v;
    block.sync();
    if (warp.meta_group_rank() == 0) {
        float p = warp.thread_rank() < block.size() / 32 ? partial[warp.thread_rank()] : 0.0f;
        for (int o = 16; o > 0; o /= 2) p += warp.shfl_down(p, o);
        if (warp.thread_rank() == 0) atomicAdd(out, p);
    }
}
__global__ void cg_max(const float* x, float* out) {
    auto tile = cg::tiled_partition<16>(cg::this_thread_block());
    float v = x[threadIdx.x];
    v = cg::reduce(tile, v, cg::greater<float>());
    tile.sync();
    if (tile.thread_rank() == 0) out[tile.meta_group_rank()] = v;
}
__device__ __forceinline__ float4 scale4(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
__global__ void vec4(const float4* x, float4* y, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) y[i] = scale4(__ldg(&x[i]), __fdividef(1.0f, 2.0f) + __expf(0.0f));
}
"""


def test_cooperative_groups_block_tiles_and_reduce():
    x = torch.randn(1000, device=utils.DEVICE)
    out = torch.zeros(1, device=utils.DEVICE)
    utils.cuda_kernel(CG, "cg_sum")[4, 256](x, out, 1000)
    torch.testing.assert_close(out.double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-4)
    x = torch.randn(64, device=utils.DEVICE)
    out = torch.zeros(4, device=utils.DEVICE)
    utils.cuda_kernel(CG, "cg_max")[1, 64](x, out)
    assert torch.equal(out, x.view(4, 16).max(1).values)


def test_vector_types_and_fast_intrinsics():
    x = torch.randn(64, device=utils.DEVICE)
    y = torch.zeros(64, device=utils.DEVICE)
    utils.cuda_kernel(CG, "vec4")[1, 32](x, y, 16)
    torch.testing.assert_close(y, 1.5 * x)


def test_a_launch_inside_a_macro_that_pastes_the_name():
    out = adapt_for_emulator("#define LAUNCH(k) k##_kernel<<<1, 32>>>(p)\nLAUNCH(add);\n")
    assert out.startswith('#define LAUNCH(k) ::emu::make_launch(k##_kernel, "k##_kernel", 1, 1, 32)(p)\n')


@pytest.mark.skipif(not utils.SIMULATE, reason="what only the CPU emulator cannot run")
@pytest.mark.parametrize("src, what", [
    ("#include <mma.h>\n__global__ void k() {}", "wmma"),
    ("#include <cuda_fp16.h>\n__global__ void k(__half* p) {}", "__half"),
    ("__global__ void k() { auto g = cooperative_groups::this_grid(); g.sync(); }", "grid-wide synchronization"),
])
def test_what_the_emulator_cannot_run_gets_one_clear_error(src, what, tmp_path):
    from runtime.backends.cuda._source import EMU_HEADER_DIR
    header = src.split("<")[1].split(">")[0] if src.startswith("#include") else None
    if header and (EMU_HEADER_DIR / header).exists():
        pytest.skip(f"the emulator provides {header}")
    with pytest.raises(utils.CudaCompileError, match=f"the CPU emulator does not support {what}"):
        utils.cuda_kernel(src, "k")


def test_thread_group_from_a_runtime_tile_size():
    src = r"""
#include <cooperative_groups.h>
using namespace cooperative_groups;
__device__ int sum_group(thread_group g, int* x, int v) {
    int lane = g.thread_rank();
    for (int i = g.size() / 2; i > 0; i /= 2) {
        x[lane] = v;
        g.sync();
        if (lane < i) v += x[lane + i];
        g.sync();
    }
    return v;
}
__global__ void groups(int* out) {
    thread_block block = this_thread_block();
    __shared__ int work[64];
    thread_group tile = tiled_partition(block, 16);
    int offset = block.thread_rank() - tile.thread_rank();
    int s = sum_group(tile, work + offset, block.thread_rank());
    if (tile.thread_rank() == 0) out[block.thread_rank() / 16] = s;
}
"""
    out = torch.zeros(4, dtype=torch.int32, device=utils.DEVICE)
    utils.cuda_kernel(src, "groups")[1, 64](out)
    assert out.tolist() == [sum(range(16 * g, 16 * g + 16)) for g in range(4)]


def test_byte_vectors_and_24_bit_multiplies():
    src = r"""
__global__ void pixels(const uchar4* in, uchar4* out, unsigned* idx) {
    unsigned i = __umul24(blockIdx.x, blockDim.x) + threadIdx.x;
    uchar4 p = in[i];
    out[i] = make_uchar4(p.w, p.z, p.y, p.x);
    idx[i] = __umulhi(i + 1, 0x80000000u) + __mul24(-2, 3);
}
"""
    x = torch.arange(64, dtype=torch.uint8, device=utils.DEVICE)
    y = torch.zeros(64, dtype=torch.uint8, device=utils.DEVICE)
    idx = torch.zeros(16, dtype=torch.int32, device=utils.DEVICE)
    utils.cuda_kernel(src, "pixels")[2, 8](x, y, idx)
    assert torch.equal(y.view(16, 4), x.view(16, 4).flip(1))
    assert idx.tolist() == [(i + 1) // 2 - 6 for i in range(16)]


# ---------------------------------------------------------------------------------------
# Host code around the kernels, as published programs write it
# ---------------------------------------------------------------------------------------
emulator_only = pytest.mark.skipif(not utils.SIMULATE,
                                   reason="host code in a kernel's source: the CPU emulator's build")

HOST_HELPERS = r"""
#include <cuda_runtime.h>
#include <stdio.h>
#ifdef __DRIVER_TYPES_H__   // how the samples' helper_cuda.h decides to declare its checks
#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) printf("%s\n", cudaGetErrorName(e)); } while (0)
#endif
__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
int pick_blocks(int n) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int major = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaFuncSetAttribute(twice, cudaFuncAttributeMaxDynamicSharedMemorySize, 0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamDestroy(s));
    return major >= 7 ? prop.multiProcessorCount : sms;
}
"""


@emulator_only
def test_host_code_with_device_queries_compiles_and_its_kernel_runs(monkeypatch):
    # The emulator's g++ build of a whole file, host code included (as load_inline and
    # setup.py sources are built in simulation); NVRTC, a GPU's compiler, takes only the
    # device part of such a file, so its check is left out here.
    from runtime.backends.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)
    x = torch.randn(300, device=utils.DEVICE)
    y = torch.full_like(x, float("nan"))
    utils.cuda_kernel(HOST_HELPERS, "twice")[3, 128](x, y, 300)
    torch.testing.assert_close(y, 2 * x)


@emulator_only
def test_a_header_beside_the_kernel_may_include_the_cuda_runtime(tmp_path):
    (tmp_path / "helpers.cuh").write_text("#pragma once\n#include <cuda_runtime.h>\n"
                                          "#include <device_launch_parameters.h>\n"
                                          "__device__ inline float sq(float v) { return v * v; }\n")
    src = tmp_path / "square.cu"
    src.write_text('#include "helpers.cuh"\n__global__ void square(const float* x, float* y, int n) {\n'
                   "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = sq(x[i]);\n}\n")
    x = torch.randn(100, device=utils.DEVICE)
    y = torch.empty_like(x)
    utils.cuda_kernel(src, "square")[1, 128](x, y, 100)
    torch.testing.assert_close(y, x * x)


def test_dynamic_shared_memory_declared_type_first():
    src = r"""
__global__ void reverse(const float* x, float* y) {
    extern float __shared__ buf[];
    buf[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}
"""
    x = torch.randn(64, device=utils.DEVICE)
    y = torch.empty_like(x)
    utils.cuda_kernel(src, "reverse")[1, 64, 64 * 4](x, y)
    assert torch.equal(y, x.flip(0))


def test_tiles_shuffle_vector_types_and_accept_block_tile_memory():
    src = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void rotate(const uint4* x, uint4* y) {
    __shared__ cg::block_tile_memory<64> scratch;
    cg::thread_block block = cg::this_thread_block(scratch);
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    uint4 v = x[block.thread_rank()];
    y[block.thread_rank()] = tile.shfl_down(v, 1);
}
"""
    x = torch.randint(0, 2**31, (64 * 4,), dtype=torch.int32, device=utils.DEVICE)
    y = torch.zeros_like(x)
    utils.cuda_kernel(src, "rotate")[1, 64](x, y)
    want = x.view(2, 32, 4).clone()
    want[:, :31] = x.view(2, 32, 4)[:, 1:]  # lane 31 keeps its own value (no lane above it)
    assert torch.equal(y.view(2, 32, 4), want)


@pytest.mark.skipif(not utils.SIMULATE, reason="what only the CPU emulator cannot run")
@pytest.mark.parametrize("src, what", [
    ("#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n__global__ void k(float* p) {\n"
     "    auto t = cg::tiled_partition<48>(cg::this_thread_block()); p[0] = t.thread_rank(); }",
     "N must be a power of two of at most 1024"),
    ("#include <cublas_v2.h>\n__global__ void k(float* p) {}", "does not support cuBLAS"),
    ("__global__ void k(float* p, int n = 1) {}\nvoid host(float* p) { k<<<1, 1>>>(p); }",
     "does not support a kernel's default arguments"),
])
def test_what_published_code_needs_and_the_emulator_lacks_is_named(src, what, monkeypatch):
    from runtime.backends.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)  # the emulator's own message (host code)
    with pytest.raises(utils.CudaCompileError, match=what):
        utils.cuda_kernel(src, "k")


@emulator_only
def test_a_library_included_by_a_header_of_the_project_is_named(tmp_path):
    (tmp_path / "setup.h").write_text("#pragma once\n#include <cuda_runtime.h>\n#include <cublas_v2.h>\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "setup.h"\n__global__ void k(float* p) { p[0] = 1.0f; }\n')
    with pytest.raises(utils.CudaCompileError, match=r"setup\.h:3[\s\S]*does not support cuBLAS \(cublas_v2\.h\)"):
        utils.cuda_kernel(src, "k")


def test_the_device_part_leaves_out_declarations_of_cublas_types():
    from runtime.backends.cuda._toolchain import device_part
    src = ("#include <cublas_v2.h>\ncublasHandle_t handle;\nstruct Pair { float a, b; };\n"
           "__global__ void k(Pair* p) { p->a = p->b; }\n")
    part = device_part(src)
    assert "cublasHandle_t" not in part and "struct Pair" in part and "__global__ void k" in part
    assert part.count("\n") == src.count("\n")


# ---------------------------------------------------------------------------------------
# The survey of published kernels (benchmarks/simulators/published_survey.py): one case per repository
# it has a mirror of, when COURSE_SURVEY_MIRRORS points at the mirrors
# ---------------------------------------------------------------------------------------
def _survey():
    import os
    from pathlib import Path
    base = os.environ.get("COURSE_SURVEY_MIRRORS", "")
    if not base or not utils.SIMULATE:
        pytest.skip("no mirrors of the surveyed repositories (COURSE_SURVEY_MIRRORS), or not in simulation")
    from benchmarks.simulators import published_survey
    return published_survey, Path(base)


@pytest.mark.parametrize("kernel", ["transposeCoalesced", "gelu_forward_kernel2"])
def test_a_published_kernel_runs_as_written(kernel):
    survey, base = _survey()
    case = next(c for c in survey.CASES if c.kernel == kernel)
    mirror = survey.find_mirror(base, case.repo)
    if mirror is None:
        pytest.skip(f"no mirror of {case.repo}")
    row = survey.run_case(case, survey.Checkout(mirror, case.repo))
    assert row["status"] == "ok", row
