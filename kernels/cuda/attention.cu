// Attention o = softmax(q kᵀ / √d) v in CUDA C++, per batch and head, forward and backward.
// q (BH, Nq, d), k and v (BH, Nk, d), o (BH, Nq, d), row-major (BH = batch x heads), and the
// logsumexp L (BH, Nq) of each query's scores, natural log, +inf for a query that sees no key.
//
// Loaded by kernels/cuda/attention.py through utils.cuda_kernel (NVRTC on a GPU, the course's
// CPU emulator without one). The launchers live in attention.py.
//
// The causal mask is aligned to the bottom right: query i sees key j when j <= i + diag, with
// diag = Nk - Nq (0 for square attention).
//
// The versions of lesson 10 (VERSIONS in attention.py, naive to best):
//   v1  naive: three kernels (scores, row softmax, P V), the N x N scores through memory
//       attn_scores_kernel, attn_softmax_kernel, attn_pv_kernel: the Nq x Nk scores go to
//       memory, come back for the softmax (P written over them) and again for P V: N² floats
//       written and read three times
//   v2  one query row per block, online softmax over chunks of keys (float32)
//       attn_row_kernel: the online softmax of lesson 05 over the keys: running max m, sum l
//       and output row, rescaled by exp(m_old - m_new) whenever a chunk of keys raises the
//       max. No N² tensor.
//   v3  FlashAttention-2 on tensor cores (wmma): 64 queries per block, 64-key tiles in shared memory, fp16/bf16 in, fp32 accumulation
//       attn_wmma_kernel<T, D>, T = __half or __nv_bfloat16, D = 16 .. 128: 16 queries per
//       warp, S = Q Kᵀ and O += P V through nvcuda::wmma
//   backward, float32 SIMT:               attn_bwd_delta_kernel, attn_bwd_kv_kernel, attn_bwd_q_kernel
//      P recomputed from L, D = rowsum(dO ∘ O); dK and dV per tile of keys, dQ either added
//      atomically by those blocks or computed per tile of queries in a second kernel, the
//      two designs of BACKWARDS in attention.py:
//   separate  dK/dV per key tile, then dQ per query tile (float32 SIMT, no atomics)
//   atomic  dK/dV per key tile, dQ added with atomicAdd (float32 SIMT)
#include "reduce.h"  // warp_sum, warp_max, block_sum, block_max: every thread gets the result
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// ---------------------------------------------------------------------------------------
// v1, naive. Kernel 1: S[bh, i, j] = (q_i · k_j) / √d, -inf where the causal mask hides j.
// One thread per score; threadIdx.x along j, so a warp reads one q row (a broadcast) and
// writes 32 neighbouring scores (coalesced).
__global__ void attn_scores_kernel(const float* __restrict__ q_ptr, const float* __restrict__ k_ptr,
                                   float* __restrict__ s_ptr, int Nq, int Nk, int d, float scale,
                                   int diag, int causal) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    long long bh = blockIdx.z;
    if (i >= Nq || j >= Nk) return;
    const float* q = q_ptr + (bh * Nq + i) * d;
    const float* k = k_ptr + (bh * Nk + j) * d;
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s += q[c] * k[c];
    s *= scale;
    if (causal && j > i + diag) s = -INFINITY;
    s_ptr[(bh * Nq + i) * Nk + j] = s;
}

// Kernel 2: one block per row of S: its max and sum, then P = exp(S - max) / sum written over
// S, and L = max + log(sum). A row with no visible key (all -inf) gets P = 0 and L = +inf.
__global__ void attn_softmax_kernel(float* __restrict__ s_ptr, float* __restrict__ lse_ptr, int Nk) {
    __shared__ float scratch[32];
    float* row = s_ptr + (long long)blockIdx.x * Nk;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, scratch);
    float shift = (m == -INFINITY) ? 0.0f : m;  // exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN
    float l = 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) l += expf(row[j] - shift);
    l = block_sum(l, scratch);
    float inv = (l > 0.0f) ? 1.0f / l : 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) row[j] = expf(row[j] - shift) * inv;
    if (threadIdx.x == 0) lse_ptr[blockIdx.x] = (l > 0.0f) ? shift + logf(l) : INFINITY;
}

