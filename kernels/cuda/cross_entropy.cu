// Softmax cross-entropy over the rows of a (rows, V) matrix of logits, in CUDA C++.
//
//     lse_r   = log(sum_c exp(x[r, c]))                 (the logsumexp of row r)
//     loss_r  = lse_r - x[r, t_r]                       (t_r the row's target class)
//     loss    = sum of loss_r over the rows whose target is not ignore_index, divided by
//               how many such rows there are (the mean over counted rows, as torch's)
//     dx[r,c] = (exp(x[r, c] - lse_r) - [c == t_r]) * dloss_r      (softmax minus one-hot)
//
// A row whose target is ignore_index adds nothing to the loss, is not counted in the mean
// and gets a zero gradient. The probabilities exp(x - lse) are never stored: the backward
// recomputes each one from x and the row's lse, which is one float per row.
//
// Loaded by kernels/cuda/cross_entropy.py (the launchers) through utils.cuda_kernel.
//   v1  unfused: forward (max pass + sum pass), mean, backward: logits read 3 times
//       cross_entropy_forward_kernel (two passes over the row: max, then sum of exp),
//       cross_entropy_mean_kernel (the mean over counted rows, and 1 / count for the backward),
//       cross_entropy_backward_kernel (a third read of the row, the gradient written)
//   v2  fused: online logsumexp + gradient in one kernel, logits read twice, written once (in place optional)
//       cross_entropy_count_kernel (how many rows count), then cross_entropy_fused_kernel:
//       ONE pass for the max and the sum together (the online logsumexp), and one pass that
//       writes the gradient, over the logits themselves when asked (in place): the logits are
//       read twice and written once, the least a two-pass softmax can do.
//   v3  v2 with 4 values per load and store (16-byte float4 in float32), when V % 4 == 0; v2 otherwise
//       cross_entropy_fused4_kernel: the same two passes, four values per thread and step.
// The kernels that read logits are templates on their type T, float or __nv_bfloat16 (the
// logits and the gradient in bfloat16, every sum in float32): cross_entropy_fused_kernel<float>.
#include "common.h"
#include <cuda_bf16.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// Merge the running (max, sum of exp(x - max)) of two sets of values: the online softmax.
// Both empty (max -inf): nothing to do, and -inf - -inf would give NaN.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

// Every thread of the block ends with the block's (max, sum). blockDim.x: a multiple of 32.
__device__ __forceinline__ void block_lse(float& m, float& s, float* sm, float* ss) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, o), s2 = __shfl_xor_sync(FULL_MASK, s, o);
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();  // every warp's pair is written before any warp reads them
    m = lane < nwarps ? sm[lane] : -INFINITY;
    s = lane < nwarps ? ss[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, o), s2 = __shfl_xor_sync(FULL_MASK, s, o);
        lse_merge(m, s, m2, s2);
    }
    __syncthreads();  // everyone has read the scratch before it is reused
}

__device__ __forceinline__ float block_reduce(float v, float* scratch, bool is_max) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2) {
        float v2 = __shfl_xor_sync(FULL_MASK, v, o);
        v = is_max ? fmaxf(v, v2) : v + v2;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float none = is_max ? -INFINITY : 0.0f;
    v = lane < nwarps ? scratch[lane] : none;
    for (int o = 16; o > 0; o /= 2) {
        float v2 = __shfl_xor_sync(FULL_MASK, v, o);
        v = is_max ? fmaxf(v, v2) : v + v2;
    }
    __syncthreads();
    return v;
}

