"""Exercise 10, attention: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import TRITON_TRAFFIC

TR = "def flash_fwd_kernel("
CA = "def flash_causal_kernel("
DE = "def delta_kernel("
CU = "row_src = r'''"

MISTAKES = [
    # the online-softmax update of the Triton FlashAttention forward
    Mistake("triton_no_scale", TR, "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q, tl.trans(k))",
            cause=r"1/√d|scale"),
    Mistake("triton_acc_not_rescaled", TR, "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
            "acc = acc + tl.dot(p.to(v.dtype), v)", cause=r"accumulator is not rescaled"),
    Mistake("triton_sum_not_rescaled", TR, "l = l * alpha + tl.sum(p, 1)", "l = l + tl.sum(p, 1)",
            cause=r"running sum is not rescaled"),
    Mistake("triton_max_saved_as_l", TR, "tl.store(lse_ptr + bh * Nq + offs_m, m + tl.log(l), mask=offs_m < Nq)",
            "tl.store(lse_ptr + bh * Nq + offs_m, m, mask=offs_m < Nq)", cause=r"row maximum|logsumexp"),
    Mistake("triton_keys_past_the_end_count", TR,
            "        s = tl.where(offs_n[None, :] < Nk, s, float(\"-inf\"))   # keys past the end count for nothing\n",
            "", cause=r"keys past the end of the last tile count"),
    Mistake("triton_exp2_folded_log2e", TR, "alpha = tl.exp(m - m_new)",
            "alpha = tl.exp2((m - m_new) * 1.4426950408889634)", verdict="accepted",
            more=((TR, "p = tl.exp(s - m_new[:, None])", "p = tl.exp2((s - m_new[:, None]) * 1.4426950408889634)"),)),
    # the causal mask
    Mistake("causal_diagonal_hidden", CA, "(offs_n[None, :] <= offs_m[:, None] + Nk - Nq)",
            "(offs_n[None, :] < offs_m[:, None] + Nk - Nq)", cause=r"off by one on the diagonal"),
    # D = rowsum(dO * O) for the backward
    Mistake("delta_without_o", DE, "delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)",
            "delta = tl.sum(do.to(tl.float32), axis=1)", cause=r"\bD\b"),
    # the CUDA C++ row-per-block forward
    Mistake("cuda_no_scale", CU, "q_s[t] = q_ptr[(bh * Nq + i) * d + t] * scale;",
            "q_s[t] = q_ptr[(bh * Nq + i) * d + t];", cause=r"1/√d|scale"),
    Mistake("cuda_causal_diagonal_hidden", CU, "min(Nk, i + Nk - Nq + 1)", "min(Nk, i + Nk - Nq)",
            cause=r"off by one on the diagonal"),
    Mistake("cuda_acc_not_rescaled", CU, "            acc *= alpha;\n", "", cause=r"accumulator is not rescaled"),
]

# The rows of the table and the wrong answers that passed before the grader's rows had their
# largest score in the first, a middle and the last tile.
MISTAKES += [
    Mistake("triton_running_max_of_tile_only", TR, "m_new = tl.maximum(m, tl.max(s, 1))", "m_new = tl.max(s, 1)",
            cause=r"current tile only", not_words=("never written (",)),
    Mistake("triton_p_from_old_max", TR, "p = tl.exp(s - m_new[:, None])", "p = tl.exp(s - m[:, None])",
            cause=r"produced NaN.*old max.*exp\(s - m_new\)", not_words=("never written (", "grid")),
    Mistake("triton_alpha_inverted", TR, "alpha = tl.exp(m - m_new)", "alpha = tl.exp(m_new - m)",
            cause=r"produced NaN.*alpha looks inverted.*exp\(m - m_new\)", not_words=("never written (", "grid")),
    Mistake("triton_running_max_not_carried", TR, "        m = m_new\n", "",
            cause=r"not carried from one tile to the next"),
    Mistake("causal_no_tile_skipping", CA, "hi = tl.minimum(Nk, tl.maximum((pid + 1) * BLOCK_M + Nk - Nq, 0))",
            "hi = Nk", cause=r"tiles of keys above the diagonal.*hi = \(pid \+ 1\) \* BLOCK_M \+ Nk - Nq",
            sim_only=TRITON_TRAFFIC),
    Mistake("causal_hi_one_tile_short", CA, "hi = tl.minimum(Nk, tl.maximum((pid + 1) * BLOCK_M + Nk - Nq, 0))",
            "hi = tl.minimum(Nk, tl.maximum(pid * BLOCK_M + Nk - Nq, 0))",
            cause=r"ends one tile early", not_words=("Nk // BLOCK_N", "runs zero times")),
    Mistake("causal_offset_sign_flipped", CA, "(offs_n[None, :] <= offs_m[:, None] + Nk - Nq)",
            "(offs_n[None, :] <= offs_m[:, None] + Nq - Nk)",
            cause=r"sign flipped", not_words=("Nk // BLOCK_N", "runs zero times")),
    Mistake("delta_in_float16", DE, "delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)",
            "delta = tl.sum(o * do, axis=1)", cause=r"float16.*tl\.float32", not_words=("atomic",)),
    Mistake("delta_store_unmasked", DE, "tl.store(delta_ptr + offs_r, delta, mask=offs_r < rows)",
            "tl.store(delta_ptr + offs_r, delta)", cause=r"past the end|out of bounds|mask"),
    # the CUDA C++ row-per-block forward
    Mistake("cuda_running_max_dropped", CU, "        m = m_new;\n", "",
            cause=r"not carried from one tile to the next"),
    Mistake("cuda_p_from_old_max", CU, "float p = (j < hi) ? expf(s - m_new) : 0.0f;",
            "float p = (j < hi) ? expf(s - m) : 0.0f;", cause=r"produced NaN.*old max", not_words=("never written (",)),
    Mistake("cuda_alpha_inverted", CU, "float alpha = expf(m - m_new);", "float alpha = expf(m_new - m);",
            cause=r"alpha = exp\(m_new - m\) \(inverted\)", not_words=("never written (", "ends one tile early")),
]
MISTAKES += [
    Mistake("cuda_running_max_of_chunk_only", CU, "float m_new = fmaxf(m, block_max(s, scratch));",
            "float m_new = block_max(s, scratch);", cause=r"current tile only", not_words=("never written (",)),
]
