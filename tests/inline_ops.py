"""The load_inline extension that tests/test_load_inline.py and tests/test_toolchain.py share.

Building it compiles torch's headers (tens of seconds): with one name and one source, torch's
build cache (TORCH_EXTENSIONS_DIR) makes the second file load the first one's build, whichever
worker runs it, instead of compiling again. It is one module for every test, with a
hand-written PYBIND11_MODULE (the form of a hand-written extension); the ``functions=[...]``
form, where torch writes the bindings, is built by lesson 02 (``relu_inline_02``) and runs
under nbval.
"""
from cuda_sources import TREE_SUM

import utils

NAME = "course_test_inline_ops"

#: The declarations that ``functions=[...]`` needs (tests that stop before a build use them).
CPP = """
torch::Tensor relu(torch::Tensor x);
torch::Tensor block_sum(torch::Tensor x);
torch::Tensor relu_host_api(torch::Tensor x_cpu);
void hello(int tag);
void bad_barrier(torch::Tensor x);
torch::Tensor warp_sums(torch::Tensor x);
"""

CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdio>
#include "common.h"
""" + TREE_SUM + r"""

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void block_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    extern __shared__ float s[];
    float total = block_tree_sum(x, s, n);
    if (threadIdx.x == 0) atomicAdd(out, total);
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

__device__ float warp_reduce(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffff, v, off);
    return v;
}

__global__ void warp_sums_kernel(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = warp_reduce(i < n ? x[i] : 0.0f);
    if (threadIdx.x % 32 == 0 && i < cdiv(n, 32) * 32) out[i / 32] = v;
}

torch::Tensor warp_sums(torch::Tensor x) {
    CHECK_INPUT(x);
    int n = x.numel();
    auto out = torch::zeros({cdiv(n, 32)}, x.options());
    if (n == 0) return out;
    warp_sums_kernel<<<cdiv(n, 256), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

#: The bindings, written by hand as in an extension of one's own.
PYBIND = r"""
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("relu", &relu, "y = max(x, 0)");
    m.def("block_sum", &block_sum, "the sum of x, one atomicAdd a block");
    m.def("relu_host_api", &relu_host_api, "relu through cudaMalloc and cudaMemcpy");
    m.def("hello", &hello, "printf from two blocks");
    m.def("bad_barrier", &bad_barrier, "a barrier half the block never reaches");
    m.def("warp_sums", &warp_sums, "sum of each group of 32 elements");
}
"""


def build():
    """The extension (built once; later calls load torch's cached build)."""
    return utils.load_inline(NAME, "", CUDA + PYBIND)