// Kernel 3: o[bh, i, c] = Σ_j P[bh, i, j] v[bh, j, c], one thread per output; threadIdx.x
// along c: a warp reads one P value (a broadcast) and 32 neighbouring values of v.
__global__ void attn_pv_kernel(const float* __restrict__ p_ptr, const float* __restrict__ v_ptr,
                               float* __restrict__ o_ptr, int Nq, int Nk, int d) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    long long bh = blockIdx.z;
    if (i >= Nq || c >= d) return;
    const float* p = p_ptr + (bh * Nq + i) * Nk;
    const float* v = v_ptr + bh * Nk * d + c;
    float acc = 0.0f;
    for (int j = 0; j < Nk; ++j) acc += p[j] * v[(long long)j * d];
    o_ptr[(bh * Nq + i) * d + c] = acc;
}

// ---------------------------------------------------------------------------------------
// v2, one query row per block (blockIdx.x = i, blockIdx.y = bh), ROW_THREADS threads, d <= ROW_THREADS.
// The keys go by in chunks of ROW_THREADS: thread t scores key j0 + t, the block finds the
// chunk's max, every thread keeps the running max m and sum l (the same in every thread),
// and thread t < d owns column t of the output row, rescaled by alpha = exp(m_old - m_new)
// before the chunk's p · v is added. The chunk's probabilities go through shared memory.
#define ROW_THREADS 128
__global__ void __launch_bounds__(ROW_THREADS) attn_row_kernel(const float* __restrict__ q_ptr, const float* __restrict__ k_ptr,
                                                               const float* __restrict__ v_ptr, float* __restrict__ o_ptr,
                                                               float* __restrict__ lse_ptr, int Nq, int Nk, int d, float scale,
                                                               int diag, int causal) {
    __shared__ float q_s[ROW_THREADS];
    __shared__ float p_s[ROW_THREADS];
    __shared__ float scratch[32];
    const int t = threadIdx.x, i = blockIdx.x;
    const long long bh = blockIdx.y;
    const float* k = k_ptr + bh * Nk * d;
    const float* v = v_ptr + bh * Nk * d;
    if (t < d) q_s[t] = q_ptr[(bh * Nq + i) * d + t] * scale;
    __syncthreads();  // q_s is complete before anyone scores a key
    int hi = causal ? min(Nk, i + diag + 1) : Nk;  // keys after i + diag are hidden: never visited
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j0 = 0; j0 < hi; j0 += ROW_THREADS) {
        int j = j0 + t;
        float s = -INFINITY;
        if (j < hi) {
            s = 0.0f;
            for (int c = 0; c < d; ++c) s += q_s[c] * k[(long long)j * d + c];
        }
        float m_new = fmaxf(m, block_max(s, scratch));  // finite: the chunk has a visible key
        float p = (j < hi) ? expf(s - m_new) : 0.0f;
        p_s[t] = p;
        float alpha = expf(m - m_new);                     // 0 on the first chunk (m = -inf)
        l = l * alpha + block_sum(p, scratch);         // its barriers also publish p_s
        if (t < d) {
            acc *= alpha;
            int n = min(ROW_THREADS, hi - j0);
            for (int jj = 0; jj < n; ++jj) acc += p_s[jj] * v[(long long)(j0 + jj) * d + t];
        }
        m = m_new;
        __syncthreads();  // every thread is done with p_s before the next chunk overwrites it
    }
    if (t < d) o_ptr[(bh * Nq + i) * d + t] = (l > 0.0f) ? acc / l : 0.0f;
    if (t == 0) lse_ptr[bh * Nq + i] = (l > 0.0f) ? m + logf(l) : INFINITY;
}

