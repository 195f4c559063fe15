// hopper.cu: C = A @ B^T on Hopper's tensor cores with TMA and wgmma (lesson 12): bfloat16
// A (M x K) and B (N x K), both K-major as nn.Linear keeps x and its weight, float
// accumulation, bfloat16 C (M x N). The launchers are in hopper.py; the machinery is hopper.h.
//
// Versions (naive to best):
//   v1  TMA + wgmma: one warpgroup, 128 x 128 tiles, one stage      hopper_gemm_v1_kernel
//   v2  a 4-stage mbarrier pipeline: TMA loads run ahead of wgmma   hopper_gemm_v2_kernel
//   v3  a producer warpgroup and two consumers, setmaxnreg          hopper_gemm_v3_kernel
//   v4  v3, one wgmma group in flight while the next is issued      hopper_gemm_v4_kernel
//   v5  v4 persistent: one block per SM walks tiles in grouped order hopper_gemm_v5_kernel
//   v6  v5, C stored through shared memory by TMA, 3 stages         hopper_gemm_v6_kernel
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
        tma_acquire(a_map);  // once, before this thread's first copy with each map
        tma_acquire(b_map);
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
        tma_acquire(a_map);
        tma_acquire(b_map);
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
            tma_acquire(a_map);
            tma_acquire(b_map);
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

// ---------------------------------------------------------------------------------------
// v5: persistent. The grid is one block per SM (at most one per tile), and block b computes
// tiles b, b + gridDim.x, ...: launching and filling a block's pipeline happens once, and the
// producer loads the next tile's first stages while the consumers store this one's C. The
// stages and their phases run on from tile to tile (`it` counts a block's k-tiles). Tiles are
// numbered in groups of group_m tile-rows, column by column inside a group, so that the
// tiles running at the same time share their rows of A and of B in L2.
// v6: v5 with the epilogue through shared memory. Each consumer writes its 64 x 256 tile of C,
// as bfloat16, into four 64 x 64 boxes swizzled like TMA's 128-byte mode (the 8 rows a warp
// writes at once land in 8 different bank groups), fences them for the async proxy, and one
// thread stores the boxes by TMA (out-of-bounds parts are not written) without waiting: the
// consumers go on with the next tile while the TMA unit writes C. The staging boxes take 64 KB,
// so there are 3 stages. C's tensor map needs rows of a multiple of 16 bytes: for an N that is
// not a multiple of 8 the launcher passes tma_store = 0 and the tile is stored as in v5.
__device__ __forceinline__ void grouped_tile(int tile, int tiles_m, int tiles_n, int group_m, int& tm, int& tn) {
    int per_group = group_m * tiles_n;
    int first = tile / per_group * group_m;
    int rows = min(tiles_m - first, group_m);
    int r = tile % per_group;
    tm = first + r % rows;
    tn = r / rows;
}

// The accumulators of a 64 x BN tile into BN / 64 boxes of 64 x 64 bfloat16 in shared memory,
// with the 128-byte swizzle: 16-byte chunk k of row r at chunk k ^ (r % 8).
template <int BN>
__device__ __forceinline__ void stage_tile(const float (&d)[BN / 2], __nv_bfloat16* stage, int t) {
    int warp = t / 32 % 4, lane = t % 32;
    // Rows 16 * warp + lane / 4 and 8 below: row % 8 is lane / 4 for both. Offsets in words of
    // 4 bytes (two bfloat16), from one base: a 64-bit address per store would spill registers.
    __nv_bfloat162* words = (__nv_bfloat162*)stage + (16 * warp + lane / 4) * 32 + lane % 4;
    int x = lane / 4;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {
        int w = i / 32 * 2048 + ((i / 4 % 8) ^ x) * 4;  // box i / 32 (64 x 64 = 2048 words), chunk
#pragma unroll
        for (int half = 0; half < 2; ++half)
            words[w + half * 256] = __floats2bfloat162_rn(d[i + 2 * half], d[i + 2 * half + 1]);
    }
}

