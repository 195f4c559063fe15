// Reductions in CUDA C++: the sum of a vector, and the max of each row of a matrix.
//
// Loaded by kernels/cuda/reduction.py through utils.cuda_kernel: on a GPU these kernels
// are compiled by NVRTC and run for real; without one they run in the course's CPU
// emulator. The launchers (grid and block sizes, input checks) live in reduction.py.
//
// The versions of lesson 04, from wrong to fast (VERSIONS in reduction.py):
//   v0  every thread does out[0] += x[i]: a data race, wrong on purpose (demo only; non-deterministic)
//       sum_racy_kernel (and sum_racy_lockstep_kernel, the warp's lockstep written out)
//   v1  atomicAdd per element (non-deterministic)                                 sum_atomic_kernel
//   v2  shared-memory tree, interleaved addressing, atomic per block (non-deterministic)
//       sum_interleaved_kernel
//   v3  shared-memory tree, sequential addressing, atomic per block (non-deterministic)
//       sum_sequential_kernel
//   v4  warp-shuffle block reduction, atomic per block (non-deterministic)        sum_warp_kernel
//   v5  grid-stride float4 + warp shuffles, two passes (deterministic)
//       sum_partials_kernel, then sum_final_kernel (no atomics)
// and row_max_kernel: the max of each row, one block per row.
#include "common.h"

#define FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------------------
// The race. `out[0] += x[i]` is three steps: load out[0], add, store out[0]. Two threads
// that load before either stores both add to the same old value, and one addition is lost.
// On a GPU the 32 threads of a warp execute the load together, then the store together:
// a warp adds ONE of its 32 values, not 32.
__global__ void sum_racy_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out_ptr[0] += x_ptr[i];
    }
}

// The same race, with the warp's lockstep written out: every lane loads out[0], the warp
// waits for all of them (__syncwarp), then every lane stores its own old + x[i]. This is
// what the hardware does with the line above, so it loses additions on any machine,
// including the CPU emulator, which otherwise runs one thread at a time.
__global__ void sum_racy_lockstep_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (i < n) ? x_ptr[i] : 0.0f;
    float seen = out_ptr[0];   // all 32 lanes load the same old value ...
    __syncwarp();
    if (i < n) {
        out_ptr[0] = seen + v; // ... and each stores old + its own x[i]: the last one wins
    }
}

// ---------------------------------------------------------------------------------------
// v1: atomicAdd makes load-add-store one indivisible operation, so nothing is lost. But
// every thread of the grid updates the same address, and the memory system must do those
// updates one after another: millions of serialized atomics.
__global__ void sum_atomic_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(out_ptr, x_ptr[i]);
    }
}

// ---------------------------------------------------------------------------------------
// v2: a tree in shared memory, interleaved addressing. Each block sums its blockDim.x
// elements in log2(blockDim.x) steps, then adds its result with ONE atomicAdd.
// blockDim.x must be a power of two and the launch passes blockDim.x floats of dynamic
// shared memory.
//
// Step s (s = 1, 2, 4, ...): thread t with t % (2s) == 0 adds sdata[t + s] into sdata[t].
// Every step halves the active threads, but they are spread out: at s = 1 the even
// threads of every warp work and the odd ones idle, so every warp is divergent, and the
// `%` is slow.
__global__ void sum_interleaved_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    extern __shared__ float sdata[];
    unsigned int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    // Threads past the end load 0, the identity of +, so the tree needs no bounds checks.
    sdata[t] = (i < n) ? x_ptr[i] : 0.0f;
    // Barrier 1: every thread's element is in shared memory before anyone reads a neighbour's.
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (t % (2 * s) == 0) {
            sdata[t] += sdata[t + s];
        }
        // Barrier 2: step s is finished (sdata[t + 2s] holds its partial sum) before step
        // 2s reads it. Without it a fast thread reads a partial sum that is not written yet.
        __syncthreads();
    }
    if (t == 0) {
        atomicAdd(out_ptr, sdata[0]);
    }
}

// v3: the same tree, sequential addressing. Step s (s = blockDim/2, ..., 2, 1): thread
// t < s adds sdata[t + s] into sdata[t]. The active threads are the first s: whole warps
// are either all busy or all idle (no divergence until s < 32), and consecutive threads
// touch consecutive words, which sit in different shared-memory banks. (Packing v2's
// working threads with `index = 2 * s * t` instead would avoid the divergence but put the
// lanes of a warp 2s words apart: several lanes in one bank, a bank conflict.)
__global__ void sum_sequential_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    extern __shared__ float sdata[];
    unsigned int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[t] = (i < n) ? x_ptr[i] : 0.0f;
    __syncthreads();  // every element is in shared memory
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            sdata[t] += sdata[t + s];
        }
        __syncthreads();  // this step's sums are written before the next step reads them
    }
    if (t == 0) {
        atomicAdd(out_ptr, sdata[0]);
    }
}

