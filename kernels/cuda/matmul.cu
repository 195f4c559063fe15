// Matrix multiplication C = A @ B in CUDA C++, A (M, K), B (K, N), C (M, N), row-major.
//
// Loaded by kernels/cuda/matmul.py through utils.cuda_kernel (NVRTC on a GPU, the course's
// CPU emulator without one). The launchers live in matmul.py.
//
// The versions of lesson 06, each one a step from memory-bound towards compute-bound
// (VERSIONS in matmul.py, v5 in matmul_fp16.py):
//   v1  naive: one thread per output, A and B read from global memory for every FMA
//       matmul_naive_kernel: 2 loads (through L1/L2) per 2 FLOPs
//   v2  shared-memory tiles: 32 x 32 tiles of A and B, each loaded once per block
//       matmul_tiled_kernel: every thread reuses a tile TILE times, global traffic / TILE
//   v3  register blocking: 128 x 128 tiles, 8 x 8 outputs per thread
//       matmul_regtile_kernel: TM x TN outputs from TM + TN values held in registers per k,
//       shared-memory traffic divided by about TM*TN/(TM+TN)
//   v4  float4 loads, A transposed and padded in shared memory, 128 x 64 tiles (v3 if K or N % 4 != 0)
//       matmul_vec4_kernel: a thread's TM values of A are one float4 load, free of bank conflicts
//   v5  tensor cores (wmma): fp16/bf16 inputs, fp32 accumulation, 64 x 64 tiles, fp32 C
//       matmul_wmma_kernel, matmul_wmma_bf16_kernel: 16x16x16 products, one warp per fragment
//
// Every kernel handles any M, N, K (edge tiles are masked: out-of-range loads read 0 and
// out-of-range outputs are not written) and K = 0 (C = 0). Indices into A, B and C are
// computed in 64 bits: M * K can pass 2**31.
#include "common.h"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

// ---------------------------------------------------------------------------------------
// v1, naive: thread (row, col) computes C[row, col] = sum_k A[row, k] * B[k, col].
// threadIdx.x runs along a row of C, so the 32 threads of a warp read 32 consecutive
// floats of B (coalesced) and all read the same A[row, k] (a broadcast).
__global__ void matmul_naive_kernel(const float* __restrict__ a_ptr, const float* __restrict__ b_ptr,
                                    float* __restrict__ c_ptr, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    const float* a_row = a_ptr + (long long)row * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a_row[k] * b_ptr[(long long)k * N + col];
    c_ptr[(long long)row * N + col] = acc;
}

// ---------------------------------------------------------------------------------------
// v2, shared-memory tiles: a block of TILE x TILE threads computes a TILE x TILE tile of C.
// For each step along K it copies one tile of A and one of B into shared memory (one float
// per thread each), then every thread reads TILE values of each from shared memory.
#define TILE 32

__global__ void matmul_tiled_kernel(const float* __restrict__ a_ptr, const float* __restrict__ b_ptr,
                                    float* __restrict__ c_ptr, int M, int N, int K) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Out-of-range elements are loaded as 0: they add nothing to the sums.
        a_tile[ty][tx] = (row < M && k0 + tx < K) ? a_ptr[(long long)row * K + k0 + tx] : 0.0f;
        b_tile[ty][tx] = (k0 + ty < K && col < N) ? b_ptr[(long long)(k0 + ty) * N + col] : 0.0f;
        __syncthreads();  // both tiles are complete before anyone reads them
        for (int k = 0; k < TILE; ++k) acc += a_tile[ty][k] * b_tile[k][tx];
        __syncthreads();  // everyone is done with the tiles before the next step overwrites them
    }
    if (row < M && col < N) c_ptr[(long long)row * N + col] = acc;
}

