// hopper.cu: C = A @ B^T on Hopper's tensor cores with TMA and wgmma (lesson 12): bfloat16
// A (M x K) and B (N x K), both K-major as nn.Linear keeps x and its weight, float
// accumulation, bfloat16 C (M x N). The launchers are in hopper.py; the machinery is hopper.h.
//
// Versions (naive to best):
//   v1  TMA + wgmma: one warpgroup, 128 x 128 tiles, one stage      hopper_gemm_v1_kernel
//   v2  a 4-stage mbarrier pipeline: TMA loads run ahead of wgmma   hopper_gemm_v2_kernel
//   v3  a producer warpgroup and two consumers, setmaxnreg          hopper_gemm_v3_kernel
//   v4  v3, one wgmma group in flight while the next is issued      hopper_gemm_v4_kernel
//
// Every tile is 64 columns of K deep: 64 bfloat16 are 128 bytes, one row of the 128-byte
// swizzle, so one TMA box per operand and stage, and four wgmma k-steps of 16 per tile.
#include "hopper.h"

constexpr int BK = 64;                  // K per tile (128 bytes of bfloat16)
constexpr int KSTEP = 16;               // K per wgmma

// The dynamic shared memory, rounded up to 1024 bytes: the 128-byte swizzle's pattern repeats
// every 8 rows of 128 bytes, and the wgmma descriptor assumes a tile starts with it.
__device__ __forceinline__ __nv_bfloat16* tiles_base(unsigned char* raw) {
    uintptr_t a = (uintptr_t)raw;
    uint32_t w = smem_addr(raw);
    return (__nv_bfloat16*)(a + ((1024 - (w & 1023)) & 1023));
}

// The accumulators of one 64 x BN wgmma tile, rows row0.., written to C as bfloat16 (two
// neighbouring columns at once when N is even). d[i] of thread t is row 16 * warp + lane / 4
// (+ 8 for i / 2 odd), column 8 * (i / 4) + 2 * (lane % 4) (+ 1 for i odd).
template <int BN>
__device__ __forceinline__ void store_tile(const float (&d)[BN / 2], __nv_bfloat16* c_ptr, int M, int N, int row0,
                                           int col0, int t) {
    int warp = t / 32 % 4, lane = t % 32;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {
        int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            int row = row0 + 16 * warp + lane / 4 + 8 * half;
            if (row >= M) continue;
            float x = d[i + 2 * half], y = d[i + 2 * half + 1];
            __nv_bfloat16* p = c_ptr + (size_t)row * N + col;
            if (col + 1 < N && N % 2 == 0) {
                *(__nv_bfloat162*)p = __floats2bfloat162_rn(x, y);
            } else {
                if (col < N) p[0] = __float2bfloat16(x);
                if (col + 1 < N) p[1] = __float2bfloat16(y);
            }
        }
    }
}

// One BK-deep tile of a 64 x BN product: four wgmma k-steps, each 32 bytes further along the
// swizzled rows (+2 in the descriptor's 16-byte units).
template <int BN>
__device__ __forceinline__ void mma_tile(float (&d)[BN / 2], const __nv_bfloat16* a_tile, const __nv_bfloat16* b_tile,
                                         bool accumulate) {
    uint64_t da = smem_descriptor(a_tile, SWIZZLE_128B), db = smem_descriptor(b_tile, SWIZZLE_128B);
#pragma unroll
    for (int ks = 0; ks < BK / KSTEP; ++ks)
        wgmma<BN>(d, da + 2 * ks, db + 2 * ks, (accumulate || ks > 0) ? 1 : 0);
}

