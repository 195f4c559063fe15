// LayerNorm and RMSNorm over the last dim of a (rows, cols) row-major float32 matrix:
//     y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps),  var = mean((x - mean)^2)
//
// Loaded by kernels/cuda/layernorm.py through utils.cuda_kernel. The versions of lesson 09
// (VERSIONS and BACKWARD_VERSIONS in layernorm.py, naive to best):
//   forward
//   v1  a block per row, three passes over the row from memory          layernorm_block_kernel
//   v2  a warp per row, reductions by shuffles only (short rows)        layernorm_warp_kernel
//   v3  a block per row held in registers: x read once                  layernorm_reg{1,2,4,8,16}_kernel
//   v4  v2 up to 256 columns, v3 up to 16384, v1 beyond
//   v5  the reference, float32 or bfloat16: 16-byte vectors, the row in registers, a warp per row (several rows a block) for short rows
//       layernorm_vec_kernel<T, VEC, ITEMS, ROWS, RMS>, LayerNorm's and RMSNorm's forward
//   backward
//   atomic  dx per row, dw/db by atomicAdd                               layernorm_bwd_atomic_kernel
//   partials  fused: dx and per-block dw/db partials, then a column-sum kernel
//             layernorm_bwd_partials_kernel, then column_sum_kernel
//   vec  the reference, float32 or bfloat16: partials with 16-byte vectors, x and dy read once, dw/db shares in registers or shared memory
//        layernorm_bwd_vec_kernel<T, VEC, ITEMS, RMS, SHARED>, then column_sum_vec_kernel (dw and db in one launch)
//   rmsnorm  rmsnorm_kernel, rmsnorm_bwd_partials_kernel (and v5's kernels with RMS = true)
//
// Never E[x^2] - E[x]^2: with x = 1000 + randn, E[x^2] is about 1e6 and float32 keeps it to
// about 0.06, the size of the variance itself. Subtract the mean first, then square.
#include "reduce.h"  // warp_sum, block_sum: every thread gets the result
#include <cuda_bf16.h>

// ---------------------------------------------------------------------------------------
// v1: a block per row; pass 1 the mean, pass 2 the variance, pass 3 normalizes (the later
// passes mostly hit the cache, but each is a full trip over the row).
__global__ void layernorm_block_kernel(const float* __restrict__ x_ptr, const float* __restrict__ w_ptr,
                                       const float* __restrict__ b_ptr, float* __restrict__ y_ptr,
                                       float* __restrict__ mean_ptr, float* __restrict__ rstd_ptr,
                                       int cols, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* x = x_ptr + row * cols;
    float* y = y_ptr + row * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += x[c];
    float mean = block_sum(s, scratch) / cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = x[c] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] = (x[c] - mean) * rstd * w_ptr[c] + b_ptr[c];
    if (threadIdx.x == 0) {
        mean_ptr[row] = mean;
        rstd_ptr[row] = rstd;
    }
}

// ---------------------------------------------------------------------------------------
// v2: a warp per row (rows of a few hundred columns): no shared memory, no __syncthreads.
// blockDim.x = 32 * warps; warp w of block b normalizes row b * warps + w.
__global__ void layernorm_warp_kernel(const float* __restrict__ x_ptr, const float* __restrict__ w_ptr,
                                      const float* __restrict__ b_ptr, float* __restrict__ y_ptr,
                                      float* __restrict__ mean_ptr, float* __restrict__ rstd_ptr,
                                      int rows, int cols, float eps) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // a whole warp leaves together: the shuffles below stay full
    const float* x = x_ptr + row * cols;
    float* y = y_ptr + row * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += x[c];
    float mean = warp_sum(s) / cols;
    float q = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        float d = x[c] - mean;
        q += d * d;
    }
    float rstd = rsqrtf(warp_sum(q) / cols + eps);
    for (int c = lane; c < cols; c += 32) y[c] = (x[c] - mean) * rstd * w_ptr[c] + b_ptr[c];
    if (lane == 0) {
        mean_ptr[row] = mean;
        rstd_ptr[row] = rstd;
    }
}

