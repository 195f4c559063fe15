// Softmax over the last dim of a (rows, cols) row-major matrix, in CUDA C++:
//     y[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r)
//
// Loaded by kernels/cuda/softmax.py through utils.cuda_kernel (NVRTC on a GPU, the
// course's CPU emulator without one). The launchers live in softmax.py.
//
// The versions of lesson 05 (VERSIONS in softmax.py, naive to best):
//   v1  naive: three kernels (max, exp-sum, normalize), x read 3 times
//       softmax_max_kernel, softmax_expsum_kernel, softmax_normalize_kernel
//       (x is read three times, plus the write: 4 trips through DRAM)
//   v2  fused: one row per block in registers, warp-shuffle reductions (rows <= 16384)
//       softmax_fused{1,2,4,8,16}_kernel (x is read once and y written once: 2 trips)
//   v3  online: running max + rescaled sum, then the output pass (any row length)
//       softmax_online_kernel, a persistent grid of blocks looping over rows
//   v4  v2 for rows up to 8192 columns, v3 beyond
//   v5  the row on chip: registers + shared memory, x read once (rows <= 90624 on an H100)
//       softmax_onchip{1,4}_kernel
//   v6  v5 while the row fits on chip, v3 beyond (any row length)
//
// Subtracting the row max before exp is what keeps softmax finite: expf(89.f) is already
// inf in float32, and inf / inf is NaN. After the subtraction every exponent is <= 0, so
// every exp is in (0, 1] and the sum is between 1 and cols.
#include "reduce.h"  // warp_sum, warp_max, block_sum, block_max: every thread gets the result

// ---------------------------------------------------------------------------------------
// v1, naive: three kernels, each a full trip through memory.
// Kernel 1: the max of each row (one block per row).
__global__ void softmax_max_kernel(const float* __restrict__ x_ptr, float* max_ptr, int cols) {
    __shared__ float scratch[32];
    const float* row = x_ptr + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) max_ptr[blockIdx.x] = m;
}

// Kernel 2: sum of exp(x - max) of each row (one block per row): reads x again.
__global__ void softmax_expsum_kernel(const float* __restrict__ x_ptr, const float* __restrict__ max_ptr,
                                      float* sum_ptr, int cols) {
    __shared__ float scratch[32];
    const float* row = x_ptr + (long long)blockIdx.x * cols;
    float m = max_ptr[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(row[c] - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) sum_ptr[blockIdx.x] = s;
}

// Kernel 3: one thread per element, y = exp(x - max[row]) / sum[row]: reads x a third
// time and writes y.
__global__ void softmax_normalize_kernel(const float* __restrict__ x_ptr, const float* __restrict__ max_ptr,
                                         const float* __restrict__ sum_ptr, float* __restrict__ y_ptr,
                                         long long n, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        long long r = i / cols;
        y_ptr[i] = expf(x_ptr[i] - max_ptr[r]) / sum_ptr[r];
    }
}

// ---------------------------------------------------------------------------------------
// v2, fused: one block per row, ITEMS elements per thread kept in registers between the
// max, the sum and the write. Element k of thread t is column t + k * blockDim.x, so at
// every k consecutive threads read consecutive columns (coalesced). Columns past the end
// hold -inf for the max and 0 for the sum, so the reductions need no bounds checks.
// The row must fit: cols <= ITEMS * blockDim.x (the launcher picks ITEMS).
template <int ITEMS>
__device__ __forceinline__ void softmax_row_registers(const float* __restrict__ x, float* __restrict__ y,
                                                      int cols, float* scratch) {
    float v[ITEMS];
    float m = -INFINITY;
    for (int k = 0; k < ITEMS; k++) {  // constant trip count: unrolled, v[] stays in registers
        int c = threadIdx.x + k * blockDim.x;
        v[k] = (c < cols) ? x[c] : -INFINITY;
        m = fmaxf(m, v[k]);
    }
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int k = 0; k < ITEMS; k++) {
        int c = threadIdx.x + k * blockDim.x;
        v[k] = (c < cols) ? expf(v[k] - m) : 0.0f;
        s += v[k];
    }
    s = block_sum(s, scratch);
    float inv = 1.0f / s;
    for (int k = 0; k < ITEMS; k++) {
        int c = threadIdx.x + k * blockDim.x;
        if (c < cols) y[c] = v[k] * inv;
    }
}

// One __global__ per register budget: a kernel's name is what the launcher asks for.
#define SOFTMAX_FUSED_KERNEL(NAME, ITEMS)                                                  \
    __global__ void NAME(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int cols) { \
        __shared__ float scratch[32];                                                      \
        long long offset = (long long)blockIdx.x * cols;                                   \
        softmax_row_registers<ITEMS>(x_ptr + offset, y_ptr + offset, cols, scratch);       \
    }