// ---------------------------------------------------------------------------------------
// v1. One block per row: the max (one read of the row), then the sum of exp(x - max) (a
// second read). Subtracting the max keeps every exp in (0, 1]: exp(89.f) is inf in float32.
// loss_rows[r] = lse - x[t] (0 for an ignored row), lse_ptr[r] = lse. A target outside
// [0, V) that is not ignore_index gives a NaN loss instead of a read outside the row.
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ x_ptr, const long long* __restrict__ t_ptr,
                                             float* loss_ptr, float* lse_ptr, int cols, long long ignore_index) {
    __shared__ float scratch[32];
    long long r = blockIdx.x;
    const T* row = x_ptr + r * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f32(row[c]));
    m = block_reduce(m, scratch, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(to_f32(row[c]) - m);
    s = block_reduce(s, scratch, false);
    if (threadIdx.x == 0) {
        float lse = m + logf(s);
        long long t = t_ptr[r];
        lse_ptr[r] = lse;
        if (t == ignore_index) loss_ptr[r] = 0.0f;
        else if (t < 0 || t >= cols) loss_ptr[r] = NAN;
        else loss_ptr[r] = lse - to_f32(row[t]);
    }
}

// v1, the mean: one block sums the rows' losses and counts the rows that count. Writes the
// mean loss and scale_ptr[0] = 1 / count, the upstream gradient of every counted row.
// No row counts: the mean is 0 / 0 = NaN (as torch's) and the scale 0.
__global__ void cross_entropy_mean_kernel(const float* __restrict__ loss_rows_ptr, const long long* __restrict__ t_ptr,
                                          float* loss_ptr, float* scale_ptr, int rows, long long ignore_index) {
    __shared__ float scratch[32];
    float s = 0.0f, n = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        if (t_ptr[r] != ignore_index) { s += loss_rows_ptr[r]; n += 1.0f; }
    }
    s = block_reduce(s, scratch, false);
    n = block_reduce(n, scratch, false);
    if (threadIdx.x == 0) {
        loss_ptr[0] = n > 0.0f ? s / n : NAN;
        scale_ptr[0] = n > 0.0f ? 1.0f / n : 0.0f;
    }
}

// v1, the backward: a third read of the row. dx = (exp(x - lse) - onehot) * dloss[r * dloss_stride]
// (dloss_stride 0: one upstream gradient for every row). g_ptr may be x_ptr (in place): each
// thread reads its element before it writes it.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* x_ptr, const long long* __restrict__ t_ptr,
                                              const float* __restrict__ lse_ptr, const float* __restrict__ dloss_ptr,
                                              int dloss_stride, T* g_ptr, int cols, long long ignore_index) {
    long long r = blockIdx.x;
    long long t = t_ptr[r];
    float lse = lse_ptr[r];
    float d = (t == ignore_index) ? 0.0f : dloss_ptr[r * dloss_stride];
    const T* row = x_ptr + r * cols;
    T* grow = g_ptr + r * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float p = expf(to_f32(row[c]) - lse);
        store_f(grow + c, (p - (c == t ? 1.0f : 0.0f)) * d);
    }
}

// ---------------------------------------------------------------------------------------
// v2. First, how many rows count (one block): the fused kernel needs it before it writes
// any gradient, since every gradient of the mean is divided by it.
__global__ void cross_entropy_count_kernel(const long long* __restrict__ t_ptr, int rows, long long ignore_index,
                                           float* count_ptr) {
    __shared__ float scratch[32];
    float n = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) n += (t_ptr[r] != ignore_index) ? 1.0f : 0.0f;
    n = block_reduce(n, scratch, false);
    if (threadIdx.x == 0) count_ptr[0] = n;
}

