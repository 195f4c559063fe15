// reduce.h: the warp and block reductions shared by the course's row kernels (softmax,
// layernorm, attention), one copy of each, as llm.c keeps warpReduceSum and blockReduce
// once in dev/cuda/common.h.
//
//   #include "reduce.h"
//
// A header of its own rather than part of common.h: every source includes common.h, and a
// learner's kernel (or lesson 04's reduction.cu, which writes these reductions out as its
// teaching text) may define its own warp_sum or block_sum next to it.
//
// Every thread gets the result (butterfly shuffles: with __shfl_xor_sync each lane ends with
// the warp's value, with __shfl_down_sync only lane 0 would). For the block reductions
// blockDim.x is a multiple of 32 (at most 1024) and `scratch` is 32 floats of shared memory.
//
// The barriers are those of lesson 09: the one at the start keeps a second call from
// overwriting scratch while a slow warp still reads the first call's result (the "missing
// barrier between two reductions" bug); it also publishes any shared memory the caller
// wrote before the call. The one in the middle publishes the warps' partials.
#pragma once
#include "common.h"

#ifndef FULL_MASK
#define FULL_MASK 0xffffffffu
#endif

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // the previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();  // every warp's partial is written before any warp reads them
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);  // each warp sums the partials itself: no broadcast step
}

// Two block sums at once, with one pair of barriers for both (`scratch`: 64 floats): a row
// that needs two sums (LayerNorm's backward) waits at two barriers instead of four.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();  // the previous call's readers are done with scratch
    if (lane == 0) {
        scratch[warp] = a;
        scratch[32 + warp] = b;
    }
    __syncthreads();  // every warp's partials are written before any warp reads them
    a = lane < warps ? scratch[lane] : 0.0f;
    b = lane < warps ? scratch[32 + lane] : 0.0f;
    return make_float2(warp_sum(a), warp_sum(b));
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();  // the previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();  // every warp's partial is written before any warp reads them
    v = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}
