// AdamW, one step over all of a model's parameters, and the global gradient norm for
// clipping, in CUDA C++.
//
//     p  <- p * (1 - lr * wd)                         decoupled weight decay (AdamW, not L2)
//     m  <- beta1 * m + (1 - beta1) * g               first moment
//     v  <- beta2 * v + (1 - beta2) * g^2             second moment
//     p  <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),   bc1 = 1 - beta1^t, bc2 = 1 - beta2^t
//
// as torch.optim.AdamW computes it. The bias corrections bc1, bc2 undo the zeros m and v
// start from: at step 1, m = (1 - beta1) g, and m / bc1 = g. They depend only on the step
// number, so the launcher computes them once on the host and passes step_size = lr / bc1
// and inv_sqrt_bc2 = 1 / sqrt(bc2).
//
// g is multiplied by *scale_ptr first: the clipping factor min(1, max_norm / (norm + 1e-6)),
// which stays on the GPU (no copy to the host, no sync); a tensor holding 1 when not clipping.
//
//   v1  unfused: decay, moments, update as three kernels (p, m, v read twice)
//       adamw_decay_kernel, adamw_moments_kernel, adamw_update_kernel: one kernel per line of
//       the formula, the way an optimizer written as tensor operations runs: p read and
//       written twice, m and v read twice.
//   v2  fused: the whole step in one kernel, 28 bytes per parameter
//       adamw_kernel: the whole step in one kernel: p, g, m, v read once, p, m, v written
//       once (28 bytes per parameter, the least the step can move).
//   grad_norm_partials_kernel + grad_norm_finish_kernel: the sum of squares of every
//      gradient, per block, then one block adds the partial sums in a fixed order (the same
//      bits every run), takes the square root and the clipping factor.
#include "common.h"

#define FULL_MASK 0xffffffffu

// v1 ------------------------------------------------------------------------------------
__global__ void adamw_decay_kernel(float* p_ptr, float decay, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p_ptr[i] *= decay;
}

__global__ void adamw_moments_kernel(const float* __restrict__ g_ptr, float* m_ptr, float* v_ptr,
                                     const float* __restrict__ scale_ptr, float beta1, float beta2, long long n) {
    float scale = scale_ptr[0];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = g_ptr[i] * scale;
        m_ptr[i] = beta1 * m_ptr[i] + (1.0f - beta1) * g;
        v_ptr[i] = beta2 * v_ptr[i] + (1.0f - beta2) * g * g;
    }
}

__global__ void adamw_update_kernel(float* p_ptr, const float* __restrict__ m_ptr, const float* __restrict__ v_ptr,
                                    float step_size, float inv_sqrt_bc2, float eps, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p_ptr[i] -= step_size * m_ptr[i] / (sqrtf(v_ptr[i]) * inv_sqrt_bc2 + eps);
}

// v2 ------------------------------------------------------------------------------------
__global__ void adamw_kernel(float* p_ptr, const float* __restrict__ g_ptr, float* m_ptr, float* v_ptr,
                             const float* __restrict__ scale_ptr, float lr_wd, float beta1, float beta2,
                             float step_size, float inv_sqrt_bc2, float eps, long long n) {
    float scale = scale_ptr[0];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = g_ptr[i] * scale;
        float m = beta1 * m_ptr[i] + (1.0f - beta1) * g;
        float v = beta2 * v_ptr[i] + (1.0f - beta2) * g * g;
        float p = p_ptr[i] * (1.0f - lr_wd);  // decoupled: the decay never passes through m or v
        p_ptr[i] = p - step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
        m_ptr[i] = m;
        v_ptr[i] = v;
    }
}

// The gradient norm ------------------------------------------------------------------------
// Block b writes the sum of squares of its share (a grid-stride loop) to partial_ptr[offset + b].
__global__ void grad_norm_partials_kernel(const float* __restrict__ g_ptr, long long n, float* partial_ptr,
                                          int offset) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = g_ptr[i];
        s += g * g;
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(FULL_MASK, s, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x / 32) ? scratch[lane] : 0.0f;
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(FULL_MASK, s, o);
        if (lane == 0) partial_ptr[offset + blockIdx.x] = s;
    }
}

// One block: norm = sqrt(sum of the partials), scale = min(1, max_norm / (norm + 1e-6))
// (torch.nn.utils.clip_grad_norm_'s factor; max_norm <= 0: no clipping, scale 1).
__global__ void grad_norm_finish_kernel(const float* __restrict__ partial_ptr, int count, float max_norm,
                                        float* norm_ptr, float* scale_ptr) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial_ptr[i];
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(FULL_MASK, s, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < (int)(blockDim.x / 32); ++w) total += scratch[w];  // in order: the same bits every run
        float norm = sqrtf(total);
        norm_ptr[0] = norm;
        scale_ptr[0] = max_norm > 0.0f ? fminf(1.0f, max_norm / (norm + 1e-6f)) : 1.0f;
    }
}
