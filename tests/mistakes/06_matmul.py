"""Exercise 06, matmul: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import OTHER_UNDEFINED, race

CU = "matmul_tiled_kernel(const float*"
NB = "def matmul_numba_kernel"
TR = "def matmul_triton_kernel"

MISTAKES = [
    race("cuda_no_barrier_end_of_tile_loop", CU,
         "acc += a_tile[ty][k] * b_tile[k][tx];\n        __syncthreads();\n", "acc += a_tile[ty][k] * b_tile[k][tx];\n",
         cause=r"end of the (k0 |tile )?loop|second __syncthreads|before the next tile",
         gpu="a GPU may or may not overwrite a tile before every warp has read it"),
    race("cuda_no_first_barrier", CU, "b_ptr[(k0 + ty) * N + col] : 0.0f;\n        __syncthreads();\n",
         "b_ptr[(k0 + ty) * N + col] : 0.0f;\n", cause=r"race|__syncthreads",
         gpu="a GPU may or may not read a tile before it is written"),
    Mistake("cuda_no_edge_zero", CU,
            "(row < M && k0 + tx < K) ? a_ptr[row * K + k0 + tx] : 0.0f",
            "a_ptr[row * K + k0 + tx]",
            cause=r"edge|mask|outside|past"),
    Mistake("cuda_grid_swapped", CU,
            "matmul_k[(cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE)]",
            "matmul_k[(cdiv(M, TILE), cdiv(N, TILE)), (TILE, TILE)]",
            cause=r"swap"),
    Mistake("numba_grid_swapped", NB,
            "matmul_numba_kernel[(cdiv(N, NB_TILE), cdiv(M, NB_TILE)), (NB_TILE, NB_TILE)]",
            "matmul_numba_kernel[(cdiv(M, NB_TILE), cdiv(N, NB_TILE)), (NB_TILE, NB_TILE)]",
            cause=r"swap"),
    Mistake("numba_k_loop_once", NB,
            "for k0 in range(0, K, NB_TILE):", "for k0 in range(0, min(K, NB_TILE), NB_TILE):",
            cause=r"K|tile"),
    Mistake("triton_grid_swapped", TR,
            "matmul_triton_kernel[(cdiv(M, 32), cdiv(N, 32))]",
            "matmul_triton_kernel[(cdiv(N, 32), cdiv(M, 32))]",
            cause=r"swap"),
    Mistake("triton_no_other", TR, "(rk[None, :] + k0 < K), other=0.0)", "(rk[None, :] + k0 < K))",
            cause=r"other=", sim_only=OTHER_UNDEFINED),
    Mistake("triton_pointers_not_advanced", TR,
            "        a_ptrs += BLOCK_K * stride_ak\n        b_ptrs += BLOCK_K * stride_bk\n", "",
            cause=r"advance|pointer", not_words=("__syncthreads",)),
    Mistake("triton_strides_assumed_contiguous", TR,
            "b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn",
            "b_ptrs = b_ptr + rk[:, None] * N + rn[None, :]",
            cause=r"stride", not_words=("edges",),
            more=(("def matmul_triton(", "M, K = a.shape\n", "M, K = a.shape\n    b = b.t().contiguous().t()\n"),)),
    Mistake("triton_k_grid_of_one_tile", TR,
            "BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)", "BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)",
            verdict="accepted"),  # unusual but right: a narrower K tile
    Mistake("numba_register_tile_ok", NB,
            "        for k in range(NB_TILE):\n            acc += a_tile[ty, k] * b_tile[k, tx]\n",
            "        k = 0\n        while k < NB_TILE:\n"
            "            acc += a_tile[ty, k] * b_tile[k, tx]\n            k += 1\n",
            verdict="accepted"),  # unusual but right: a while loop
]
