// hopper.h: Hopper's (sm_90) own machinery for the course's kernels, written once.
//
//   #include "hopper.h"
//
// On a GPU each function below is one PTX instruction or a few (inline asm; a source that
// includes this header is compiled for sm_90a, the architecture-specific target wgmma and
// setmaxnreg need). In the CPU emulator the same functions are emulated with the same
// semantics (runtime/backends/cuda/emu/hopper_emu.h), and the mistakes Hopper code makes
// are reported with their cause: a transaction byte count that never completes a phase, a
// phase bit not flipped, a swizzle the TMA copy and the wgmma descriptor disagree on, a tile
// not aligned for TMA, a producer that overwrites a stage a wgmma still reads, a wgmma not
// issued by a whole warpgroup, a wgmma never waited for, ordinary stores that a TMA store or a
// wgmma reads before the storing thread fenced them (fence_proxy_async).
//
// TMA (the Tensor Memory Accelerator) copies a whole tile (a "box") between global and
// shared memory, issued by one thread, described by a tensor map the host builds
// (utils.tensor_map). A load's completion is counted in bytes on an mbarrier:
//   TmaDescriptor                              the 128-byte tensor map of a 2-D tensor
//   tma_acquire(map)                           once per thread, before its first copy with `map`
//   tma_load_2d(dst, map, col, row, bar)       copy the box whose corner is (row, col) into dst;
//                                              out-of-bounds elements arrive as zeros
//   tma_store_2d(map, col, row, src)           copy a box from shared memory to global memory
//   tma_store_commit(), tma_store_wait()       ... and wait until the stores have read src
//
// mbarriers (64-bit barriers in shared memory) count arrivals and transaction bytes; a
// phase completes when both reach their targets, and the phase bit flips (0, 1, 0, ...):
//   mbarrier_init(bar, count), fence_barrier_init()   count arrivals complete a phase
//   mbarrier_arrive(bar)                               one arrival
//   mbarrier_arrive_expect_tx(bar, bytes)              one arrival, and `bytes` more to come by TMA
//   mbarrier_wait(bar, phase)                          wait until the phase of parity `phase` completed
//
// fence_proxy_async(): orders this thread's ordinary shared-memory stores before the
// "async proxy" (TMA stores, wgmma) reads them.
//
// wgmma: a warpgroup (4 warps, 128 threads, the first a multiple of 128) multiplies a
// 64 x 16 tile of A by a 16 x N tile of B, both in shared memory, into float registers:
//   smem_descriptor(tile, swizzle)             the 64-bit description of a K-major tile
//   wgmma_fence()                              before the first wgmma, after the registers changed
//   wgmma<N>(d, desc_a, desc_b, scale_d)       d (+)= A @ B^T: d is float[N / 2] per thread; scale_d 0
//                                              starts from zero. Asynchronous: d is undefined until ...
//   wgmma_commit(), wgmma_wait<G>()            ... the group is committed and at most G groups remain
//   setmaxnreg_inc<R>(), setmaxnreg_dec<R>()   a warpgroup takes or gives back registers (R per thread)
//
// Both wgmma operands are K-major here: A is M x K and B is N x K, rows of K contiguous, as
// nn.Linear keeps its weight (y = x @ W^T). Accumulator element d[i] of thread t holds
//   row 16 * (t / 32 % 4) + (t % 32) / 4 + 8 * (i / 2 % 2),  column 8 * (i / 4) + 2 * (t % 4) + i % 2.
#pragma once
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Swizzle modes of a tile in shared memory, as the tensor map (CUtensorMapSwizzle) numbers
// them. With SWIZZLE_128B each row of the tile is 128 bytes, and the 16-byte chunk c of row r
// lands at chunk c ^ (r % 8): the 8 rows a wgmma reads at once hit 8 different bank groups.
enum TmaSwizzle { SWIZZLE_NONE = 0, SWIZZLE_32B = 1, SWIZZLE_64B = 2, SWIZZLE_128B = 3 };

// The tensor map: 128 bytes, 64-byte aligned, in global memory (utils.tensor_map(t, ...)
// returns it as a tensor; pass that tensor where the kernel takes `const TmaDescriptor*`).
struct alignas(64) TmaDescriptor { unsigned long long opaque[16]; };