// ---------------------------------------------------------------------------------------
// v3, register blocking: a block of (BM/TM) x (BN/TN) threads computes a BM x BN tile of
// C, each thread a TM x TN patch of it. Per step k, a thread reads TM values of A and TN
// of B from shared memory into registers and does TM * TN FMAs with them: with 8 x 8,
// 16 shared loads feed 64 FMAs (v2: 2 loads per FMA).
template <int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void matmul_regtile(const float* __restrict__ a_ptr, const float* __restrict__ b_ptr,
                                               float* __restrict__ c_ptr, int M, int N, int K) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    __shared__ float a_tile[BM][BK];
    __shared__ float b_tile[BK][BN];
    const int tid = threadIdx.x;
    const int trow = tid / (BN / TN), tcol = tid % (BN / TN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = tid; i < BM * BK; i += THREADS) {
            int r = i / BK, k = i % BK;
            a_tile[r][k] = (row0 + r < M && k0 + k < K) ? a_ptr[(long long)(row0 + r) * K + k0 + k] : 0.0f;
        }
        for (int i = tid; i < BK * BN; i += THREADS) {
            int k = i / BN, c = i % BN;
            b_tile[k][c] = (k0 + k < K && col0 + c < N) ? b_ptr[(long long)(k0 + k) * N + col0 + c] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a_reg[TM], b_reg[TN];
            for (int i = 0; i < TM; ++i) a_reg[i] = a_tile[trow * TM + i][k];
            for (int j = 0; j < TN; ++j) b_reg[j] = b_tile[k][tcol * TN + j];
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j) acc[i][j] += a_reg[i] * b_reg[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        int row = row0 + trow * TM + i;
        if (row >= M) break;
        for (int j = 0; j < TN; ++j) {
            int col = col0 + tcol * TN + j;
            if (col < N) c_ptr[(long long)row * N + col] = acc[i][j];
        }
    }
}

// 128 x 128 tiles, 8 x 8 outputs per thread: 256 threads.
__global__ void __launch_bounds__(256) matmul_regtile_kernel(const float* __restrict__ a_ptr, const float* __restrict__ b_ptr,
                                                               float* __restrict__ c_ptr, int M, int N, int K) {
    matmul_regtile<128, 128, 8, 8, 8>(a_ptr, b_ptr, c_ptr, M, N, K);
}

// ---------------------------------------------------------------------------------------
// v4, vectorized: v3 with 16-byte (float4) loads everywhere. It needs K % 4 == 0 and
// N % 4 == 0 (every row of A and B starts on a 16-byte boundary); the launcher checks.
//   * global -> shared: one float4 of A (4 consecutive k) and one of B (4 consecutive
//     columns) per load instruction: a quarter of the instructions;
//   * A is stored TRANSPOSED in shared memory, a_tile[k][row], so the TM values of A a
//     thread needs at step k are consecutive: TM / 4 float4 loads instead of TM scalar
//     loads that each hit another row of the tile;
//   * a_tile's rows are padded by 4 floats: the transposing stores of a warp (threads
//     that loaded rows r and r + 16 write the same k) land in different banks;
//   * a thread's TN columns are TN / 4 groups of 4, the groups BN * 4 / TN apart (and the
//     same for its TM rows): the 8 threads of a quarter-warp then read 8 consecutive
//     float4s of b_tile, all 32 banks once, where 8 consecutive columns per thread would
//     put threads 0 and 4 on the same banks (a 2-way conflict).
// The next tile's global loads are issued before the current tile is computed (kept in
// registers), so their latency hides behind the FMAs.
template <int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void matmul_vec4(const float* __restrict__ a_ptr, const float* __restrict__ b_ptr,
                                            float* __restrict__ c_ptr, int M, int N, int K) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    constexpr int PAD = 4;
    constexpr int ROW_STRIDE = BM / TM, COL_STRIDE = BN / TN;  // between groups of 4, in units of 4
    constexpr int A_LOADS = BM * BK / 4 / THREADS;  // float4 loads per thread and tile
    constexpr int B_LOADS = BK * BN / 4 / THREADS;
    static_assert(A_LOADS * 4 * THREADS == BM * BK && B_LOADS * 4 * THREADS == BK * BN,
                  "the tiles must split evenly into float4 loads");
    __shared__ __align__(16) float a_tile[BK][BM + PAD];  // transposed: a_tile[k][row]
    __shared__ __align__(16) float b_tile[BK][BN];
    const int tid = threadIdx.x;
    const int trow = tid / (BN / TN), tcol = tid % (BN / TN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float4 a_next[A_LOADS], b_next[B_LOADS];
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    auto load_tiles = [&](int k0) {
        for (int l = 0; l < A_LOADS; ++l) {
            int f = tid + l * THREADS, r = f / (BK / 4), k = (f % (BK / 4)) * 4;
            a_next[l] = (row0 + r < M && k0 + k < K)
                            ? *reinterpret_cast<const float4*>(a_ptr + (long long)(row0 + r) * K + k0 + k) : zero;
        }
        for (int l = 0; l < B_LOADS; ++l) {
            int f = tid + l * THREADS, k = f / (BN / 4), c = (f % (BN / 4)) * 4;
            b_next[l] = (k0 + k < K && col0 + c < N)
                            ? *reinterpret_cast<const float4*>(b_ptr + (long long)(k0 + k) * N + col0 + c) : zero;
        }
    };
    float acc[TM][TN] = {};
    load_tiles(0);
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int l = 0; l < A_LOADS; ++l) {
            int f = tid + l * THREADS, r = f / (BK / 4), k = (f % (BK / 4)) * 4;
            a_tile[k + 0][r] = a_next[l].x;
            a_tile[k + 1][r] = a_next[l].y;
            a_tile[k + 2][r] = a_next[l].z;
            a_tile[k + 3][r] = a_next[l].w;
        }
        for (int l = 0; l < B_LOADS; ++l) {
            int f = tid + l * THREADS, k = f / (BN / 4), c = (f % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&b_tile[k][c]) = b_next[l];
        }
        __syncthreads();
        if (k0 + BK < K) load_tiles(k0 + BK);  // in flight while this tile is computed
        for (int k = 0; k < BK; ++k) {
            float a_reg[TM], b_reg[TN];
            for (int i = 0; i < TM; i += 4) {
                float4 v = *reinterpret_cast<const float4*>(&a_tile[k][i * ROW_STRIDE + trow * 4]);
                a_reg[i] = v.x; a_reg[i + 1] = v.y; a_reg[i + 2] = v.z; a_reg[i + 3] = v.w;
            }
            for (int j = 0; j < TN; j += 4) {
                float4 v = *reinterpret_cast<const float4*>(&b_tile[k][j * COL_STRIDE + tcol * 4]);
                b_reg[j] = v.x; b_reg[j + 1] = v.y; b_reg[j + 2] = v.z; b_reg[j + 3] = v.w;
            }
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j) acc[i][j] += a_reg[i] * b_reg[j];
        }
        __syncthreads();  // the tiles are read by everyone before the next step overwrites them
    }
    for (int i = 0; i < TM; ++i) {
        int row = row0 + (i / 4) * 4 * ROW_STRIDE + trow * 4 + i % 4;
        if (row >= M) continue;
        for (int j = 0; j < TN; j += 4) {
            int col = col0 + j * COL_STRIDE + tcol * 4;
            if (col < N)  // N % 4 == 0: the whole float4 is inside
                *reinterpret_cast<float4*>(c_ptr + (long long)row * N + col) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        }
    }
}