// ---------------------------------------------------------------------------------------
// v3: a block per row held in registers, ITEMS values per thread: x is read from memory once,
// the variance is still two-pass, over registers.
template <int ITEMS>
__device__ void layernorm_row_registers(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ b, float* __restrict__ y, int cols, float eps,
                                        float* mean_out, float* rstd_out, float* scratch) {
    float v[ITEMS];
    float s = 0.0f;
    for (int k = 0; k < ITEMS; k++) {
        int c = threadIdx.x + k * blockDim.x;
        v[k] = c < cols ? x[c] : 0.0f;
        s += v[k];
    }
    float mean = block_sum(s, scratch) / cols;
    float q = 0.0f;
    for (int k = 0; k < ITEMS; k++) {
        int c = threadIdx.x + k * blockDim.x;
        float d = c < cols ? v[k] - mean : 0.0f;
        q += d * d;
    }
    float rstd = rsqrtf(block_sum(q, scratch) / cols + eps);
    for (int k = 0; k < ITEMS; k++) {
        int c = threadIdx.x + k * blockDim.x;
        if (c < cols) y[c] = (v[k] - mean) * rstd * w[c] + b[c];
    }
    if (threadIdx.x == 0) {
        *mean_out = mean;
        *rstd_out = rstd;
    }
}

#define LAYERNORM_REG_KERNEL(NAME, ITEMS)                                                            \
    __global__ void NAME(const float* __restrict__ x_ptr, const float* __restrict__ w_ptr,           \
                         const float* __restrict__ b_ptr, float* __restrict__ y_ptr, float* mean_ptr, \
                         float* rstd_ptr, int cols, float eps) {                                     \
        __shared__ float scratch[32];                                                                \
        long long offset = (long long)blockIdx.x * cols;                                             \
        layernorm_row_registers<ITEMS>(x_ptr + offset, w_ptr, b_ptr, y_ptr + offset, cols, eps,      \
                                       mean_ptr + blockIdx.x, rstd_ptr + blockIdx.x, scratch);       \
    }
LAYERNORM_REG_KERNEL(layernorm_reg1_kernel, 1)
LAYERNORM_REG_KERNEL(layernorm_reg2_kernel, 2)
LAYERNORM_REG_KERNEL(layernorm_reg4_kernel, 4)
LAYERNORM_REG_KERNEL(layernorm_reg8_kernel, 8)
LAYERNORM_REG_KERNEL(layernorm_reg16_kernel, 16)

// ---------------------------------------------------------------------------------------
// Backward of one row: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
// Two row reductions; block_sum's barriers keep the second from overwriting the first's
// scratch before every warp has read it. Returns nothing; dw/db terms are added by `add`.
template <class Add>
__device__ void layernorm_bwd_row(const float* __restrict__ dy, const float* __restrict__ x,
                                  const float* __restrict__ w, float mean, float rstd, float* __restrict__ dx,
                                  int cols, float* scratch, Add add) {
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float xhat = (x[c] - mean) * rstd;
        float g = dy[c] * w[c];
        s1 += g * xhat;
        s2 += g;
    }
    float c1 = block_sum(s1, scratch) / cols;
    float c2 = block_sum(s2, scratch) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float xhat = (x[c] - mean) * rstd;
        float g = dy[c] * w[c];
        dx[c] = (g - xhat * c1 - c2) * rstd;
        add(c, dy[c] * xhat, dy[c]);
    }
}

// dw/db by atomics: each row adds its terms into the same cols floats.
__global__ void layernorm_bwd_atomic_kernel(const float* __restrict__ dy_ptr, const float* __restrict__ x_ptr,
                                            const float* __restrict__ w_ptr, const float* __restrict__ mean_ptr,
                                            const float* __restrict__ rstd_ptr, float* __restrict__ dx_ptr,
                                            float* dw_ptr, float* db_ptr, int cols) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    long long off = row * cols;
    layernorm_bwd_row(dy_ptr + off, x_ptr + off, w_ptr, mean_ptr[row], rstd_ptr[row], dx_ptr + off, cols, scratch,
                      [&](int c, float dwv, float dbv) {
                          atomicAdd(&dw_ptr[c], dwv);
                          atomicAdd(&db_ptr[c], dbv);
                      });
}