// ---------------------------------------------------------------------------------------
// v3, FlashAttention-2 forward on tensor cores (nvcuda::wmma). A block of 4 warps owns 64
// queries of one (batch, head); warp w owns rows 16w .. 16w + 15. Per tile of 64 keys:
//   1. the block copies K and V (64 x D each, zero past Nk) into shared memory;
//   2. each warp computes its 16 x 64 scores S = Q Kᵀ: Q's fragments stay in registers, Kᵀ
//      is K read as a column-major matrix_b;
//   3. S goes to the warp's shared scratch; two lanes per row find the row's max, rescale,
//      write P = exp2(S·scale·log2 e - m) in fp16/bf16 and update m and l (the
//      running max and sum, in log2 units);
//   4. the warp's output fragments are multiplied by alpha = exp2(m_old - m_new), row by
//      row, then O += P V on the tensor cores.
// A fragment's elements are spread over the 32 lanes in an order the API does not specify.
// To scale row r of an accumulator, each lane must know which row its element x[i] is in:
// the kernel loads, once, a fragment of the same type from a 16 x 16 matrix whose entry
// (r, c) is r: its x[i] is then the row of x[i] in every accumulator fragment of that type.
// The causal mask: tiles above the diagonal are not visited; only tiles that cross the
// diagonal (or the end of the keys) are masked.
#define WM_BM 64
#define WM_BN 64
#define WM_PAD 8      // halves of padding per row: rows 16 bytes apart in the banks
#define WM_SPAD 4     // floats of padding per row of the scores
namespace wmma = nvcuda::wmma;

template <class T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Shared memory of the v3 kernel, in bytes (the launcher passes the same number).
__host__ __device__ constexpr int wmma_smem_bytes(int D) {
    return 3 * WM_BM * (D + WM_PAD) * 2          // Q, K and V tiles (16-bit)
           + 4 * 16 * ((D > WM_BN ? D : WM_BN) + WM_SPAD) * 4   // per-warp scores (float), reused for O at the end
           + 4 * 16 * (WM_BN + WM_PAD) * 2       // per-warp P (16-bit)
           + 16 * 16 * 4                         // the row-index matrix
           + 4 * 16 * 4;                         // per-warp alpha of each row
}

