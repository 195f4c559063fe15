// GELU, tanh approximation, in CUDA C++.
//
//   gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
//
// Loaded by kernels/cuda/gelu.py through utils.cuda_kernel. The versions of lesson 03
// (VERSIONS in gelu.py, naive to best):
//   v1  one thread per element                                                gelu_kernel
//   v2  16-byte float4 loads and stores, 4 elements per thread, scalar tail   gelu_vec4_kernel
//       (a scalar loop does the last n % 4 elements)
//
// Everything is float: `0.5` (a double literal) or `tanh` (the double overload) would
// silently turn the arithmetic into double precision, which is far slower on most GPUs.
#include "common.h"

#define GELU_SQRT_2_OVER_PI 0.7978845608f  // sqrt(2 / pi)
#define GELU_COEFF 0.044715f

__device__ __forceinline__ float gelu_tanh(float x) {
    float u = GELU_SQRT_2_OVER_PI * (x + GELU_COEFF * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// v1: thread i computes element i. Neighbouring threads of a warp read neighbouring
// floats, so each warp load is coalesced into 128 contiguous bytes: correct and
// reasonably fast, but each thread has only one 4-byte load in flight.
__global__ void gelu_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {  // the last block may stick out past the end of the tensor
        y_ptr[i] = gelu_tanh(x_ptr[i]);
    }
}

// v2: thread i computes elements 4i .. 4i+3 with one 16-byte load (ld.global.v4.f32) and
// one 16-byte store (st.global.v4.f32). A warp now moves 512 contiguous bytes per
// instruction and every thread has 4x more bytes in flight, which is what it takes to
// keep enough memory requests outstanding to saturate HBM.
//
// Requirements, checked by the launcher: x_ptr and y_ptr are 16-byte aligned (a float4
// access at an unaligned address faults). n need not be a multiple of 4: the n % 4
// leftover elements are done one by one by the first threads of the grid.
__global__ void gelu_vec4_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int n4 = n / 4;  // number of whole float4 groups
    if (i < n4) {
        float4 v = reinterpret_cast<const float4*>(x_ptr)[i];
        v.x = gelu_tanh(v.x);
        v.y = gelu_tanh(v.y);
        v.z = gelu_tanh(v.z);
        v.w = gelu_tanh(v.w);
        reinterpret_cast<float4*>(y_ptr)[i] = v;
    }
    // Scalar tail: at most 3 elements after the last whole float4.
    int tail = 4 * n4 + i;
    if (tail < n) {
        y_ptr[tail] = gelu_tanh(x_ptr[tail]);
    }
}
