"""CUDA C++ pieces that several tests (and benchmarks/simulators/emulator_speed.py) build their
kernels on, where the piece is not what the test is about. Plain strings: importing this imports nothing."""

#: A block's tree sum in shared memory: ``block_tree_sum(x, s, n)`` loads one element per
#: thread (0 past ``n``) into ``s`` (``blockDim.x`` floats, a power of two) and returns the
#: block's sum in thread 0. Every thread of the block must call it (it has barriers).
TREE_SUM = r"""
__device__ float block_tree_sum(const float* __restrict__ x, float* s, int n) {
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();  // every partial sum of this round is written before the next reads it
    }
    return s[0];
}
"""

#: One block reverses x through dynamic shared memory ``buf`` (``blockDim.x`` floats: the
#: launch's third parameter, in bytes).
REVERSE_DYNAMIC = r"""
__global__ void reverse_kernel(const float* x_ptr, float* y_ptr) {
    extern __shared__ float buf[];
    int t = threadIdx.x;
    buf[t] = x_ptr[t];
    __syncthreads();
    y_ptr[t] = buf[blockDim.x - 1 - t];
}
"""