SOFTMAX_FUSED_KERNEL(softmax_fused1_kernel, 1)
SOFTMAX_FUSED_KERNEL(softmax_fused2_kernel, 2)
SOFTMAX_FUSED_KERNEL(softmax_fused4_kernel, 4)
SOFTMAX_FUSED_KERNEL(softmax_fused8_kernel, 8)
SOFTMAX_FUSED_KERNEL(softmax_fused16_kernel, 16)

// ---------------------------------------------------------------------------------------
// v3, online softmax: rows of any length. A persistent grid: about one block per SM, each
// looping over rows blockIdx.x, blockIdx.x + gridDim.x, ... (see pass 2 below for why).
//
// Pass 1 keeps, per thread, a running max m and the sum s of exp(x - m) over the elements
// seen so far. When a larger value arrives, the old sum is rescaled to the new max:
//     m' = max(m, v),  s' = s * exp(m - m') + exp(v - m').
// The threads' (m, s) pairs are then merged across the block the same way. Pass 2 reads
// the row again and writes exp(x - M) / S. The row is read twice instead of three times,
// and pass 2 walks the row backwards so that it starts with the columns pass 1 read last,
// the ones most likely still in the L2 cache. Keeping only about one row per SM in flight
// (132 rows x 256 KB at 65536 columns, within the 50 MB L2 of an H100) is what lets the
// second read come from the cache instead of memory.
//
// A max of -inf (nothing seen yet, or only -inf values) must not be subtracted from
// itself: -inf - -inf is NaN. The `m > -INFINITY` tests keep such terms at 0.
__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;  // rescale the old sum to the new max (exp(-inf) = 0)
        m = v;
    } else if (m > -INFINITY) {
        s += expf(v - m);
    }
}

__device__ __forceinline__ void online_add4(float& m, float& s, float4 p) {
    float mc = fmaxf(fmaxf(p.x, p.y), fmaxf(p.z, p.w));
    if (mc > m) {
        s *= expf(m - mc);
        m = mc;
    }
    if (m > -INFINITY) {
        s += (expf(p.x - m) + expf(p.y - m)) + (expf(p.z - m) + expf(p.w - m));
    }
}

// One row: x and y point at its first column. vec4 != 0: cols % 4 == 0 and x, y 16-byte
// aligned (the launcher checks), so the row is read and written as float4s.
__device__ void softmax_online_row(const float* __restrict__ x, float* __restrict__ y, int cols, int vec4,
                                   float* scratch) {
    int t = threadIdx.x, bd = blockDim.x;
    float m = -INFINITY, s = 0.0f;
    if (vec4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        int n4 = cols / 4;
        int i = t;
        for (; i + bd < n4; i += 2 * bd) {  // two loads in flight per thread
            float4 p = x4[i];
            float4 q = x4[i + bd];
            online_add4(m, s, p);
            online_add4(m, s, q);
        }
        for (; i < n4; i += bd) online_add4(m, s, x4[i]);
    } else {
        for (int c = t; c < cols; c += bd) online_add(m, s, x[c]);
    }
    // Merge the threads' (m, s): rescale every s to the row max, then sum.
    float row_max = block_max(m, scratch);
    s = (m > -INFINITY) ? s * expf(m - row_max) : 0.0f;
    float inv = 1.0f / block_sum(s, scratch);
    if (vec4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        int n4 = cols / 4;
        if (t < n4) {
            for (int i = t + ((n4 - 1 - t) / bd) * bd; i >= 0; i -= bd) {  // backwards
                float4 p = x4[i];
                p.x = expf(p.x - row_max) * inv;
                p.y = expf(p.y - row_max) * inv;
                p.z = expf(p.z - row_max) * inv;
                p.w = expf(p.w - row_max) * inv;
                y4[i] = p;
            }
        }
    } else if (t < cols) {
        for (int c = t + ((cols - 1 - t) / bd) * bd; c >= 0; c -= bd) {  // backwards
            y[c] = expf(x[c] - row_max) * inv;
        }
    }
}

__global__ void softmax_online_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr,
                                      int rows, int cols, int vec4) {
    __shared__ float scratch[32];
    // Every thread of the block runs the same rows, so the barriers inside stay uniform
    // (block_max and block_sum begin with a barrier: the next row cannot overwrite scratch early).
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        long long offset = (long long)r * cols;
        softmax_online_row(x_ptr + offset, y_ptr + offset, cols, vec4, scratch);
    }
}