template <int STAGES, bool STAGED_STORE>
__device__ __forceinline__ void persistent_gemm(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                const TmaDescriptor* c_map, __nv_bfloat16* c_ptr, int M, int N,
                                                int K, int group_m, int tma_store) {
    constexpr int BM = V3_BM, BN = V3_BN;
    extern __shared__ unsigned char smem[];
    __nv_bfloat16* sa = tiles_base(smem);
    __nv_bfloat16* sb = sa + STAGES * BM * BK;
    __nv_bfloat16* sc = sb + STAGES * BN * BK;  // v6: each consumer's 64 x BN staging tile
    __shared__ uint64_t full[STAGES], empty[STAGES], c_full[2], c_free[2];
    int t = threadIdx.x, wg = t / 128;
    int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;
    int ktiles = (K + BK - 1) / BK;
    if (t == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
        }
        for (int c = 0; c < 2; ++c) {
            mbarrier_init(&c_full[c], 128);  // every thread of consumer c wrote its part of the staging tile
            mbarrier_init(&c_free[c], 1);    // the TMA stores of its last tile have read the staging tile
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            tma_acquire(a_map);
            tma_acquire(b_map);
            const unsigned bytes = (BM + BN) * BK * sizeof(__nv_bfloat16);
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int tm, tn;
                grouped_tile(tile, tiles_m, tiles_n, group_m, tm, tn);
                for (int kt = 0; kt < ktiles; ++kt, ++it) {
                    int s = it % STAGES;
                    if (it >= STAGES) mbarrier_wait(&empty[s], (it / STAGES - 1) & 1);
                    mbarrier_arrive_expect_tx(&full[s], bytes);
                    tma_load_2d(sa + s * BM * BK, a_map, kt * BK, tm * BM, &full[s]);
                    tma_load_2d(sb + s * BN * BK, b_map, kt * BK, tn * BN, &full[s]);
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        int c = wg - 1, tc = t % 128;
        if (STAGED_STORE && tma_store && tc == 0) tma_acquire(c_map);
        float d[BN / 2];
        int it = 0, j = 0;  // k-tiles consumed, tiles done
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++j) {
            int tm, tn;
            grouped_tile(tile, tiles_m, tiles_n, group_m, tm, tn);
            for (int kt = 0; kt < ktiles; ++kt, ++it) {
                int s = it % STAGES;
                mbarrier_wait(&full[s], (it / STAGES) & 1);
                wgmma_fence();
                mma_tile<BN>(d, sa + s * BM * BK + c * 64 * BK, sb + s * BN * BK, kt > 0);
                wgmma_commit();
                wgmma_wait<1>();  // the previous k-tile's products are done: release its stage
                if (kt > 0 && t % 32 == 0) mbarrier_arrive(&empty[(it - 1) % STAGES]);
            }
            wgmma_wait<0>();
            if (t % 32 == 0) mbarrier_arrive(&empty[(it - 1) % STAGES]);  // the tile's last stage
            int row0 = tm * BM + 64 * c, col0 = tn * BN;
            if (STAGED_STORE && tma_store) {
                __nv_bfloat16* stage = sc + c * 64 * BN;
                if (tc == 0) {
                    tma_store_wait();  // the stores of the previous tile have read the staging tile
                    mbarrier_arrive(&c_free[c]);
                }
                mbarrier_wait(&c_free[c], j & 1);
                stage_tile<BN>(d, stage, t);
                fence_proxy_async();  // these shared-memory stores, before the TMA unit reads them
                mbarrier_arrive(&c_full[c]);
                if (tc == 0) {
                    mbarrier_wait(&c_full[c], j & 1);
#pragma unroll
                    for (int q = 0; q < BN / 64; ++q) tma_store_2d(c_map, col0 + 64 * q, row0, stage + q * 64 * 64);
                    tma_store_commit();
                }
            } else {
                store_tile<BN>(d, c_ptr, M, N, row0, col0, t);
            }
        }
        if (STAGED_STORE && tma_store && tc == 0) tma_store_wait();  // before the block's shared memory goes
    }
}

constexpr int V5_STAGES = 4, V6_STAGES = 3;
__global__ void __launch_bounds__(384, 1) hopper_gemm_v5_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                                const TmaDescriptor* c_map, __nv_bfloat16* c_ptr, int M,
                                                                int N, int K, int group_m, int tma_store) {
    persistent_gemm<V5_STAGES, false>(a_map, b_map, c_map, c_ptr, M, N, K, group_m, tma_store);
}

__global__ void __launch_bounds__(384, 1) hopper_gemm_v6_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map,
                                                                const TmaDescriptor* c_map, __nv_bfloat16* c_ptr, int M,
                                                                int N, int K, int group_m, int tma_store) {
    persistent_gemm<V6_STAGES, true>(a_map, b_map, c_map, c_ptr, M, N, K, group_m, tma_store);
}
