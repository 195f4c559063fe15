"""Exercise 04, reduction: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import OTHER_UNDEFINED, race

CU = "block_sum_src = r'''"
NB = "def warp_sum_kernel("
TR = "def partial_sums_kernel("
RM = "row_max_src = r'''"

MISTAKES = [
    race("cuda_no_barrier_in_tree", CU,
         "        }\n        __syncthreads();               // this step is done before the next one reads it\n",
         "        }\n", cause=r"race|__syncthreads", gpu="on a GPU the warps of a block may happen to run in step"),
    Mistake("cuda_no_zero_past_end", CU, "sdata[t] = (i < n) ? x_ptr[i] : 0.0f;", "sdata[t] = x_ptr[i];",
            cause=r"past the end|i < n|0"),
    race("cuda_plain_add_not_atomic", CU, "atomicAdd(out_ptr, sdata[0]);", "*out_ptr += sdata[0];",
         cause=r"race|atomic", gpu="on a GPU the blocks' read-modify-writes may happen not to overlap"),
    Mistake("cuda_every_thread_adds", CU, "    if (t == 0) {\n        atomicAdd(out_ptr, sdata[0]);\n    }",
            "    atomicAdd(out_ptr, sdata[0]);", cause=r"times|once|thread 0|too (large|big)|wrong"),
    Mistake("numba_no_grid_stride", NB, "for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):",
            "for i in range(cuda.grid(1), min(x.size, cuda.gridsize(1)), cuda.gridsize(1)):",
            cause=r"grid|stride|missing|part|only"),
    Mistake("numba_every_lane_adds", NB, "if cuda.threadIdx.x % 32 == 0:", "if True:",
            cause=r"times|lane 0|once|too|wrong"),
    Mistake("triton_no_other", TR, "mask=mask, other=0.0)", "mask=mask)", cause=r"other=", sim_only=OTHER_UNDEFINED),
    Mistake("triton_one_pass_only", "def two_pass_sum(",
            "    while values.numel() > 1:\n", "    for _ in range(1):\n",
            cause=r"one pass of a reduction leaves"),
    race("row_max_no_barrier", RM,
         "    __syncthreads();                               // every warp's max is in scratch\n", "",
         cause=r"race|__syncthreads", gpu="on a GPU warp 0 may happen to read scratch after the others wrote it"),
    Mistake("row_max_zero_start", RM, "    float m = -INFINITY;\n", "    float m = 0.0f;\n",
            cause=r"-inf|negative|0"),
    Mistake("triton_block_256_ok", "def two_pass_sum(", "SUM_BLOCK = 1024", "SUM_BLOCK = 256",
            verdict="accepted"),  # unusual but right: smaller blocks, one more pass
]
