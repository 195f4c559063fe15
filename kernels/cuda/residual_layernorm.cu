// Residual add + LayerNorm, fused, in CUDA C++: the join of every transformer block.
//
//     h = x + r                   (the residual stream, kept: the next block adds to it)
//     y = (h - mean) * rstd * w + b,   mean, rstd of each row of h (biased variance, eps inside)
//
//   v1  unfused: an add kernel writes h, then lesson 09's LayerNorm reads it back
//       residual_add_kernel writes h, then lesson 09's LayerNorm reads it back.
//   v2  fused: one block per row, x and r read once, h and y written once
//       residual_layernorm_kernel: one block per row; x and r read once, h and y written once.
//       The statistics come from h in two passes over the row (the mean, then the squared
//       deviations) over values each thread keeps in registers, never E[h^2] - E[h]^2,
//       which loses every digit on rows with a large mean.
#include "reduce.h"  // block_sum: every thread gets the block's sum

__global__ void residual_add_kernel(const float* __restrict__ x_ptr, const float* __restrict__ r_ptr,
                                    float* __restrict__ h_ptr, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        h_ptr[i] = x_ptr[i] + r_ptr[i];
}

// A thread keeps its first RL_CACHED values of h in registers (cols <= RL_CACHED * blockDim.x,
// 2048 columns at 256 threads, the common case): the statistics and y then read no memory. The
// loops over k are unrolled, so v[k] is a register; columns past the cache are re-read from h.
#define RL_CACHED 8

__global__ void residual_layernorm_kernel(const float* __restrict__ x_ptr, const float* __restrict__ r_ptr,
                                          const float* __restrict__ w_ptr, const float* __restrict__ b_ptr,
                                          float* h_ptr, float* __restrict__ y_ptr, float* mean_ptr,
                                          float* rstd_ptr, int cols, float eps) {
    __shared__ float scratch[32];
    long long base = (long long)blockIdx.x * cols;
    int past = RL_CACHED * blockDim.x;  // the first column not cached
    float v[RL_CACHED];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < RL_CACHED; ++k) {
        int c = threadIdx.x + k * blockDim.x;
        v[k] = 0.0f;
        if (c < cols) {
            v[k] = x_ptr[base + c] + r_ptr[base + c];
            h_ptr[base + c] = v[k];
            s += v[k];
        }
    }
    for (int c = past + threadIdx.x; c < cols; c += blockDim.x) {
        float h = x_ptr[base + c] + r_ptr[base + c];
        h_ptr[base + c] = h;  // each thread re-reads only what it wrote itself: no barrier needed
        s += h;
    }
    float mean = block_sum(s, scratch) / cols;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < RL_CACHED; ++k)
        if ((int)(threadIdx.x + k * blockDim.x) < cols) q += (v[k] - mean) * (v[k] - mean);
    for (int c = past + threadIdx.x; c < cols; c += blockDim.x) {
        float d = h_ptr[base + c] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q, scratch) / cols + eps);
#pragma unroll
    for (int k = 0; k < RL_CACHED; ++k) {
        int c = threadIdx.x + k * blockDim.x;
        if (c < cols) y_ptr[base + c] = (v[k] - mean) * rstd * w_ptr[c] + b_ptr[c];
    }
    for (int c = past + threadIdx.x; c < cols; c += blockDim.x)
        y_ptr[base + c] = (h_ptr[base + c] - mean) * rstd * w_ptr[c] + b_ptr[c];
    if (threadIdx.x == 0) {
        mean_ptr[blockIdx.x] = mean;
        rstd_ptr[blockIdx.x] = rstd;
    }
}