template <class T, int D>
__device__ __forceinline__ void attn_wmma(const T* __restrict__ q_ptr, const T* __restrict__ k_ptr,
                                          const T* __restrict__ v_ptr, T* __restrict__ o_ptr,
                                          float* __restrict__ lse_ptr, int Nq, int Nk, float qk_scale,
                                          int diag, int causal) {
    constexpr int LD = D + WM_PAD;                 // leading dimension of the Q, K, V tiles
    constexpr int SW = (D > WM_BN ? D : WM_BN);    // width of a warp's float scratch
    constexpr int LS = SW + WM_SPAD;
    constexpr int LP = WM_BN + WM_PAD;
    constexpr int DF = D / 16;                     // fragments across the head dimension
    extern __shared__ __align__(128) unsigned char smem[];
    T* q_s = reinterpret_cast<T*>(smem);
    T* k_s = q_s + WM_BM * LD;
    T* v_s = k_s + WM_BM * LD;
    float* s_all = reinterpret_cast<float*>(v_s + WM_BM * LD);
    T* p_all = reinterpret_cast<T*>(s_all + 4 * 16 * LS);
    float* idx_s = reinterpret_cast<float*>(p_all + 4 * 16 * LP);
    float* alpha_all = idx_s + 16 * 16;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * WM_BM;
    float* s_w = s_all + warp * 16 * LS;
    T* p_w = p_all + warp * 16 * LP;
    float* alpha_w = alpha_all + warp * 16;

    // Q tile (zero past Nq) and the row-index matrix.
    for (int f = tid; f < WM_BM * D / 8; f += blockDim.x) {
        int r = f / (D / 8), c = (f % (D / 8)) * 8;
        int4 val = make_int4(0, 0, 0, 0);
        if (q0 + r < Nq) val = *reinterpret_cast<const int4*>(q_ptr + (bh * Nq + q0 + r) * D + c);
        *reinterpret_cast<int4*>(q_s + r * LD + c) = val;
    }
    for (int f = tid; f < 256; f += blockDim.x) idx_s[f] = (float)(f / 16);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> q_frag[DF];
    for (int kk = 0; kk < DF; ++kk) wmma::load_matrix_sync(q_frag[kk], q_s + warp * 16 * LD + kk * 16, LD);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> row_of, o_frag[DF];
    wmma::load_matrix_sync(row_of, idx_s, 16, wmma::mem_row_major);
    for (int c = 0; c < DF; ++c) wmma::fill_fragment(o_frag[c], 0.0f);

    // Two lanes per row: lanes 2r and 2r + 1 own row r of the warp, half of its columns each.
    const int r = lane / 2, half = lane % 2;
    const int qi = q0 + warp * 16 + r;             // this lane's query
    float m = -INFINITY, l = 0.0f;                 // running max (log2 units) and sum of row r
    const int hi = causal ? min(Nk, max(q0 + WM_BM + diag, 0)) : Nk;   // keys past hi: hidden
    for (int j0 = 0; j0 < hi; j0 += WM_BN) {
        __syncthreads();                           // the previous tile is no longer read
        for (int f = tid; f < WM_BN * D / 8; f += blockDim.x) {
            int jr = f / (D / 8), c = (f % (D / 8)) * 8;
            int4 kv = make_int4(0, 0, 0, 0), vv = make_int4(0, 0, 0, 0);
            if (j0 + jr < Nk) {
                kv = *reinterpret_cast<const int4*>(k_ptr + (bh * Nk + j0 + jr) * D + c);
                vv = *reinterpret_cast<const int4*>(v_ptr + (bh * Nk + j0 + jr) * D + c);
            }
            *reinterpret_cast<int4*>(k_s + jr * LD + c) = kv;
            *reinterpret_cast<int4*>(v_s + jr * LD + c) = vv;
        }
        __syncthreads();                           // K and V are complete
        // S = Q Kᵀ: 16 x 64 per warp, four 16 x 16 blocks of keys.
        for (int n = 0; n < WM_BN / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
            for (int kk = 0; kk < DF; ++kk) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kt_frag;
                wmma::load_matrix_sync(kt_frag, k_s + n * 16 * LD + kk * 16, LD);   // Kᵀ, column-major
                wmma::mma_sync(s_frag, q_frag[kk], kt_frag, s_frag);
            }
            wmma::store_matrix_sync(s_w + n * 16, s_frag, LS, wmma::mem_row_major);
        }
        __syncwarp();                              // the warp's scores are in s_w
        // The online softmax of row r, on 32 columns per lane.
        const bool masked = (j0 + WM_BN > Nk) || (causal && j0 + WM_BN - 1 > q0 + warp * 16 + diag);
        // Lane `half` takes the columns 2c + half: the two lanes of a row read neighbouring
        // words, and the 16 rows (LS = 68 floats apart) fall in 16 different banks.
        float x[32];
        float tile_max = -INFINITY;
        for (int c = 0; c < 32; ++c) {
            int jc = 2 * c + half, j = j0 + jc;
            float s = s_w[r * LS + jc] * qk_scale;
            if (masked && (j >= Nk || (causal && j > qi + diag))) s = -INFINITY;
            x[c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));
        float m_new = fmaxf(m, tile_max);
        float shift = (m_new == -INFINITY) ? 0.0f : m_new;   // a row with no visible key yet
        float tile_sum = 0.0f;
        for (int c = 0; c < 32; ++c) {
            float p = exp2f(x[c] - shift);
            tile_sum += p;
            p_w[r * LP + 2 * c + half] = from_f32<T>(p);
        }
        tile_sum += __shfl_xor_sync(FULL_MASK, tile_sum, 1);
        float alpha = exp2f(m - shift);
        l = l * alpha + tile_sum;
        m = m_new;
        if (half == 0) alpha_w[r] = alpha;
        __syncwarp();                              // P and alpha of every row are written
        // O = diag(alpha) O + P V.
        for (int c = 0; c < DF; ++c) {
            for (int e = 0; e < o_frag[c].num_elements; ++e) o_frag[c].x[e] *= alpha_w[(int)row_of.x[e]];
            for (int kk = 0; kk < WM_BN / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> p_frag;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> v_frag;
                wmma::load_matrix_sync(p_frag, p_w + kk * 16, LP);
                wmma::load_matrix_sync(v_frag, v_s + kk * 16 * LD + c * 16, LD);
                wmma::mma_sync(o_frag[c], p_frag, v_frag, o_frag[c]);
            }
        }
    }
    // o = O / l (0 for a query that sees no key) through the warp's scratch, L = (m + log2 l) ln 2.
    __syncwarp();
    if (half == 0) alpha_w[r] = (l > 0.0f) ? 1.0f / l : 0.0f;
    __syncwarp();
    for (int c = 0; c < DF; ++c) {
        for (int e = 0; e < o_frag[c].num_elements; ++e) o_frag[c].x[e] *= alpha_w[(int)row_of.x[e]];
        wmma::store_matrix_sync(s_w + c * 16, o_frag[c], LS, wmma::mem_row_major);
    }
    __syncwarp();
    if (qi < Nq) {
        for (int c = half; c < D; c += 2) o_ptr[(bh * Nq + qi) * D + c] = from_f32<T>(s_w[r * LS + c]);
        if (half == 0) lse_ptr[bh * Nq + qi] = (l > 0.0f) ? (m + log2f(l)) * LN2 : INFINITY;
    }
}

