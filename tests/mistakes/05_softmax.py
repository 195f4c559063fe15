"""Exercise 05, softmax: typical mistakes as mutations of the solution (see __init__.py)."""
CU = "softmax_kernel(const float*"
NB = "def softmax_numba_kernel"
TR = "def softmax_triton_kernel"
ON = "def softmax_online_kernel"

MISTAKES = [
    Mistake("cuda_writes_past_row", CU,
            "for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] =",
            "for (int c = threadIdx.x; c <= cols; c += blockDim.x) y[c] =",
            cause=r"past the end of (a|each|the) row|c <= cols|one past", not_words=("atomicAdd",)),
    Mistake("cuda_no_max_subtracted", CU, "s += expf(x[c] - m);", "s += expf(x[c]);",
            cause=r"max"),
    Mistake("cuda_sum_not_reduced", CU, "s = block_sum(s, scratch);", "",
            cause=r"sum|block"),
    Mistake("cuda_max_from_column_zero", CU, "float m = -INFINITY;\n", "float m = x[0];\n",
            verdict="accepted"),  # unusual but right: x[0] is a row element, a fine start
    Mistake("numba_partial_warp", NB,
            "softmax_numba_kernel[rows, whole_warps(cols, 64)]",
            "softmax_numba_kernel[rows, min(cols, 64)]",
            cause=r"partial warp|whole warps|multiple of 32|lane \d+ .*does not exist",
            sim_only="undefined behaviour: on a GPU the lanes a partial warp lacks hold undefined "
                     "values, and the sums may happen to come out right"),
    Mistake("numba_torch_tensors", NB,
            "(utils.to_numba(x), utils.to_numba(y))", "(x, y)",
            cause=r"to_numba",
            sim_only="runs on a GPU only: numba-cuda reads torch's CUDA tensors through "
                     "__cuda_array_interface__; the simulator needs utils.to_numba, so code that must "
                     "run everywhere uses it"),
    Mistake("numba_no_max_subtracted", NB, "s += math.exp(x[row, c] - m)", "s += math.exp(x[row, c])",
            cause=r"max"),
    Mistake("triton_no_other", TR,
            "mask=mask, other=float(\"-inf\"))", "mask=mask)",
            cause=r"other="),
    Mistake("triton_grid_per_element", TR,
            "softmax_triton_kernel[(rows,)]", "softmax_triton_kernel[(cdiv(x.numel(), triton.next_power_of_2(cols)),)]",
            cause=r"grid = \(rows,\)|one program per row"),
    Mistake("triton_row_stride_forgotten", TR,
            "x = tl.load(x_ptr + row * cols + offsets,", "x = tl.load(x_ptr + offsets,",
            cause=r"row"),
    Mistake("triton_exp2_rescaled", TR,
            "num = tl.exp(x - tl.max(x, axis=0))",
            "num = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)",
            verdict="accepted"),  # unusual but right: exp through exp2
    Mistake("online_no_inf_guard", ON,
            "shift = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "shift = m_new",
            cause=r"-inf|inf - inf|guard",
            more=((ON, "row_sum = tl.sum(tl.where(m == float(\"-inf\"), 0.0, s * tl.exp(m - row_max)), axis=0)",
                   "row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)"),)),
    Mistake("online_sum_not_rescaled", ON,
            "s = s * tl.exp(m - shift) + tl.exp(v - shift)", "s = s + tl.exp(v - shift)",
            cause=r"rescal|exp\(m|running max|sum"),
]
