// Vector and matrix addition in CUDA C++: the kernels of lesson 01 (threads, blocks, grids).
//
// Loaded by kernels/cuda/add.py through utils.cuda_kernel: on a GPU they are compiled by
// NVRTC and run for real; without one they run in the course's CPU emulator. The launchers
// (grid and block sizes, input checks) live in add.py.
//
// The versions of lesson 01 (VERSIONS in add.py, naive to best):
//   v1  one thread per element, 256 threads per block   add_kernel
//   v2  grid-stride loop over a capped grid             add_grid_stride_kernel
// and add_2d_kernel: 2-D matrices, a 2-D grid of 32 x 8 blocks, row strides passed in.
// ---------------------------------------------------------------------------------------
#include "common.h"

// v1: one thread per element.
//
// A launch creates gridDim.x blocks of blockDim.x threads, numbered from 0 in every launch.
// blockIdx.x * blockDim.x + threadIdx.x is therefore a unique global index 0, 1, 2, ...
// whichever SM runs a block and whenever it runs: the numbering is part of the launch, not
// of the hardware schedule.
//
// `n` is the number of elements: a pointer carries no length, so the kernel must be told
// where the data ends. The launcher rounds the grid up to whole blocks, so the last block
// (the tail block) may have threads past the end; `idx < n` keeps them from touching
// memory outside the tensors. Each thread's test uses only its own idx, so it holds in any
// order the blocks run.
__global__ void add_kernel(const float* __restrict__ x_ptr,
                           const float* __restrict__ y_ptr,
                           float* __restrict__ out_ptr,
                           int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        out_ptr[idx] = x_ptr[idx] + y_ptr[idx];
    }
}

// v2: a grid-stride loop. The grid is capped at a few blocks per SM and each thread walks
// the data in steps of the whole grid (gridDim.x * blockDim.x). In every step consecutive
// threads still touch consecutive elements (coalesced), and the same kernel is right for
// any grid size: the loop condition plays the part of `idx < n`.
__global__ void add_grid_stride_kernel(const float* __restrict__ x_ptr,
                                       const float* __restrict__ y_ptr,
                                       float* __restrict__ out_ptr,
                                       long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out_ptr[i] = x_ptr[i] + y_ptr[i];
    }
}

// Matrix addition with a 2-D grid of 2-D blocks.
//
// x is the fastest-moving thread coordinate, so it walks the columns: the 32 threads of a
// warp (consecutive threadIdx.x) read 32 consecutive floats of one row, one coalesced
// access. y walks the rows. Both coordinates need their own guard: the right-most blocks
// stick out past the last column and the bottom blocks past the last row.
//
// A row starts `stride` floats after the previous one. For a contiguous matrix that is
// `cols`, for a view such as m[:, 2:5] it is the width of the parent matrix: passing the
// row stride lets the kernel read such views without a copy (columns must be adjacent).
__global__ void add_2d_kernel(const float* __restrict__ x_ptr,
                              const float* __restrict__ y_ptr,
                              float* __restrict__ out_ptr,
                              int rows, int cols,
                              int x_row_stride, int y_row_stride, int out_row_stride) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < rows && col < cols) {
        // 64-bit offsets: row * stride may pass 2^31 for a large matrix even when both fit
        long long r = row;
        out_ptr[r * out_row_stride + col] = x_ptr[r * x_row_stride + col] + y_ptr[r * y_row_stride + col];
    }
}