// dw/db by per-block partials: a persistent grid, block k handles rows k, k + gridDim.x, ...
// and owns row k of the partial buffers (no other block touches it: no atomics needed).
// Each column c is always handled by the same thread, so the running sum can live in the
// partial buffer without a race.
__global__ void layernorm_bwd_partials_kernel(const float* __restrict__ dy_ptr, const float* __restrict__ x_ptr,
                                              const float* __restrict__ w_ptr, const float* __restrict__ mean_ptr,
                                              const float* __restrict__ rstd_ptr, float* __restrict__ dx_ptr,
                                              float* __restrict__ pdw_ptr, float* __restrict__ pdb_ptr, int rows,
                                              int cols) {
    __shared__ float scratch[32];
    float* pdw = pdw_ptr + (long long)blockIdx.x * cols;
    float* pdb = pdb_ptr + (long long)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        pdw[c] = 0.0f;
        pdb[c] = 0.0f;
    }
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long off = row * cols;
        layernorm_bwd_row(dy_ptr + off, x_ptr + off, w_ptr, mean_ptr[row], rstd_ptr[row], dx_ptr + off, cols,
                          scratch, [&](int c, float dwv, float dbv) {
                              pdw[c] += dwv;
                              pdb[c] += dbv;
                          });
    }
}

// Stage 2: out[c] = sum over parts of p[part, c]; a thread per column, coalesced across c.
__global__ void column_sum_kernel(const float* __restrict__ p_ptr, float* __restrict__ out_ptr, int parts,
                                  int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int p = 0; p < parts; p++) s += p_ptr[(long long)p * cols + c];
    out_ptr[c] = s;
}

// ---------------------------------------------------------------------------------------
// RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). One reduction, no mean.
__global__ void rmsnorm_kernel(const float* __restrict__ x_ptr, const float* __restrict__ w_ptr,
                               float* __restrict__ y_ptr, float* __restrict__ rstd_ptr, int cols, float eps) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* x = x_ptr + row * cols;
    float* y = y_ptr + row * cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) q += x[c] * x[c];
    float rstd = rsqrtf(block_sum(q, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] = x[c] * rstd * w_ptr[c];
    if (threadIdx.x == 0) rstd_ptr[row] = rstd;
}

__global__ void rmsnorm_bwd_partials_kernel(const float* __restrict__ dy_ptr, const float* __restrict__ x_ptr,
                                            const float* __restrict__ w_ptr, const float* __restrict__ rstd_ptr,
                                            float* __restrict__ dx_ptr, float* __restrict__ pdw_ptr, int rows,
                                            int cols) {
    __shared__ float scratch[32];
    float* pdw = pdw_ptr + (long long)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) pdw[c] = 0.0f;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long off = row * cols;
        const float* x = x_ptr + off;
        const float* dy = dy_ptr + off;
        float rstd = rstd_ptr[row];
        float s = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s += dy[c] * w_ptr[c] * x[c] * rstd;
        float c1 = block_sum(s, scratch) / cols;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = x[c] * rstd;
            dx_ptr[off + c] = (dy[c] * w_ptr[c] - xhat * c1) * rstd;
            pdw[c] += dy[c] * xhat;
        }
    }
}

// ---------------------------------------------------------------------------------------
// v5: the reference, at the memory roofline. Three things v3 and v2 do not do:
//   * 16-byte loads and stores (VEC = 4 floats or 8 bfloat16 a vector): a quarter of the
//     memory instructions, and more bytes in flight per thread;
//   * the row stays in registers, as float, whatever T is: x is read from memory once;
//   * short rows: a warp per row and ROWS rows a block (ROWS > 1, group = 32 threads), so a
//     block moves enough bytes; long rows: the whole block on one row (ROWS = 1).
// T is float or __nv_bfloat16 (statistics and arithmetic in float, y rounded once). RMS:
// RMSNorm (no mean, no b). VEC = 1 serves rows whose length or address is not a multiple
// of 16 bytes.
template <class T> __device__ __forceinline__ float to_float(T v) { return float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_float(float v) { return T(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// VEC values of T at p (16 bytes when sizeof(T) * VEC == 16), as floats. STREAM: read once,
// do not keep it in the caches (__ldcs: x, dy).
template <class T, int VEC, bool STREAM>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
    if constexpr (sizeof(T) * VEC == 16) {
        float4 raw = STREAM ? __ldcs(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
        const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++) out[i] = to_float(t[i]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) out[i] = to_float(p[i]);
    }
}

template <class T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
    if constexpr (sizeof(T) * VEC == 16) {
        float4 raw;
        T* t = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++) t[i] = from_float<T>(in[i]);
        __stcs(reinterpret_cast<float4*>(p), raw);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) p[i] = from_float<T>(in[i]);
    }
}