// One kernel per (dtype, head dimension): attn_wmma_kernel<__half, 64>, <__nv_bfloat16, 128>, ...
// (a template: a launch compiles only the instance it names). 4 warps (128 threads) per block.
template <class T, int D>
__global__ void __launch_bounds__(128) attn_wmma_kernel(const T* __restrict__ q_ptr, const T* __restrict__ k_ptr,
                                                        const T* __restrict__ v_ptr, T* __restrict__ o_ptr,
                                                        float* __restrict__ lse_ptr, int Nq, int Nk, float qk_scale,
                                                        int diag, int causal) {
    attn_wmma<T, D>(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, Nq, Nk, qk_scale, diag, causal);
}

// ---------------------------------------------------------------------------------------
// The backward, float32 SIMT. With P = exp(S - L) recomputed from the saved L:
//     dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP - D),  dQ = scale · dS K,  dK = scale · dSᵀ Q,
// where D_i = rowsum(dO ∘ O)_i (= rowsum(P ∘ dP)_i).
// D: one warp per query row.
__global__ void attn_bwd_delta_kernel(const float* __restrict__ o_ptr, const float* __restrict__ do_ptr,
                                      float* __restrict__ delta_ptr, long long rows, int d) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;                       // the whole warp leaves together
    float acc = 0.0f;
    for (int c = lane; c < d; c += 32) acc += o_ptr[row * d + c] * do_ptr[row * d + c];
    acc = warp_sum(acc);
    if (lane == 0) delta_ptr[row] = acc;
}

// Tiles of 32 queries x 32 keys; 256 threads. Shared memory (floats, dynamic): K, V, Q and dO
// tiles of 32 x d, then P and dS tiles of 32 x 33 (the extra column keeps a warp's accesses
// to a column in different banks), L and D of the 32 queries.
#define BT 32
#define BWD_THREADS 256
#define BWD_MAX_D 128
#define BWD_PER_THREAD (BT * BWD_MAX_D / BWD_THREADS)   // 16 outputs per thread at most

__host__ __device__ constexpr int bwd_smem_floats(int d) { return 4 * BT * d + 2 * BT * (BT + 1) + 2 * BT; }

// Copy `rows` rows of d floats starting at row `first` (zeros past `limit`) into a tile.
__device__ __forceinline__ void load_tile(float* tile, const float* __restrict__ src, int first, int limit, int d) {
    for (int f = threadIdx.x; f < BT * d; f += blockDim.x) {
        int rr = f / d, c = f % d;
        tile[f] = (first + rr < limit) ? src[(long long)(first + rr) * d + c] : 0.0f;
    }
}