// ---------------------------------------------------------------------------------------
// v5, the row on chip: one block per row, the whole row kept on the SM between reading it
// and writing the result, so x is read from memory once even when a row is too long for
// registers alone. v3 reads a long row twice (its second read hits the L2 cache only in
// part); this is v2's one read and one write, for rows up to about 90,000 columns.
//
// A 65536-column row is 256 KB; an H100 SM has 256 KB of registers and 227 KB of shared
// memory a block may use. So each of the 1024 threads keeps REG vectors (float4 when the
// row allows, else float) in registers, and the rest of the row goes to dynamic shared
// memory: 8 float4 x 1024 threads = 128 KB in registers, the other 128 KB in shared memory.
// Every thread reads back only the shared-memory slots it wrote itself, so the stash needs
// no barrier of its own (the block reductions have theirs).
//
// One block of 1024 threads per SM cannot overlap one row's reads with another's writes as
// several smaller blocks would; what it gains is that no byte of x is read twice.
__device__ __forceinline__ float vmax(float v) { return v; }
__device__ __forceinline__ float vmax(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

// v <- exp(v - m), and return the sum of the (new) elements.
__device__ __forceinline__ float vexp(float& v, float m) {
    v = expf(v - m);
    return v;
}
__device__ __forceinline__ float vexp(float4& v, float m) {
    v.x = expf(v.x - m);
    v.y = expf(v.y - m);
    v.z = expf(v.z - m);
    v.w = expf(v.w - m);
    return (v.x + v.y) + (v.z + v.w);
}

__device__ __forceinline__ void vscale(float& v, float s) { v *= s; }
__device__ __forceinline__ void vscale(float4& v, float s) {
    v.x *= s;
    v.y *= s;
    v.z *= s;
    v.w *= s;
}

// One row of n vectors (V = float or float4). Vector i lives in register slot k of thread
// t when i = t + k * blockDim.x < REG * blockDim.x (coalesced, as in v2), else in stash[i -
// REG * blockDim.x]. The launcher gives the stash (n - REG * blockDim.x) vectors.
template <typename V, int REG>
__device__ __forceinline__ void softmax_onchip_row(const V* __restrict__ x, V* __restrict__ y, int n,
                                                   V* stash, float* scratch) {
    int t = threadIdx.x, bd = blockDim.x, first = REG * bd;
    V r[REG];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < REG; k++) {  // REG independent loads in flight per thread
        int i = t + k * bd;
        if (i < n) {
            r[k] = x[i];
            m = fmaxf(m, vmax(r[k]));
        }
    }
#pragma unroll 4
    for (int i = first + t; i < n; i += bd) {  // the rest of the row: into shared memory
        V v = x[i];
        stash[i - first] = v;
        m = fmaxf(m, vmax(v));
    }
    m = block_max(m, scratch);
    // A row of only -inf has max -inf, and -inf - -inf is NaN: as torch.softmax gives.
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < REG; k++) {
        if (t + k * bd < n) s += vexp(r[k], m);
    }
    for (int i = first + t; i < n; i += bd) {
        V v = stash[i - first];
        s += vexp(v, m);
        stash[i - first] = v;
    }
    float inv = 1.0f / block_sum(s, scratch);
#pragma unroll
    for (int k = 0; k < REG; k++) {
        int i = t + k * bd;
        if (i < n) {
            vscale(r[k], inv);
            y[i] = r[k];
        }
    }
    for (int i = first + t; i < n; i += bd) {
        V v = stash[i - first];
        vscale(v, inv);
        y[i] = v;
    }
}

#define SOFTMAX_ONCHIP_REG 8

// vec4 kernel: cols % 4 == 0 and x, y 16-byte aligned (the launcher checks); n4 = cols / 4.
__global__ void __launch_bounds__(1024) softmax_onchip4_kernel(const float* __restrict__ x_ptr,
                                                                float* __restrict__ y_ptr, int cols) {
    __shared__ float scratch[32];
    extern __shared__ float4 stash4[];
    long long offset = (long long)blockIdx.x * cols;
    softmax_onchip_row<float4, SOFTMAX_ONCHIP_REG>(reinterpret_cast<const float4*>(x_ptr + offset),
                                                   reinterpret_cast<float4*>(y_ptr + offset), cols / 4,
                                                   stash4, scratch);
}

// scalar kernel: any cols and alignment.
__global__ void __launch_bounds__(1024) softmax_onchip1_kernel(const float* __restrict__ x_ptr,
                                                                float* __restrict__ y_ptr, int cols) {
    __shared__ float scratch[32];
    extern __shared__ float4 stash1[];  // float4 only for its 16-byte alignment
    long long offset = (long long)blockIdx.x * cols;
    softmax_onchip_row<float, SOFTMAX_ONCHIP_REG>(x_ptr + offset, y_ptr + offset, cols,
                                                  reinterpret_cast<float*>(stash1), scratch);
}
