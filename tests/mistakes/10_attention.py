"""Exercise 10, attention: typical mistakes as mutations of the solution (see __init__.py)."""
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