// v4's tile shapes. benchmarks/tune/matmul_tune.py times them on a GPU; on an H100 at 4096^3
// the 128 x 64 tile with BK = 8 (128 threads, 8 x 8 outputs each) was the fastest, ahead
// of 128 x 128 tiles (fewer blocks per SM fit beside their registers) and of BK = 16.
#define MATMUL_VEC4_KERNEL(NAME, BM, BN, BK, TM, TN)                                                      \
    __global__ void __launch_bounds__((BM / TM) * (BN / TN)) NAME(const float* __restrict__ a_ptr,       \
                                                                  const float* __restrict__ b_ptr,       \
                                                                  float* __restrict__ c_ptr, int M, int N, int K) { \
        matmul_vec4<BM, BN, BK, TM, TN>(a_ptr, b_ptr, c_ptr, M, N, K);                                  \
    }
MATMUL_VEC4_KERNEL(matmul_vec4_kernel, 128, 64, 8, 8, 8)
MATMUL_VEC4_KERNEL(matmul_vec4_128x128_kernel, 128, 128, 8, 8, 8)
MATMUL_VEC4_KERNEL(matmul_vec4_bk16_kernel, 128, 64, 16, 8, 8)
MATMUL_VEC4_KERNEL(matmul_vec4_64x64_kernel, 64, 64, 16, 4, 4)

// ---------------------------------------------------------------------------------------
// v5, tensor cores through nvcuda::wmma: A and B in fp16 (or bf16), C accumulated in fp32.
// A warp multiplies 16x16x16 fragments with one instruction (mma_sync); every lane of the
// warp takes part in each wmma call. A block of 4 warps computes a 64 x 64 tile of C, each
// warp a 32 x 32 quarter of it (2 x 2 accumulator fragments), in steps of 32 along K.
// The tiles go through shared memory, zero-filled past the edges of A and B, so any M, N,
// K works and every fragment load is aligned: a fragment's pointer must be 32-byte aligned
// and its leading dimension (ldm) a multiple of 16 bytes. The rows of the tiles are padded
// by 8 elements (16 bytes) so the fragment loads of the 16 rows hit different banks.
// `vec8`: K % 8 == 0 and N % 8 == 0, so rows of A and B can be read 8 halves (16 bytes)
// at a time; otherwise one element at a time.
#define WMMA_BM 64
#define WMMA_BN 64
#define WMMA_BK 32
#define WMMA_PAD 8

