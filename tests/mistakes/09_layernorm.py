"""Exercise 09, LayerNorm: typical mistakes as mutations of the solution (see __init__.py)."""
TR = "def layernorm_fwd_kernel("
CU = "bwd_src = r'''"
NB = "def partials_kernel("

MISTAKES = [
    # the Triton forward
    Mistake("triton_unbiased_variance", TR,
            "tl.sum(d * d, axis=0) / cols + eps", "tl.sum(d * d, axis=0) / (cols - 1) + eps",
            cause=r"unbiased|biased|N - 1|cols - 1"),
    Mistake("triton_eps_outside_sqrt", TR, "1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)",
            "1.0 / (tl.sqrt(tl.sum(d * d, axis=0) / cols) + eps)", cause=r"eps"),
    Mistake("triton_e_x2_minus_mean2", TR, "1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)",
            "1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols - mean * mean + eps)",
            cause=r"E\[x.?2?\]|E\[x²\]|cancel"),
    Mistake("triton_padding_in_variance", TR, "d = tl.where(mask, x - mean, 0.0)", "d = x - mean",
            cause=r"mask|padding|past the end|power of two|tl\.where"),
    Mistake("triton_mean_not_saved", TR, "    tl.store(mean_ptr + row, mean)\n", "",
            cause=r"mean"),
    Mistake("triton_rsqrt_ok", TR, "rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)",
            "rstd = tl.rsqrt(tl.sum(d * d, axis=0) / cols + eps)", verdict="accepted"),
    # the CUDA backward (dx)
    Mistake("cuda_no_barrier_between_reductions", CU,
            "    __syncthreads();                      // the previous call's readers are done\n", "",
            cause=r"race|__syncthreads|barrier",
            sim_only="a race: on a GPU the second reduction may happen not to overwrite scratch before it is read"),
    Mistake("cuda_c1_not_divided", CU, "float c1 = block_sum(s1, scratch) / cols;",
            "float c1 = block_sum(s1, scratch);", cause=r"dx"),
    Mistake("cuda_dx_without_rstd", CU, "dx[c] = (dy[c] * w[c] - xhat * c1 - c2) * rstd;",
            "dx[c] = dy[c] * w[c] - xhat * c1 - c2;", cause=r"dx"),
    # the Numba two-stage dW/db
    Mistake("numba_partials_assigned", NB, "            pdw[k, c] += dy[row, c] * (x[row, c] - mean[row]) * rstd[row]",
            "            pdw[k, c] = dy[row, c] * (x[row, c] - mean[row]) * rstd[row]",
            cause=r"dw|d[wW]"),
    Mistake("numba_column_sum_unguarded", NB, "    if c < p.shape[1]:\n", "    if True:\n",
            cause=r"out of (bounds|range)|past the end|index",
            sim_only="undefined behaviour: on a GPU nothing checks a write past the end of an array the "
                     "launcher allocated itself (dw, db); the simulator checks every index"),
]
