// Memory-access and control-flow patterns, each small enough to read in one look.
//
// These kernels compute nothing useful: each one exists to show ONE thing the hardware
// counts, so the counters of Nsight Compute on a GPU and of the course's profiler in
// simulation can be read side by side (benchmarks/simulators/ncu_patterns.py lists how each is
// launched). What to expect is written above each kernel, for a warp of 32 threads and
// 4-byte floats: a warp-wide load of 32 consecutive floats is one request of 128 bytes,
// which touches 4 sectors of 32 bytes.
#include "common.h"

#define TILE 32        // the transposes' tile: 32 x 32 floats
#define TILE_ROWS 8    // a transpose block is 32 x 8 threads; each thread moves 4 rows
#define REDUCE_BLOCK 256

// Coalesced: thread i reads x[i], writes y[i]. Each warp request touches exactly the 4
// sectors it needs: 4 sectors per request, nothing wasted. The baseline of every pattern.
__global__ void copy_coalesced_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[i];
}

// Strided: thread i reads x[i * stride]. Neighbouring lanes are 4 * stride bytes apart.
// Stride 2: 256 bytes per warp, 8 sectors where 4 would do (half of each sector is wasted).
// Stride 32 (128 bytes apart): every lane in its own sector, 32 sectors where 4 would do:
// 8x the memory traffic for the same useful bytes. The stores stay coalesced.
__global__ void copy_strided_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n, int stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[(long long)i * stride];
}

// Misaligned by one element: thread i reads x[i + 1]. The warp's 128 bytes start 4 bytes
// into a sector, so they straddle 5 sectors instead of 4 (25% more sectors). Unlike a
// stride, the extra sector is shared with the next warp, so caches hide most of the cost.
__global__ void copy_misaligned_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[i + 1];
}

// Array of structs: n particles {x, y, z} stored one after another (12 bytes each), and
// each thread sums the three fields of its particle. Each of the three loads is one request
// whose lanes are 12 bytes apart: 384 bytes, 12 sectors, for 128 useful bytes (3x).
__global__ void aos_kernel(const float* __restrict__ p_ptr, float* __restrict__ out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out_ptr[i] = p_ptr[3 * i + 0] + p_ptr[3 * i + 1] + p_ptr[3 * i + 2];
}

// Struct of arrays: the same particles as three arrays x, y, z. Each load is coalesced:
// 4 sectors per request, 12 per warp for the three fields instead of 36.
__global__ void soa_kernel(const float* __restrict__ x_ptr, const float* __restrict__ y_ptr,
                           const float* __restrict__ z_ptr, float* __restrict__ out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out_ptr[i] = x_ptr[i] + y_ptr[i] + z_ptr[i];
}

// float4: each thread moves 16 bytes with one instruction. A warp request covers 512 bytes,
// 16 sectors: the same sectors per byte as the coalesced copy, with a quarter of the requests
// (fewer instructions to issue). n4 = number of float4s; the pointers must be 16-byte aligned.
__global__ void copy_float4_kernel(const float4* __restrict__ x_ptr, float4* __restrict__ y_ptr, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) y_ptr[i] = x_ptr[i];
}

// Naive transpose of a rows x cols matrix (both multiples of 32): reads along a row
// (coalesced, 4 sectors per request), writes down a column: the 32 lanes of a warp store
// 4 * rows bytes apart, 32 sectors per request where 4 would do.
__global__ void transpose_naive_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int rows, int cols) {
    int c = blockIdx.x * TILE + threadIdx.x;
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        int r = blockIdx.y * TILE + threadIdx.y + k;
        y_ptr[(long long)c * rows + r] = x_ptr[(long long)r * cols + c];
    }
}

// Shared-memory transpose: a 32 x 32 tile is read with coalesced loads, stored in shared
// memory, and written out transposed with coalesced stores. The shared store tile[ty][tx]
// is conflict-free (32 consecutive words, one per bank), but the shared load tile[tx][ty]
// reads a column: 32 words 32 words apart, all in ONE bank. 32 wavefronts instead of 1,
// 31 bank conflicts per request.
__global__ void transpose_shared_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int rows, int cols) {
    __shared__ float tile[TILE][TILE];
    int c = blockIdx.x * TILE + threadIdx.x;
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        int r = blockIdx.y * TILE + threadIdx.y + k;
        tile[threadIdx.y + k][threadIdx.x] = x_ptr[(long long)r * cols + c];
    }
    __syncthreads();  // the whole tile is in shared memory before any thread reads a column
    int out_c = blockIdx.y * TILE + threadIdx.x;
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        int out_r = blockIdx.x * TILE + threadIdx.y + k;
        y_ptr[(long long)out_r * rows + out_c] = tile[threadIdx.x][threadIdx.y + k];
    }
}