// ---------------------------------------------------------------------------------------
// Warp shuffles: the 32 lanes of a warp read each other's registers directly, with no
// shared memory and no __syncthreads. __shfl_down_sync(mask, v, d) returns the v of lane
// (lane + d); after offsets 16, 8, 4, 2, 1 lane 0 holds the sum of all 32 lanes.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) {
        v += __shfl_down_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) {
        v = fmaxf(v, __shfl_down_sync(FULL_MASK, v, offset));
    }
    return v;
}

// A block reduction from warp reductions: each warp reduces its 32 values, lane 0 of each
// warp writes one partial to shared memory, and the first warp reduces those (at most 32).
// Two barriers instead of log2(blockDim) of them. blockDim.x must be a multiple of 32.
// The result is valid in thread 0. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int nwarps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();  // all warp partials are written before warp 0 reads them
    if (warp == 0) {
        v = (lane < nwarps) ? scratch[lane] : 0.0f;
        v = warp_sum(v);
    }
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int nwarps = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();  // all warp partials are written before warp 0 reads them
    if (warp == 0) {
        v = (lane < nwarps) ? scratch[lane] : -INFINITY;
        v = warp_max(v);
    }
    return v;
}

// v4: one element per thread, a warp-shuffle block reduction, one atomic per block.
__global__ void sum_warp_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    __shared__ float scratch[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (i < n) ? x_ptr[i] : 0.0f;
    v = block_sum(v, scratch);
    if (threadIdx.x == 0) {
        atomicAdd(out_ptr, v);
    }
}

// ---------------------------------------------------------------------------------------
// v5, pass 1: a capped grid (a few blocks per SM) where each thread first sums many
// elements in registers with a grid-stride loop, then the block reduces with shuffles and
// writes ONE partial per block: no atomics. Pass 2 (sum_final_kernel) sums the partials
// in one block. The order of every addition is fixed by the launch configuration, so the
// result is the same bit for bit on every run (deterministic).
//
// The loop reads 16-byte float4s, four of them per iteration, so each thread keeps four
// independent loads in flight: that is what keeps enough bytes moving to saturate memory.
// x_ptr must be 16-byte aligned (the launcher checks). The n % 4 tail is read as floats.
__global__ void sum_partials_kernel(const float* __restrict__ x_ptr, float* partials_ptr, long long n) {
    __shared__ float scratch[32];
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x_ptr);
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    long long i = tid;
    // Four float4 loads per iteration, all issued before any is used.
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 p = x4[i];
        float4 q = x4[i + stride];
        float4 r = x4[i + 2 * stride];
        float4 s = x4[i + 3 * stride];
        a0 += (p.x + p.y) + (p.z + p.w);
        a1 += (q.x + q.y) + (q.z + q.w);
        a2 += (r.x + r.y) + (r.z + r.w);
        a3 += (s.x + s.y) + (s.z + s.w);
    }
    for (; i < n4; i += stride) {  // the float4s left over
        float4 p = x4[i];
        a0 += (p.x + p.y) + (p.z + p.w);
    }
    for (long long k = 4 * n4 + tid; k < n; k += stride) {  // the scalar tail: n % 4 floats
        a1 += x_ptr[k];
    }
    float v = block_sum((a0 + a1) + (a2 + a3), scratch);
    if (threadIdx.x == 0) {
        partials_ptr[blockIdx.x] = v;
    }
}

// v5, pass 2: one block sums the m partials of pass 1 and writes the result.
__global__ void sum_final_kernel(const float* __restrict__ partials_ptr, float* out_ptr, int m) {
    __shared__ float scratch[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        v += partials_ptr[i];
    }
    v = block_sum(v, scratch);
    if (threadIdx.x == 0) {
        out_ptr[0] = v;
    }
}

// ---------------------------------------------------------------------------------------
// The max of each row of a (rows, cols) row-major matrix: one block per row. The threads
// stride over the columns (consecutive threads read consecutive columns: coalesced), keep
// a running max in a register, then reduce it across the block with shuffles.
__global__ void row_max_kernel(const float* __restrict__ x_ptr, float* out_ptr, int cols) {
    __shared__ float scratch[32];
    const float* row = x_ptr + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        m = fmaxf(m, row[c]);
    }
    m = block_max(m, scratch);
    if (threadIdx.x == 0) {
        out_ptr[blockIdx.x] = m;
    }
}
