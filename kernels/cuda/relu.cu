// ReLU, y = max(x, 0), and its backward pass, in CUDA C++.
//
// Loaded by kernels/cuda/relu.py through utils.cuda_kernel: on a GPU these kernels are
// compiled by NVRTC and run for real; without one they run in the course's CPU emulator.
// The launchers (grid and block sizes, input checks) live in relu.py.
//
// The versions of lesson 02 (VERSIONS in relu.py, naive to best):
//   v1  one thread per element, 256 threads per block                 relu_kernel
//   v2  float4 loads and stores, scalar tail, one float4 per thread   relu_vec4_kernel
// and the backward, relu_backward_kernel: grad_out where x > 0, else 0.
// ---------------------------------------------------------------------------------------
#include "common.h"

// v1: one thread per element. The kernel of lesson 02, line by line.
//
// `n` is the number of elements. A pointer carries no length, so the kernel must be told
// where the data ends. The launcher rounds the grid up to whole blocks, so the last block
// may have threads past the end: `idx < n` keeps them from reading or writing outside the
// tensors. blockIdx.x counts the blocks of THIS launch from 0, whatever order the hardware
// runs them in, so idx is always an index into x and y.
//
// __restrict__ promises that x_ptr and y_ptr do not overlap, so the compiler may load
// x early and keep it in a register (and use the read-only data path for it).
__global__ void relu_kernel(const float* __restrict__ x_ptr,
                            float* __restrict__ y_ptr,
                            int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        // fmaxf compiles to one max instruction: no branch, so no divergence. It also
        // returns 0 for NaN inputs (fmaxf ignores a NaN operand), unlike torch.relu,
        // which keeps NaN; `x > 0 ? x : 0.f` would return 0 for NaN too.
        y_ptr[idx] = fmaxf(x_ptr[idx], 0.0f);
    }
}

// v2: 16-byte loads and stores, grid-stride loop, scalar tail.
//
// A float4 load moves four floats with one instruction, so each thread issues a quarter of
// the memory instructions of v1 and the memory system sees full 16-byte requests per thread
// (512 bytes per warp). The grid is capped at one wave of blocks (as many as the GPU holds at
// once) and each thread loops with a stride of the whole grid: fewer blocks to schedule, the
// same coalesced pattern (in every iteration consecutive threads touch consecutive float4s).
//
// Requirements: x_ptr and y_ptr 16-byte aligned (the launcher checks, and falls back to v1).
// The n % 4 elements after the last whole float4 are the scalar tail.
__global__ void relu_vec4_kernel(const float* __restrict__ x_ptr,
                                 float* __restrict__ y_ptr,
                                 long long n) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x_ptr);
    float4* y4 = reinterpret_cast<float4*>(y_ptr);
    for (long long i = tid; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = fmaxf(v.x, 0.0f);
        v.y = fmaxf(v.y, 0.0f);
        v.z = fmaxf(v.z, 0.0f);
        v.w = fmaxf(v.w, 0.0f);
        y4[i] = v;
    }
    // Scalar tail: at most 3 elements, taken by the first threads of the grid.
    for (long long i = n4 * 4 + tid; i < n; i += stride) {
        y_ptr[i] = fmaxf(x_ptr[i], 0.0f);
    }
}

// Backward: dL/dx = dL/dy where x > 0, else 0 (the gradient at exactly 0 is taken as 0,
// as torch.relu does). It reads the forward INPUT x, so autograd must save x.
__global__ void relu_backward_kernel(const float* __restrict__ grad_out_ptr,
                                     const float* __restrict__ x_ptr,
                                     float* __restrict__ grad_in_ptr,
                                     int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        grad_in_ptr[idx] = x_ptr[idx] > 0.0f ? grad_out_ptr[idx] : 0.0f;
    }
}