// The sum over the threads of one row: a warp (ROWS > 1) or the whole block (ROWS == 1).
template <int ROWS>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
    if constexpr (ROWS > 1) return warp_sum(v);
    else return block_sum(v, scratch);
}

template <class T, int VEC, int ITEMS, int ROWS, bool RMS>
__global__ void layernorm_vec_kernel(const T* __restrict__ x_ptr, const T* __restrict__ w_ptr,
                                     const T* __restrict__ b_ptr, T* __restrict__ y_ptr,
                                     float* __restrict__ mean_ptr, float* __restrict__ rstd_ptr,
                                     int rows, int cols, float eps) {
    __shared__ float scratch[32];
    const int group = blockDim.x / ROWS;  // threads of one row: 32 when ROWS > 1
    const int t = threadIdx.x % group;
    const long long row = (long long)blockIdx.x * ROWS + threadIdx.x / group;
    if (ROWS > 1 && row >= rows) return;  // a whole warp leaves: its shuffles stay full
    const T* x = x_ptr + row * cols;
    float v[ITEMS][VEC];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        int c = (t + k * group) * VEC;
        if (c < cols) {
            load_vec<T, VEC, true>(x + c, v[k]);
        } else {
#pragma unroll
            for (int i = 0; i < VEC; i++) v[k][i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < VEC; i++) s += RMS ? v[k][i] * v[k][i] : v[k][i];
    }
    float mean = 0.0f, rstd;
    if constexpr (RMS) {
        rstd = rsqrtf(row_sum<ROWS>(s, scratch) / cols + eps);
    } else {
        mean = row_sum<ROWS>(s, scratch) / cols;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            if ((t + k * group) * VEC < cols) {
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    float d = v[k][i] - mean;
                    q += d * d;
                }
            }
        }
        rstd = rsqrtf(row_sum<ROWS>(q, scratch) / cols + eps);
    }
    T* y = y_ptr + row * cols;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        int c = (t + k * group) * VEC;
        if (c < cols) {
            float wv[VEC], bv[VEC], out[VEC];
            load_vec<T, VEC, false>(w_ptr + c, wv);
            if constexpr (!RMS) load_vec<T, VEC, false>(b_ptr + c, bv);
#pragma unroll
            for (int i = 0; i < VEC; i++) out[i] = RMS ? v[k][i] * rstd * wv[i] : (v[k][i] - mean) * rstd * wv[i] + bv[i];
            store_vec<T, VEC>(y + c, out);
        }
    }
    if (t == 0) {
        if constexpr (!RMS) mean_ptr[row] = mean;
        rstd_ptr[row] = rstd;
    }
}

// Backward v5: a persistent grid, each block takes rows blockIdx.x, + gridDim.x, ...; its
// threads keep the same columns for every row, so each thread adds its columns' shares of dw
// and db up where no other thread touches them (no atomics, no barrier) and writes them out
// once at the end: one row of partials per block, summed by column_sum_vec_kernel. Where the
// shares live is SHARED: in registers (false), or in the block's shared memory (true: fewer
// registers a thread, so more blocks, and more rows in flight, an SM). Registers hold x-hat
// and g = dy * w of the current row; the two row sums share one pair of barriers. x and dy are
// read once (16-byte loads). p_ptr: (RMS ? 1 : 2, gridDim.x, cols) floats, dw's partials then
// db's. Dynamic shared memory with SHARED: (RMS ? 1 : 2) * cols floats.
template <int VEC>
__device__ __forceinline__ void add_shared(float* acc, const float* v) {
    if constexpr (VEC % 4 == 0) {  // 16-byte shared accesses: a quarter of the instructions, no bank conflict
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
            float4 a = *reinterpret_cast<float4*>(acc + j);
            a.x += v[j], a.y += v[j + 1], a.z += v[j + 2], a.w += v[j + 3];
            *reinterpret_cast<float4*>(acc + j) = a;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) acc[i] += v[i];
    }
}