// The same with one column of padding: a row of the tile is 33 words long, so the words of
// one column fall in 32 different banks. No bank conflicts, for 128 extra bytes of shared memory.
__global__ void transpose_padded_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int c = blockIdx.x * TILE + threadIdx.x;
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        int r = blockIdx.y * TILE + threadIdx.y + k;
        tile[threadIdx.y + k][threadIdx.x] = x_ptr[(long long)r * cols + c];
    }
    __syncthreads();
    int out_c = blockIdx.y * TILE + threadIdx.x;
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        int out_r = blockIdx.x * TILE + threadIdx.y + k;
        y_ptr[(long long)out_r * rows + out_c] = tile[threadIdx.x][threadIdx.y + k];
    }
}

// The second of the classic reduction steps, between the interleaved tree (t % (2s), every
// warp divergent) and the sequential one (reduction.cu has both): the working threads are
// packed, index = 2 * s * t, so whole warps work or idle, but the lanes of a warp touch
// words 2s apart. At s = 1 two lanes share a bank (2 wavefronts), at s = 2 four, ... up to
// 16-way conflicts: the divergence is traded for bank conflicts. One partial sum per block.
__global__ void reduce_strided_index_kernel(const float* __restrict__ x_ptr, float* __restrict__ partials_ptr, int n) {
    __shared__ float sdata[REDUCE_BLOCK];
    unsigned int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    sdata[t] = (i < n) ? x_ptr[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        unsigned int index = 2 * s * t;
        if (index < blockDim.x) sdata[index] += sdata[index + s];
        __syncthreads();
    }
    if (t == 0) partials_ptr[blockIdx.x] = sdata[0];
}

// A loop the compiler keeps as a branch (a loop cannot be turned into predicated code), so
// the two sides of an `if` really run one after the other when a warp diverges.
__device__ __forceinline__ float spin_a(float v) {
#pragma unroll 1
    for (int k = 0; k < 16; k++) v = v * 0.999f + 1.0f;
    return v;
}
__device__ __forceinline__ float spin_b(float v) {
#pragma unroll 1
    for (int k = 0; k < 16; k++) v = v * 1.001f - 1.0f;
    return v;
}

// Divergent on odd/even threads: every warp has 16 lanes on each side, so each side runs
// with half the lanes active: about 16 active lanes per instruction inside the branches.
__global__ void branch_odd_even_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x_ptr[i];
    if (threadIdx.x % 2 == 0) v = spin_a(v);
    else v = spin_b(v);
    y_ptr[i] = v;
}

// Divergent on the lower and upper half of each warp (lane < 16): the same 16 + 16 split as
// odd/even, so the same cost. Which lanes take a side does not matter, only how many.
__global__ void branch_half_warp_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x_ptr[i];
    if (threadIdx.x % 32 < 16) v = spin_a(v);
    else v = spin_b(v);
    y_ptr[i] = v;
}

// Warp-aligned: the condition is the same for all 32 lanes of a warp (even warps one way,
// odd warps the other), so no warp diverges: 32 active lanes per instruction throughout.
__global__ void branch_warp_aligned_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x_ptr[i];
    if ((threadIdx.x / 32) % 2 == 0) v = spin_a(v);
    else v = spin_b(v);
    y_ptr[i] = v;
}

// Every thread of every block adds into the same address. Correct (atomics never lose an
// update) but serialised: the memory system applies the n additions one after another.
// Its result is unused, so the compiler emits a reduction (RED), not an atomic that returns.
__global__ void atomic_one_address_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out_ptr, x_ptr[i]);
}

// Atomics to different addresses: thread i adds into out[i], so no two lanes collide. The
// result is unused, so this is a reduction (RED) too; a warp's 32 additions touch 4 sectors.
__global__ void atomic_distinct_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out_ptr[i], x_ptr[i]);
}

// An atomic whose result is used (each thread takes a ticket from one counter): the hardware
// must return the old value to every lane, so this is an ATOM, not a RED.
__global__ void atomic_ticket_kernel(int* counter_ptr, int* ticket_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ticket_ptr[i] = atomicAdd(counter_ptr, 1);
}