template <class T>
__device__ __forceinline__ void matmul_wmma(const T* __restrict__ a_ptr, const T* __restrict__ b_ptr,
                                            float* __restrict__ c_ptr, int M, int N, int K, int vec8) {
    using namespace nvcuda;
    __shared__ __align__(32) T a_tile[WMMA_BM][WMMA_BK + WMMA_PAD];
    __shared__ __align__(32) T b_tile[WMMA_BK][WMMA_BN + WMMA_PAD];
    __shared__ __align__(32) float c_tile[WMMA_BM][WMMA_BN + 4];
    const int tid = threadIdx.x, warp = tid / 32;
    const int wrow = (warp / 2) * 32, wcol = (warp % 2) * 32;  // this warp's quarter of the tile
    const int row0 = blockIdx.y * WMMA_BM, col0 = blockIdx.x * WMMA_BN;
    const T zero = T(0.0f);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += WMMA_BK) {
        if (vec8) {  // 16-byte loads: 8 elements of a row at a time
            for (int f = tid; f < WMMA_BM * WMMA_BK / 8; f += blockDim.x) {
                int r = f / (WMMA_BK / 8), k = (f % (WMMA_BK / 8)) * 8;
                int4 v = make_int4(0, 0, 0, 0);
                if (row0 + r < M && k0 + k < K) v = *reinterpret_cast<const int4*>(a_ptr + (long long)(row0 + r) * K + k0 + k);
                *reinterpret_cast<int4*>(&a_tile[r][k]) = v;
            }
            for (int f = tid; f < WMMA_BK * WMMA_BN / 8; f += blockDim.x) {
                int k = f / (WMMA_BN / 8), c = (f % (WMMA_BN / 8)) * 8;
                int4 v = make_int4(0, 0, 0, 0);
                if (k0 + k < K && col0 + c < N) v = *reinterpret_cast<const int4*>(b_ptr + (long long)(k0 + k) * N + col0 + c);
                *reinterpret_cast<int4*>(&b_tile[k][c]) = v;
            }
        } else {
            for (int f = tid; f < WMMA_BM * WMMA_BK; f += blockDim.x) {
                int r = f / WMMA_BK, k = f % WMMA_BK;
                a_tile[r][k] = (row0 + r < M && k0 + k < K) ? a_ptr[(long long)(row0 + r) * K + k0 + k] : zero;
            }
            for (int f = tid; f < WMMA_BK * WMMA_BN; f += blockDim.x) {
                int k = f / WMMA_BN, c = f % WMMA_BN;
                b_tile[k][c] = (k0 + k < K && col0 + c < N) ? b_ptr[(long long)(k0 + k) * N + col0 + c] : zero;
            }
        }
        __syncthreads();
        for (int k = 0; k < WMMA_BK; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_frag[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b_frag[2];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a_frag[i], &a_tile[wrow + 16 * i][k], WMMA_BK + WMMA_PAD);
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b_frag[j], &b_tile[k][wcol + 16 * j], WMMA_BN + WMMA_PAD);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
        }
        __syncthreads();  // all warps are done with the tiles before the next step overwrites them
    }
    // Through shared memory to global, so the edges of C can be masked element by element.
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&c_tile[wrow + 16 * i][wcol + 16 * j], acc[i][j], WMMA_BN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int f = tid; f < WMMA_BM * WMMA_BN; f += blockDim.x) {
        int r = f / WMMA_BN, c = f % WMMA_BN;
        if (row0 + r < M && col0 + c < N) c_ptr[(long long)(row0 + r) * N + col0 + c] = c_tile[r][c];
    }
}

// 4 warps (128 threads) per block.
__global__ void __launch_bounds__(128) matmul_wmma_kernel(const __half* __restrict__ a_ptr, const __half* __restrict__ b_ptr,
                                                            float* __restrict__ c_ptr, int M, int N, int K, int vec8) {
    matmul_wmma<__half>(a_ptr, b_ptr, c_ptr, M, N, K, vec8);
}

__global__ void __launch_bounds__(128) matmul_wmma_bf16_kernel(const __nv_bfloat16* __restrict__ a_ptr,
                                                                 const __nv_bfloat16* __restrict__ b_ptr,
                                                                 float* __restrict__ c_ptr, int M, int N, int K, int vec8) {
    matmul_wmma<__nv_bfloat16>(a_ptr, b_ptr, c_ptr, M, N, K, vec8);
}