// ---------------------------------------------------------------------------------------
// v1: one warpgroup computes a 128 x 128 tile of C, as two 64-row halves. For each tile of
// K, thread 0 starts two TMA loads (A's 128 x 64 box, B's 128 x 64 box) that complete on
// one mbarrier; everyone waits for them, issues 8 wgmma, waits for those, and only then may
// the next loads overwrite the tiles. Loads and products take turns: nothing overlaps.
constexpr int V1_BM = 128, V1_BN = 128;
__global__ void __launch_bounds__(128) hopper_gemm_v1_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                             __nv_bfloat16* c_ptr, int M, int N, int K) {
    extern __shared__ unsigned char smem[];
    __nv_bfloat16* sa = tiles_base(smem);
    __nv_bfloat16* sb = sa + V1_BM * BK;
    __shared__ uint64_t full;
    int t = threadIdx.x;
    int row0 = blockIdx.y * V1_BM, col0 = blockIdx.x * V1_BN;
    if (t == 0) {
        mbarrier_init(&full, 1);
        fence_barrier_init();
    }
    __syncthreads();
    float d[2][V1_BN / 2];
    unsigned phase = 0;
    int tiles = (K + BK - 1) / BK;
    for (int kt = 0; kt < tiles; ++kt) {
        if (t == 0) {
            mbarrier_arrive_expect_tx(&full, (V1_BM + V1_BN) * BK * sizeof(__nv_bfloat16));
            tma_load_2d(sa, a_map, kt * BK, row0, &full);
            tma_load_2d(sb, b_map, kt * BK, col0, &full);
        }
        mbarrier_wait(&full, phase);
        phase ^= 1;
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) mma_tile<V1_BN>(d[h], sa + h * 64 * BK, sb, kt > 0);
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();  // nobody reads the tiles any more: the next loads may overwrite them
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) store_tile<V1_BN>(d[h], c_ptr, M, N, row0 + 64 * h, col0, t);
}