// P and dS of a 32 x 32 tile (queries i0.., keys j0..): 4 entries per thread.
__device__ __forceinline__ void p_and_ds(const float* q_s, const float* k_s, const float* v_s, const float* do_s,
                                         const float* lse_s, const float* delta_s, float* p_s, float* ds_s,
                                         int i0, int j0, int Nq, int Nk, int d, float scale, int diag, int causal) {
    for (int f = threadIdx.x; f < BT * BT; f += blockDim.x) {
        int ii = f / BT, jj = f % BT, i = i0 + ii, j = j0 + jj;
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < d; ++c) {
            s += q_s[ii * d + c] * k_s[jj * d + c];
            dp += do_s[ii * d + c] * v_s[jj * d + c];
        }
        bool visible = i < Nq && j < Nk && !(causal && j > i + diag);
        float p = visible ? expf(s * scale - lse_s[ii]) : 0.0f;   // L = +inf (no visible key): p = 0
        p_s[ii * (BT + 1) + jj] = p;
        ds_s[ii * (BT + 1) + jj] = p * (dp - delta_s[ii]);
    }
}

// One block per tile of 32 keys: dK and dV, summed over every query that sees them. With
// `dq_atomic`, the block also adds its share of dQ (scale · dS K) with atomicAdd.
__global__ void __launch_bounds__(BWD_THREADS) attn_bwd_kv_kernel(
        const float* __restrict__ q_ptr, const float* __restrict__ k_ptr, const float* __restrict__ v_ptr,
        const float* __restrict__ do_ptr, const float* __restrict__ lse_ptr, const float* __restrict__ delta_ptr,
        float* dq_ptr, float* __restrict__ dk_ptr, float* __restrict__ dv_ptr,
        int Nq, int Nk, int d, float scale, int diag, int causal, int dq_atomic) {
    extern __shared__ float sm[];
    float *k_s = sm, *v_s = k_s + BT * d, *q_s = v_s + BT * d, *do_s = q_s + BT * d;
    float *p_s = do_s + BT * d, *ds_s = p_s + BT * (BT + 1), *lse_s = ds_s + BT * (BT + 1), *delta_s = lse_s + BT;
    const long long bh = blockIdx.y;
    const int j0 = blockIdx.x * BT, tid = threadIdx.x;
    const float* q = q_ptr + bh * Nq * d;
    const float* dO = do_ptr + bh * Nq * d;
    load_tile(k_s, k_ptr + bh * Nk * d, j0, Nk, d);
    load_tile(v_s, v_ptr + bh * Nk * d, j0, Nk, d);
    // Thread tid owns key j0 + tid / 8 and the columns tid % 8, tid % 8 + 8, ... of dK and dV.
    const int jj = tid / 8, c0 = tid % 8;
    float dk[BWD_PER_THREAD], dv[BWD_PER_THREAD];
    for (int u = 0; u < BWD_PER_THREAD; ++u) dk[u] = dv[u] = 0.0f;
    // The first query that sees key j0 is j0 - diag: earlier tiles of queries are skipped.
    int first = causal ? max(0, (j0 - diag) / BT * BT) : 0;
    for (int i0 = first; i0 < Nq; i0 += BT) {
        __syncthreads();                           // the previous tiles are no longer read
        load_tile(q_s, q, i0, Nq, d);
        load_tile(do_s, dO, i0, Nq, d);
        if (tid < BT) {
            lse_s[tid] = (i0 + tid < Nq) ? lse_ptr[bh * Nq + i0 + tid] : INFINITY;
            delta_s[tid] = (i0 + tid < Nq) ? delta_ptr[bh * Nq + i0 + tid] : 0.0f;
        }
        __syncthreads();                           // the tiles are complete
        p_and_ds(q_s, k_s, v_s, do_s, lse_s, delta_s, p_s, ds_s, i0, j0, Nq, Nk, d, scale, diag, causal);
        __syncthreads();                           // P and dS are complete
        for (int u = 0; u < BWD_PER_THREAD; ++u) {
            int c = c0 + 8 * u;
            if (c < d) {
                float a = 0.0f, b = 0.0f;
                for (int ii = 0; ii < BT; ++ii) {
                    a += p_s[ii * (BT + 1) + jj] * do_s[ii * d + c];
                    b += ds_s[ii * (BT + 1) + jj] * q_s[ii * d + c];
                }
                dv[u] += a;
                dk[u] += b;
            }
        }
        if (dq_atomic) {
            // Thread tid adds to query i0 + tid / 8, columns tid % 8 + 8u: every key tile adds
            // into these rows of dQ, hence the atomics.
            int ii = tid / 8, i = i0 + ii;
            for (int u = 0; u < BWD_PER_THREAD; ++u) {
                int c = c0 + 8 * u;
                if (c < d && i < Nq) {
                    float a = 0.0f;
                    for (int kk = 0; kk < BT; ++kk) a += ds_s[ii * (BT + 1) + kk] * k_s[kk * d + c];
                    atomicAdd(dq_ptr + (bh * Nq + i) * d + c, a * scale);
                }
            }
        }
    }
    int j = j0 + jj;
    if (j < Nk) {
        for (int u = 0; u < BWD_PER_THREAD; ++u) {
            int c = c0 + 8 * u;
            if (c < d) {
                dk_ptr[(bh * Nk + j) * d + c] = dk[u] * scale;
                dv_ptr[(bh * Nk + j) * d + c] = dv[u];
            }
        }
    }
}

