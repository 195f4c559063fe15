"""utils.load_inline: torch's load_inline on a GPU, the emulated build on a CPU. The same
extension-style sources (``<<<...>>>`` launches, C10_CUDA_KERNEL_LAUNCH_CHECK, the CUDA
host API, ``functions=[...]`` or a hand-written PYBIND11_MODULE) run unchanged in both.

Each build takes tens of seconds (torch/extension.h is heavy), so the module fixtures are
shared by the tests of this file and torch's build cache makes a rerun instant.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import utils

DEV = utils.DEVICE
GEN = torch.Generator().manual_seed(7)

CPP = """
torch::Tensor relu(torch::Tensor x);
torch::Tensor block_sum(torch::Tensor x);
torch::Tensor relu_host_api(torch::Tensor x_cpu);
void hello(int tag);
void bad_barrier(torch::Tensor x);
"""

CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdio>
#include "common.h"

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void block_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    extern __shared__ float s[];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) atomicAdd(out, s[0]);
}

__global__ void hello_kernel(int tag) {
    if (threadIdx.x == 0) printf("hello %d from block %d\n", tag, blockIdx.x);
}

__global__ void half_barrier_kernel(float* x) {
    if (threadIdx.x < 16) __syncthreads();
    x[threadIdx.x] = 1.0f;
}

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cuda(), "x must be a CUDA tensor");  // as written for a GPU
    CHECK_INPUT(x);
    TORCH_CHECK(x.dtype() == torch::kFloat32, "x must be float32");
    auto y = torch::empty_like(x);
    int n = x.numel();
    if (n == 0) return y;
    relu_kernel<<<cdiv(n, 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

torch::Tensor block_sum(torch::Tensor x) {
    CHECK_INPUT(x);
    auto out = torch::zeros({1}, x.options());
    int n = x.numel();
    int threads = 128;
    if (n == 0) return out;
    block_sum_kernel<<<cdiv(n, threads), threads, threads * sizeof(float),
                       at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// The host API of a first CUDA program: explicit device buffers and copies.
torch::Tensor relu_host_api(torch::Tensor x_cpu) {
    TORCH_CHECK(x_cpu.device().is_cpu() && x_cpu.is_contiguous(), "x_cpu must be a contiguous CPU tensor");
    int n = x_cpu.numel();
    size_t bytes = n * sizeof(float);
    float *d_x, *d_y;
    CUDA_CHECK(cudaMalloc(&d_x, bytes));
    CUDA_CHECK(cudaMalloc(&d_y, bytes));
    CUDA_CHECK(cudaMemcpy(d_x, x_cpu.data_ptr<float>(), bytes, cudaMemcpyHostToDevice));
    relu_kernel<<<cdiv(n, 128), 128>>>(d_x, d_y, n);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    auto y = torch::empty_like(x_cpu);
    CUDA_CHECK(cudaMemcpy(y.data_ptr<float>(), d_y, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    return y;
}

void hello(int tag) {
    hello_kernel<<<2, 32>>>(tag);
    CUDA_CHECK(cudaDeviceSynchronize());
}

void bad_barrier(torch::Tensor x) {
    half_barrier_kernel<<<1, 64>>>(x.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

PYBIND = r"""
#include <torch/extension.h>
#include "common.h"

__device__ float warp_reduce(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffff, v, off);
    return v;
}

__global__ void warp_sums_kernel(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = warp_reduce(i < n ? x[i] : 0.0f);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
}

torch::Tensor warp_sums(torch::Tensor x) {
    CHECK_INPUT(x);
    int n = x.numel();
    auto out = torch::zeros({cdiv(n, 32)}, x.options());
    warp_sums_kernel<<<cdiv(n, 256), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("warp_sums", &warp_sums, "sum of each group of 32 elements");
}
"""


@pytest.fixture(scope="module")
def ext():
    return utils.load_inline("course_test_inline_ops", CPP, CUDA,
                             functions=["relu", "block_sum", "relu_host_api", "hello", "bad_barrier"])


@pytest.fixture(scope="module")
def ext_pybind():
    return utils.load_inline("course_test_inline_pybind", "", PYBIND)


def test_functions_list_module(ext):
    for n in (1, 1000, 4099):
        x = torch.randn(n, generator=GEN).to(DEV)
        assert torch.equal(ext.relu(x), torch.relu(x))
        torch.testing.assert_close(ext.block_sum(x).double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-4)
    assert ext.relu(torch.empty(0, device=DEV)).numel() == 0


def test_host_api(ext):
    x = torch.randn(777, generator=GEN)
    assert torch.equal(ext.relu_host_api(x), torch.relu(x))


def test_checks_in_host_code(ext):
    wrong = torch.randn(8) if DEV.type == "cuda" else torch.empty(8, device="meta")
    with pytest.raises(RuntimeError, match="must be"):
        ext.relu(wrong)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.block_sum(torch.randn(8, 8, device=DEV).t())
    with pytest.raises(RuntimeError, match="float32"):
        ext.relu(torch.randn(8, device=DEV, dtype=torch.float64))


def test_printf_shows_in_output(ext, capfd):
    ext.hello(42)
    out = capfd.readouterr().out
    assert "hello 42 from block 0" in out and "hello 42 from block 1" in out


def test_random_schedule_applies(ext):
    x = torch.randn(3000, generator=GEN).to(DEV)
    with utils.emulation_schedule("random", seed=5):
        s = ext.block_sum(x)
    torch.testing.assert_close(s.double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not utils.SIMULATE, reason="a divergent barrier would hang or corrupt a real GPU")
def test_kernel_fault_in_extension(ext):
    with pytest.raises(utils.KernelFault, match=r"half_barrier_kernel[\s\S]*threads 0-15: wait at __syncthreads\(\)"):
        ext.bad_barrier(torch.zeros(64))
    assert torch.equal(ext.relu(torch.tensor([-1.0, 2.0], device=DEV)), torch.tensor([0.0, 2.0], device=DEV))


def test_user_written_pybind_module(ext_pybind):
    x = torch.randn(1000, generator=GEN).to(DEV)
    out = ext_pybind.warp_sums(x)
    ref = torch.nn.functional.pad(x.double(), (0, 24)).view(-1, 32).sum(1)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)


def test_not_solved_yet_needs_no_build():
    src = CUDA.replace("if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;", "// TODO (1 line)\n    NOT_SOLVED_YET;")
    mod = utils.load_inline("course_test_inline_todo", CPP, src, functions=["relu", "block_sum"])
    with pytest.raises(NotImplementedError, match="not solved yet: relu still has a TODO"):
        mod.relu(torch.zeros(4, device=DEV))
    mod2 = utils.load_inline("course_test_inline_todo2", "", PYBIND.replace("return v;", "NOT_SOLVED_YET;"))
    with pytest.raises(NotImplementedError, match="warp_sums"):
        mod2.warp_sums(torch.zeros(4, device=DEV))