// ---------------------------------------------------------------------------------------
// v2: the same warpgroup and tile, with STAGES buffers. The loads of the next STAGES - 1
// tiles are in flight while the wgmma of this one run: stage s has its own mbarrier, whose
// phase flips each time the stage comes round again. After issuing tile kt's products the
// warpgroup waits only for tile kt - 1's (wgmma_wait<1>), and thread 0 refills that stage.
constexpr int V2_BM = 128, V2_BN = 128, V2_STAGES = 4;
__global__ void __launch_bounds__(128) hopper_gemm_v2_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                             __nv_bfloat16* c_ptr, int M, int N, int K) {
    extern __shared__ unsigned char smem[];
    __nv_bfloat16* sa = tiles_base(smem);                  // STAGES tiles of A, then STAGES of B
    __nv_bfloat16* sb = sa + V2_STAGES * V2_BM * BK;
    __shared__ uint64_t full[V2_STAGES];
    int t = threadIdx.x;
    int row0 = blockIdx.y * V2_BM, col0 = blockIdx.x * V2_BN;
    int tiles = (K + BK - 1) / BK;
    const unsigned bytes = (V2_BM + V2_BN) * BK * sizeof(__nv_bfloat16);
    if (t == 0) {
        for (int s = 0; s < V2_STAGES; ++s) mbarrier_init(&full[s], 1);
        fence_barrier_init();
        for (int s = 0; s < V2_STAGES && s < tiles; ++s) {
            mbarrier_arrive_expect_tx(&full[s], bytes);
            tma_load_2d(sa + s * V2_BM * BK, a_map, s * BK, row0, &full[s]);
            tma_load_2d(sb + s * V2_BN * BK, b_map, s * BK, col0, &full[s]);
        }
    }
    __syncthreads();
    float d[2][V2_BN / 2];
    for (int kt = 0; kt < tiles; ++kt) {
        int s = kt % V2_STAGES;
        mbarrier_wait(&full[s], (kt / V2_STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) mma_tile<V2_BN>(d[h], sa + s * V2_BM * BK + h * 64 * BK, sb + s * V2_BN * BK, kt > 0);
        wgmma_commit();
        wgmma_wait<1>();  // tile kt - 1's products are done: its stage is free
        __syncthreads();
        int next = kt - 1 + V2_STAGES, r = (kt + V2_STAGES - 1) % V2_STAGES;
        if (t == 0 && kt >= 1 && next < tiles) {
            mbarrier_arrive_expect_tx(&full[r], bytes);
            tma_load_2d(sa + r * V2_BM * BK, a_map, next * BK, row0, &full[r]);
            tma_load_2d(sb + r * V2_BN * BK, b_map, next * BK, col0, &full[r]);
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; ++h) store_tile<V2_BN>(d[h], c_ptr, M, N, row0 + 64 * h, col0, t);
}

// ---------------------------------------------------------------------------------------
// v3: warp specialisation. Warpgroup 0 only loads: one of its threads waits for a stage to
// be released (its `empty` mbarrier), and fills it by TMA. Warpgroups 1 and 2 only multiply,
// each a 64 x 256 half of the 128 x 256 tile: they wait for a stage to be full, issue its
// wgmma, and release it (each warp, once its own wgmma_wait returned). The producer needs few
// registers and gives them to the consumers (setmaxnreg), whose accumulators are 128 floats a
// thread.
// v4: the same, but a consumer keeps IN_FLIGHT = 1 group of wgmma running: after committing
// tile kt it waits only for tile kt - 1 and releases that stage, so the tensor cores always
// have the next group queued.
constexpr int V3_BM = 128, V3_BN = 256, V3_STAGES = 4;
template <int IN_FLIGHT>
__device__ __forceinline__ void warp_specialized_gemm(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                      __nv_bfloat16* c_ptr, int M, int N, int K) {
    extern __shared__ unsigned char smem[];
    __nv_bfloat16* sa = tiles_base(smem);
    __nv_bfloat16* sb = sa + V3_STAGES * V3_BM * BK;
    __shared__ uint64_t full[V3_STAGES], empty[V3_STAGES];
    int t = threadIdx.x, wg = t / 128;
    int row0 = blockIdx.y * V3_BM, col0 = blockIdx.x * V3_BN;
    int tiles = (K + BK - 1) / BK;
    if (t == 0) {
        for (int s = 0; s < V3_STAGES; ++s) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            const unsigned bytes = (V3_BM + V3_BN) * BK * sizeof(__nv_bfloat16);
            for (int kt = 0; kt < tiles; ++kt) {
                int s = kt % V3_STAGES;
                if (kt >= V3_STAGES) mbarrier_wait(&empty[s], (kt / V3_STAGES - 1) & 1);
                mbarrier_arrive_expect_tx(&full[s], bytes);
                tma_load_2d(sa + s * V3_BM * BK, a_map, kt * BK, row0, &full[s]);
                tma_load_2d(sb + s * V3_BN * BK, b_map, kt * BK, col0, &full[s]);
            }
        }
    } else {
        setmaxnreg_inc<232>();
        int c = wg - 1;  // which 64-row half
        float d[V3_BN / 2];
        for (int kt = 0; kt < tiles; ++kt) {
            int s = kt % V3_STAGES;
            mbarrier_wait(&full[s], (kt / V3_STAGES) & 1);
            wgmma_fence();
            mma_tile<V3_BN>(d, sa + s * V3_BM * BK + c * 64 * BK, sb + s * V3_BN * BK, kt > 0);
            wgmma_commit();
            wgmma_wait<IN_FLIGHT>();  // tile kt - IN_FLIGHT's products are done: release its stage
            if (kt >= IN_FLIGHT && t % 32 == 0) mbarrier_arrive(&empty[(kt - IN_FLIGHT) % V3_STAGES]);
        }
        wgmma_wait<0>();
        store_tile<V3_BN>(d, c_ptr, M, N, row0 + 64 * c, col0, t);
    }
}

__global__ void __launch_bounds__(384, 1) hopper_gemm_v3_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                                __nv_bfloat16* c_ptr, int M, int N, int K) {
    warp_specialized_gemm<0>(a_map, b_map, c_ptr, M, N, K);
}

__global__ void __launch_bounds__(384, 1) hopper_gemm_v4_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                                __nv_bfloat16* c_ptr, int M, int N, int K) {
    warp_specialized_gemm<1>(a_map, b_map, c_ptr, M, N, K);
}