#ifdef COURSE_CUDA_EMULATOR
#include <hopper_emu.h>
#else

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// ------------------------------------ mbarriers ------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialisation visible to the async proxy (TMA) and the other threads (after a
// __syncthreads()).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, unsigned phase) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(phase) : "memory");
    return done != 0;
}
// A wait that has not completed after COURSE_MBARRIER_TIMEOUT_NS nanoseconds (2 s unless the
// source defines it first) stops the kernel with a trap instead of hanging the GPU: a phase
// that never completes (bytes or arrivals missing, a wait for the wrong phase) then reaches
// the host as "unspecified launch failure", and the CUDA context is lost: restart the process.
// Run the kernel in simulation for the report that names the barrier and what it misses.
// The trap is one instruction, not a call: a function call (printf's included) anywhere in a
// kernel makes ptxas serialise every wgmma of it (warning C7510) and ignore setmaxnreg.
#ifndef COURSE_MBARRIER_TIMEOUT_NS
#define COURSE_MBARRIER_TIMEOUT_NS 2000000000ull
#endif
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned phase) {
    if (mbarrier_try_wait(bar, phase)) return;
    uint64_t start = globaltimer_ns();
    while (!mbarrier_try_wait(bar, phase))
        if (globaltimer_ns() - start > COURSE_MBARRIER_TIMEOUT_NS) asm volatile("trap;");
}

// ------------------------------------ fences ---------------------------------------------
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ------------------------------------ TMA ------------------------------------------------
// The tensor map lives in global memory (written by the host before the launch) and the TMA
// unit reads it through its own proxy: the acquire fence orders the host's write before this
// thread's copies. Once per thread and map, before the first copy, is enough, and not more:
// a gpu-wide fence before each copy halved the GEMM ladder's speed on an H200 (the one thread
// that issues the loads became the bottleneck).
__device__ __forceinline__ void tma_acquire(const TmaDescriptor* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaDescriptor* map, int col, int row, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(col), "r"(row), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const TmaDescriptor* map, int col, int row, const void* src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(map), "r"(col), "r"(row), "r"(smem_addr(src)) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tma_store_wait() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// ------------------------------------ wgmma ----------------------------------------------
// The shared-memory matrix descriptor of a K-major tile: its address (bits 0-13, in 16-byte
// units), the leading byte offset (16-29; unused by the swizzled layouts, 1 by convention),
// the stride byte offset (32-45: from one group of 8 rows to the next) and the layout
// (62-63: 1 = 128-byte swizzle, 2 = 64-byte, 3 = 32-byte, 0 = none).
__device__ __forceinline__ uint64_t make_smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes,
                                                         int layout) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((leading_bytes & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((stride_bytes & 0x3FFFF) >> 4) << 32) | ((uint64_t)layout << 62);
}
#endif  // COURSE_CUDA_EMULATOR

// The layout code of a descriptor for a tile the TMA wrote with `swizzle`.
__host__ __device__ constexpr int descriptor_layout(int swizzle) {
    return swizzle == SWIZZLE_128B ? 1 : swizzle == SWIZZLE_64B ? 2 : swizzle == SWIZZLE_32B ? 3 : 0;
}
// Bytes per row of a swizzled tile (the TMA box's inner dimension): 32, 64 or 128.
__host__ __device__ constexpr int swizzle_bytes(int swizzle) {
    return swizzle == SWIZZLE_128B ? 128 : swizzle == SWIZZLE_64B ? 64 : swizzle == SWIZZLE_32B ? 32 : 16;
}

// The descriptor of a K-major tile whose rows are swizzle_bytes(swizzle) long, as a TMA box
// of that width writes it: 8-row groups 8 rows apart. Advance along K by adding bytes / 16
// to the descriptor (a k-step of 16 bf16 is + 2).
__device__ __forceinline__ uint64_t smem_descriptor(const void* tile, int swizzle) {
    return make_smem_descriptor(smem_addr(tile), 16, 8 * swizzle_bytes(swizzle), descriptor_layout(swizzle));
}

#ifndef COURSE_CUDA_EMULATOR
// A block that is not whole warpgroups would hang in its first wgmma: wgmma_fence, which comes
// before the wgmma of a tile, stops it instead (a trap, as above). The check is not in wgmma()
// itself: any instruction that may trap between two wgmma makes ptxas fence each of them.
__device__ __forceinline__ void wgmma_fence() {
    if ((blockDim.x * blockDim.y * blockDim.z) % 128) asm volatile("trap;");
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int G> __device__ __forceinline__ void wgmma_wait() {
    static_assert(G >= 0 && G <= 7, "wgmma_wait<G>: G is 0..7");
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(G) : "memory");
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(R));
}

// One wrapper per N and type: PTX names the shape in the instruction, and inline asm names
// every accumulator register (tools/gen_wgmma.py writes hopper_wgmma.h).
template <int N, class T> struct Wgmma;
#include "hopper_wgmma.h"
template <int N, class T = __nv_bfloat16>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    Wgmma<N, T>::run(d, desc_a, desc_b, scale_d);
}
#endif  // !COURSE_CUDA_EMULATOR
