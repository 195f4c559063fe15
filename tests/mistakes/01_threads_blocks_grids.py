"""Exercise 01, threads, blocks and grids: typical mistakes as mutations (see __init__.py)."""
from mistakes import no_bounds_check, no_mask

CU = "def add_cuda("
NB = "def add_kernel_numba("
TR = "def add_kernel_triton("
CU2 = "def add_2d_cuda("
NB2 = "def add_2d_kernel_numba("
TR2 = "def add_2d_kernel_triton("

MISTAKES = [
    no_bounds_check("cuda", CU, "    if (idx < n) {\n        out_ptr[idx] = x_ptr[idx] + y_ptr[idx];\n    }",
                    "    out_ptr[idx] = x_ptr[idx] + y_ptr[idx];"),
    Mistake("cuda_grid_rounded_down", CU, "grid = (n + block - 1) // block", "grid = n // block",
            cause=r"never written|grid|round"),
    Mistake("cuda_thread_index_only", CU, "int idx = blockIdx.x * blockDim.x + threadIdx.x;",
            "int idx = threadIdx.x;", cause=r"blockIdx|never written|block"),
    no_bounds_check("numba", NB, "    if idx < n:\n        out[idx] = x[idx] + y[idx]",
                    "    out[idx] = x[idx] + y[idx]"),
    Mistake("numba_grid_rounded_down", NB, "blocks = (n + threads - 1) // threads", "blocks = n // threads",
            cause=r"never written|grid|round"),
    no_mask(TR, "tl.store(out_ptr + offsets, x + y, mask=mask)"),
    Mistake("triton_no_program_id", TR, "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
            "offsets = tl.arange(0, BLOCK_SIZE)", cause=r"program_id|never written|pid"),
    Mistake("cuda_2d_axes_swapped", CU2,
            "grid = ((cols + block[0] - 1) // block[0], (rows + block[1] - 1) // block[1])",
            "grid = ((rows + block[1] - 1) // block[1], (cols + block[0] - 1) // block[0])",
            cause=r"swap|never written|grid"),
    Mistake("numba_2d_row_col_swapped", NB2,
            "col, row = cuda.grid(2)\n    if row", "row, col = cuda.grid(2)\n    if row",
            cause=r"swap|x .*column|never written"),
    Mistake("triton_2d_row_stride_wrong", TR2, "offsets = r[:, None] * cols + c[None, :]",
            "offsets = r[:, None] * rows + c[None, :]", cause=r"stride|cols|row"),
    Mistake("triton_2d_whole_rows_ok", TR2, "tl.store(out_ptr + offsets, a + b, mask=mask)",
            "tl.store(out_ptr + offsets, b + a, mask=mask)", verdict="accepted"),
    Mistake("cuda_block_of_128_ok", CU, "block = 256", "block = 128", verdict="accepted"),
]