// One block per tile of 32 queries: dQ, summed over the keys they see. No atomics: each
// block owns its rows of dQ.
__global__ void __launch_bounds__(BWD_THREADS) attn_bwd_q_kernel(
        const float* __restrict__ q_ptr, const float* __restrict__ k_ptr, const float* __restrict__ v_ptr,
        const float* __restrict__ do_ptr, const float* __restrict__ lse_ptr, const float* __restrict__ delta_ptr,
        float* __restrict__ dq_ptr, int Nq, int Nk, int d, float scale, int diag, int causal) {
    extern __shared__ float sm[];
    float *k_s = sm, *v_s = k_s + BT * d, *q_s = v_s + BT * d, *do_s = q_s + BT * d;
    float *p_s = do_s + BT * d, *ds_s = p_s + BT * (BT + 1), *lse_s = ds_s + BT * (BT + 1), *delta_s = lse_s + BT;
    const long long bh = blockIdx.y;
    const int i0 = blockIdx.x * BT, tid = threadIdx.x;
    load_tile(q_s, q_ptr + bh * Nq * d, i0, Nq, d);
    load_tile(do_s, do_ptr + bh * Nq * d, i0, Nq, d);
    if (tid < BT) {
        lse_s[tid] = (i0 + tid < Nq) ? lse_ptr[bh * Nq + i0 + tid] : INFINITY;
        delta_s[tid] = (i0 + tid < Nq) ? delta_ptr[bh * Nq + i0 + tid] : 0.0f;
    }
    const int ii = tid / 8, c0 = tid % 8;
    float dq[BWD_PER_THREAD];
    for (int u = 0; u < BWD_PER_THREAD; ++u) dq[u] = 0.0f;
    int hi = causal ? min(Nk, max(i0 + BT + diag, 0)) : Nk;   // keys past hi are hidden from every row
    for (int j0 = 0; j0 < hi; j0 += BT) {
        __syncthreads();                           // the previous K, V tiles are no longer read
        load_tile(k_s, k_ptr + bh * Nk * d, j0, Nk, d);
        load_tile(v_s, v_ptr + bh * Nk * d, j0, Nk, d);
        __syncthreads();
        p_and_ds(q_s, k_s, v_s, do_s, lse_s, delta_s, p_s, ds_s, i0, j0, Nq, Nk, d, scale, diag, causal);
        __syncthreads();
        for (int u = 0; u < BWD_PER_THREAD; ++u) {
            int c = c0 + 8 * u;
            if (c < d) {
                float a = 0.0f;
                for (int kk = 0; kk < BT; ++kk) a += ds_s[ii * (BT + 1) + kk] * k_s[kk * d + c];
                dq[u] += a;
            }
        }
    }
    int i = i0 + ii;
    if (i < Nq) {
        for (int u = 0; u < BWD_PER_THREAD; ++u) {
            int c = c0 + 8 * u;
            if (c < d) dq_ptr[(bh * Nq + i) * d + c] = dq[u] * scale;
        }
    }
}
