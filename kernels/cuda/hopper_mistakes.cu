// One tile of C = A @ B^T (64 x 64, K = 128: two k-tiles) by TMA and wgmma, with the typical
// mistakes of Hopper code switched on by `mistake` (lesson 12, tests/test_hopper.py): one compile, many
// launches. mistake 0 is the right kernel.
#include "hopper.h"

__global__ void one_tile_kernel(const TmaDescriptor* a_map, const TmaDescriptor* b_map, float* c_ptr, int mistake) {
    extern __shared__ unsigned char smem[];
    uintptr_t raw = (uintptr_t)smem;
    __nv_bfloat16* sa = (__nv_bfloat16*)(raw + ((1024 - (smem_addr(smem) & 1023)) & 1023));
    if (mistake == 4) sa = (__nv_bfloat16*)((char*)sa + 64);          // a tile not 128-byte aligned
    __nv_bfloat16* sb = sa + 2 * 64 * 64;                              // two stages of A, then of B
    __shared__ uint64_t full[2];
    int t = threadIdx.x;
    if (t == 0) {
        mbarrier_init(&full[0], 1);
        mbarrier_init(&full[1], 1);
        fence_barrier_init();
        tma_acquire(a_map);
        tma_acquire(b_map);
    }
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    unsigned bytes = 2 * 64 * 64 * sizeof(__nv_bfloat16);
    if (mistake == 1) bytes /= 2;                                      // the wrong transaction count
    for (int kt = 0; kt < 2; ++kt) {
        int s = kt;
        if (t == 0) {
            mbarrier_arrive_expect_tx(&full[s], bytes);
            tma_load_2d(sa + s * 64 * 64, a_map, kt * 64, 0, &full[s]);
            tma_load_2d(sb + s * 64 * 64, b_map, kt * 64, 0, &full[s]);
        }
        if (mistake == 10) continue;                                   // the loads never waited for
        mbarrier_wait(&full[mistake == 2 ? 0 : s], 0);                 // 2: the same barrier, phase not flipped
        __nv_bfloat16* a_tile = sa + s * 64 * 64;
        if (mistake >= 11 && kt == 0) {                               // 11, 12: A's tile copied by ordinary
            for (int i = t; i < 64 * 64; i += 128) sa[64 * 64 + i] = a_tile[i];  // stores into the free stage
            if (mistake == 12) fence_proxy_async();                    // 12: fenced for the async proxy (right)
            __syncthreads();                                           // 11: not fenced
            a_tile = sa + 64 * 64;
        }
        wgmma_fence();
        int swz = mistake == 3 ? SWIZZLE_64B : SWIZZLE_128B;           // 3: not the tensor map's swizzle
        uint64_t da = smem_descriptor(a_tile, swz), db = smem_descriptor(sb + s * 64 * 64, swz);
        if (mistake == 8) da = make_smem_descriptor(smem_addr(a_tile), 16, 512, 1);  // wrong stride
        if (mistake == 6 && t >= 64) continue;                         // half a warpgroup
        for (int ks = 0; ks < 4; ++ks) wgmma<64>(d, da + 2 * ks, db + 2 * ks, 1);
        wgmma_commit();
        if (mistake == 5 && kt == 0 && t == 0)                         // a load into the tile being read
            tma_load_2d(sa, a_map, 64, 0, &full[1]);
        if (mistake == 9) return;                                      // never waited for
        if (mistake != 7) wgmma_wait<0>();                             // 7: accumulators read too early
        if (mistake >= 11) __syncthreads();                            // the copy's stage is loaded next
    }
    if (mistake == 7) {
        for (int i = 0; i < 32; ++i) c_ptr[t * 32 + i] = d[i];
        wgmma_wait<0>();
        return;
    }
    int warp = t / 32, lane = t % 32;
    for (int i = 0; i < 32; ++i) {
        int row = 16 * warp + lane / 4 + 8 * (i / 2 % 2), col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        c_ptr[row * 64 + col] = d[i];
    }
}
