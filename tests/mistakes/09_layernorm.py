"""Exercise 09, LayerNorm: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import TRITON_TRAFFIC, race

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
    race("cuda_no_barrier_between_reductions", CU,
         "    __syncthreads();                      // the previous call's readers are done\n", "",
         cause=r"race|__syncthreads|barrier",
         gpu="on a GPU the second reduction may happen not to overwrite scratch before it is read"),
    Mistake("cuda_c1_not_divided", CU, "float c1 = block_sum(s1, scratch) / cols;",
            "float c1 = block_sum(s1, scratch);", cause=r"dy\*w\*xhat is not divided by N",
            not_words=("two row sums",)),
    Mistake("cuda_dx_without_rstd", CU, "dx[c] = (dy[c] * w[c] - xhat * c1 - c2) * rstd;",
            "dx[c] = dy[c] * w[c] - xhat * c1 - c2;", cause=r"dx is not multiplied by rstd",
            not_words=("two row sums",)),
    # the Numba two-stage dW/db
    Mistake("numba_partials_assigned", NB, "            pdw[k, c] += dy[row, c] * (x[row, c] - mean[row]) * rstd[row]",
            "            pdw[k, c] = dy[row, c] * (x[row, c] - mean[row]) * rstd[row]",
            cause=r"dw|d[wW]"),
    Mistake("numba_column_sum_unguarded", NB, "    if c < p.shape[1]:\n", "    if True:\n",
            cause=r"out of (bounds|range)|past the end|index",
            sim_only="undefined behaviour: on a GPU nothing checks a write past the end of an array the "
                     "launcher allocated itself (dw, db); the simulator checks every index"),
]

# The rows of the table: mistakes whose hint named another cause.
_LOAD_X = "    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)\n"
MISTAKES += [
    Mistake("triton_w_forgotten", TR, "d * rstd * w + b", "d * rstd + b", cause=r"w is never applied",
            not_words=("eps",)),
    Mistake("triton_b_forgotten", TR, "d * rstd * w + b", "d * rstd * w", cause=r"b is never added",
            not_words=("eps",)),
    Mistake("triton_eps_forgotten", TR, "tl.sum(d * d, axis=0) / cols + eps)", "tl.sum(d * d, axis=0) / cols)",
            cause=r"produced NaN.*eps is missing"),
    Mistake("triton_row_stride_block", TR, "x = tl.load(x_ptr + row * cols + offs,",
            "x = tl.load(x_ptr + row * BLOCK + offs,", cause=r"r \* cols, not r \* BLOCK",
            not_words=("offs, not offs + 1",)),
    Mistake("triton_x_read_three_times", TR, "    d = tl.where(mask, x - mean, 0.0)\n",
            _LOAD_X + "    d = tl.where(mask, x - mean, 0.0)\n",
            more=((TR, "    w = tl.load(w_ptr + offs, mask=mask)\n", _LOAD_X + "    d = tl.where(mask, x - mean, 0.0)\n"
                   "    w = tl.load(w_ptr + offs, mask=mask)\n"),),
            cause=r"reads the same data more than once", not_words=("neighbouring threads",),
            sim_only=TRITON_TRAFFIC),
    Mistake("triton_torch_does_the_work", TR, "    return y, mean, rstd",
            "    y = torch.nn.functional.layer_norm(x, (cols,), w, b, eps)\n"
            "    return y, x.mean(dim=1), torch.rsqrt(x.var(dim=1, unbiased=False) + eps)",
            cause=r"torch\.nn\.functional\.layer_norm \(aten\.native_layer_norm\)"),
    # the Numba two-stage dW/db
    Mistake("numba_column_sum_one_block", NB,
            "column_sum_kernel[(cols + threads - 1) // threads, threads](utils.to_numba(pdw), utils.to_numba(dw))",
            "column_sum_kernel[1, threads](utils.to_numba(pdw), utils.to_numba(dw))",
            cause=r"only the first \d+ columns of dw", not_words=("two row sums",)),
    Mistake("numba_db_from_dw_partials", NB,
            "column_sum_kernel[(cols + threads - 1) // threads, threads](utils.to_numba(pdb), utils.to_numba(db))",
            "column_sum_kernel[(cols + threads - 1) // threads, threads](utils.to_numba(pdw), utils.to_numba(db))",
            cause=r"db equals dw", not_words=("two row sums",)),
    Mistake("numba_db_never_summed", NB,
            "    column_sum_kernel[(cols + threads - 1) // threads, threads]"
            "(utils.to_numba(pdb), utils.to_numba(db))\n",
            "", cause=r"db is all zeros", not_words=("two row sums",)),
    Mistake("numba_sum_along_the_wrong_axis", NB, "for k in range(p.shape[0]):", "for k in range(p.shape[1]):",
            cause=r"p\.shape\[0\]|the partials of column", not_words=("two row sums",)),
    Mistake("numba_rstd_missing", NB, "pdw[k, c] += dy[row, c] * (x[row, c] - mean[row]) * rstd[row]",
            "pdw[k, c] += dy[row, c] * (x[row, c] - mean[row])", cause=r"dw lacks rstd",
            not_words=("two row sums",)),
]
for _m in MISTAKES:   # the = instead of += now gets its own hint
    if _m.name == "numba_partials_assigned":
        _m.cause = r"assigned \(=\) instead of accumulated \(\+=\)"