// v2, fused: one block per row. Pass 1 reads the row once and keeps, per thread, the running
// max m and the sum s of exp(x - m), rescaling s when m grows (the online softmax); the block
// then merges the threads' pairs. Pass 2 reads the row again (mostly from L2) and writes
// (exp(x - lse) - onehot) / count: the gradient of the mean loss. Each block adds its
// row's loss / count to the scalar loss with one atomicAdd (loss_ptr starts at 0).
template <typename T>
__global__ void cross_entropy_fused_kernel(const T* x_ptr, const long long* __restrict__ t_ptr,
                                           const float* __restrict__ count_ptr, float* loss_ptr, T* g_ptr, int cols,
                                           long long ignore_index) {
    __shared__ float sm[32], ss[32];
    long long r = blockIdx.x;
    long long t = t_ptr[r];
    float count = count_ptr[0];
    T* grow = g_ptr + r * cols;
    const T* row = x_ptr + r * cols;
    if (count == 0.0f && r == 0 && threadIdx.x == 0) loss_ptr[0] = NAN;  // 0 / 0, as torch's mean
    if (t == ignore_index) {  // the same for the whole block: no thread skips a barrier
        for (int c = threadIdx.x; c < cols; c += blockDim.x) store_f(grow + c, 0.0f);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_f32(row[c]);
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }  // a new max: rescale the old sum
        else if (v > -INFINITY) s += expf(v - m);  // (-inf adds nothing, and -inf - -inf is NaN)
    }
    block_lse(m, s, sm, ss);
    float lse = m + logf(s);
    bool valid = t >= 0 && t < cols;
    float x_t = valid ? to_f32(row[t]) : NAN;  // read before pass 2 overwrites it (in place)
    __syncthreads();  // every thread has read x[t] before any thread writes over the row
    float inv = 1.0f / count;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float p = expf(to_f32(row[c]) - lse);
        store_f(grow + c, (p - (c == t ? 1.0f : 0.0f)) * inv);
    }
    if (threadIdx.x == 0) atomicAdd(loss_ptr, (lse - x_t) * inv);
}

// ---------------------------------------------------------------------------------------
// v3: v2 with 16-byte loads and stores in float32 (4 floats), 8-byte loads in bfloat16
// (4 values): four times the bytes in flight per thread, which the scalar loop of v2 lacks
// to keep HBM busy. The launcher uses it when V % 4 == 0 and the rows are aligned (every row
// then starts on a 16-byte boundary in float32, an 8-byte one in bfloat16).
__device__ __forceinline__ void load4(const float* p, float v[4]) {
    float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float v[4]) {
    uint2 q = *reinterpret_cast<const uint2*>(p);  // 4 bfloat16 in one 8-byte load
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&q);
    for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(e[k]);
}
__device__ __forceinline__ void store4(float* p, const float v[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float v[4]) {
    for (int k = 0; k < 4; ++k) p[k] = __float2bfloat16(v[k]);
}

template <typename T>
__global__ void cross_entropy_fused4_kernel(const T* x_ptr, const long long* __restrict__ t_ptr,
                                            const float* __restrict__ count_ptr, float* loss_ptr, T* g_ptr, int cols,
                                            long long ignore_index) {
    __shared__ float sm[32], ss[32];
    long long r = blockIdx.x;
    long long t = t_ptr[r];
    float count = count_ptr[0];
    T* grow = g_ptr + r * cols;
    const T* row = x_ptr + r * cols;
    int n4 = cols / 4;
    if (count == 0.0f && r == 0 && threadIdx.x == 0) loss_ptr[0] = NAN;
    if (t == ignore_index) {
        const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c4 = threadIdx.x; c4 < n4; c4 += blockDim.x) store4(grow + 4 * c4, zero);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int c4 = threadIdx.x; c4 < n4; c4 += blockDim.x) {
        float v[4];
        load4(row + 4 * c4, v);
        float mv = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        if (mv > m) { s *= expf(m - mv); m = mv; }  // rescale once per 4 values
        if (m > -INFINITY) for (int k = 0; k < 4; ++k) s += expf(v[k] - m);
    }
    block_lse(m, s, sm, ss);
    float lse = m + logf(s);
    bool valid = t >= 0 && t < cols;
    float x_t = valid ? to_f32(row[t]) : NAN;
    __syncthreads();  // x[t] read by every thread before the row is overwritten (in place)
    float inv = 1.0f / count;
    for (int c4 = threadIdx.x; c4 < n4; c4 += blockDim.x) {
        float v[4];
        load4(row + 4 * c4, v);
        for (int k = 0; k < 4; ++k) v[k] = (expf(v[k] - lse) - (4 * c4 + k == t ? 1.0f : 0.0f)) * inv;
        store4(grow + 4 * c4, v);
    }
    if (threadIdx.x == 0) atomicAdd(loss_ptr, (lse - x_t) * inv);
}