template <class T, int VEC, int ITEMS, bool RMS, bool SHARED>
__global__ void layernorm_bwd_vec_kernel(const T* __restrict__ dy_ptr, const T* __restrict__ x_ptr,
                                         const T* __restrict__ w_ptr, const float* __restrict__ mean_ptr,
                                         const float* __restrict__ rstd_ptr, T* __restrict__ dx_ptr,
                                         float* __restrict__ p_ptr, int rows, int cols) {
    __shared__ float scratch[64];
    extern __shared__ float acc[];  // SHARED: [cols] dw shares, then [cols] db shares (LayerNorm)
    float adw[SHARED ? 1 : ITEMS][VEC], adb[SHARED ? 1 : ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        int c = (threadIdx.x + k * blockDim.x) * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            if constexpr (SHARED) {
                if (c < cols) {
                    acc[c + i] = 0.0f;
                    if constexpr (!RMS) acc[cols + c + i] = 0.0f;
                }
            } else {
                adw[k][i] = adb[k][i] = 0.0f;
            }
        }
    }
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long off = row * cols;
        const float mean = RMS ? 0.0f : mean_ptr[row];
        const float rstd = rstd_ptr[row];
        float xh[ITEMS][VEC], g[ITEMS][VEC];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            int c = (threadIdx.x + k * blockDim.x) * VEC;
            if (c < cols) {
                float dyv[VEC], wv[VEC], dxh[VEC];
                load_vec<T, VEC, true>(x_ptr + off + c, xh[k]);
                load_vec<T, VEC, true>(dy_ptr + off + c, dyv);
                load_vec<T, VEC, false>(w_ptr + c, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    xh[k][i] = (xh[k][i] - mean) * rstd;
                    g[k][i] = dyv[i] * wv[i];
                    s1 += g[k][i] * xh[k][i];
                    s2 += g[k][i];
                    dxh[i] = dyv[i] * xh[k][i];
                }
                if constexpr (SHARED) {
                    add_shared<VEC>(acc + c, dxh);
                    if constexpr (!RMS) add_shared<VEC>(acc + cols + c, dyv);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; i++) {
                        adw[k][i] += dxh[i];
                        adb[k][i] += dyv[i];
                    }
                }
            } else {  // past the row: nothing adds
#pragma unroll
                for (int i = 0; i < VEC; i++) xh[k][i] = g[k][i] = 0.0f;
            }
        }
        const float2 sums = block_sum2(s1, s2, scratch);
        const float c1 = sums.x / cols;
        const float c2 = RMS ? 0.0f : sums.y / cols;
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            int c = (threadIdx.x + k * blockDim.x) * VEC;
            if (c < cols) {
                float dx[VEC];
#pragma unroll
                for (int i = 0; i < VEC; i++) dx[i] = (g[k][i] - xh[k][i] * c1 - c2) * rstd;
                store_vec<T, VEC>(dx_ptr + off + c, dx);
            }
        }
    }
    float* pdw = p_ptr + (long long)blockIdx.x * cols;
    float* pdb = p_ptr + ((long long)gridDim.x + blockIdx.x) * cols;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        int c = (threadIdx.x + k * blockDim.x) * VEC;
        if (c < cols) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                pdw[c + i] = SHARED ? acc[c + i] : adw[SHARED ? 0 : k][i];
                if constexpr (!RMS) pdb[c + i] = SHARED ? acc[cols + c + i] : adb[SHARED ? 0 : k][i];
            }
        }
    }
}

// Stage 2 of v5's backward: out[c] = the sum over parts of p[part, c], rounded once to T; for
// blockIdx.y = 1, out2[c] = that of the next (parts, cols) partials (dw's, then db's). A block is 32 columns by COLSUM_SLICES
// slices of the parts (blockDim (32, COLSUM_SLICES)): each warp reads 128 contiguous bytes a
// step, and a grid of (cols / 32) x 2 blocks fills the GPU where a thread per column left it
// idle. The slices are added in a fixed order: the result does not change from run to run.
#define COLSUM_SLICES 16
template <class T>
__global__ void column_sum_vec_kernel(const float* __restrict__ p_ptr, T* __restrict__ out_ptr, T* __restrict__ out2_ptr,
                                      int parts, int cols) {
    __shared__ float slice[COLSUM_SLICES][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const float* p = p_ptr + (long long)blockIdx.y * parts * cols;
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (int k = threadIdx.y; k < parts; k += COLSUM_SLICES) s += p[(long long)k * cols + c];
    }
    slice[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < COLSUM_SLICES; j++) t += slice[j][threadIdx.x];
        (blockIdx.y ? out2_ptr : out_ptr)[c] = from_float<T>(t);
    }
}
