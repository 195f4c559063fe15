"""Exercise 12, Hopper's machinery: typical mistakes as mutations of the solution (see __init__.py).

On a GPU several of these hang a kernel: hopper.h stops an mbarrier wait after 2 s with a trap,
which leaves the process's CUDA context unusable, so on a GPU each entry is graded in a process
of its own (``ISOLATE``)."""

ISOLATE = "a trap (hopper.h's mbarrier time limit, a misaligned TMA tile) ends the CUDA context of its process"

TR = "tma_transpose_kernel(const TmaDescriptor*"
WG = "wgmma_tile_kernel(const TmaDescriptor*"
PP = "pipeline_gemm_kernel(const TmaDescriptor*"

MISTAKES = [
    # Exercise 1: a TMA box through an mbarrier
    Mistake("tma_bytes_inside_the_tensor_only", TR,
            "mbarrier_arrive_expect_tx(&bar, BOX * BOX * sizeof(__nv_bfloat16));",
            "mbarrier_arrive_expect_tx(&bar, min(BOX, R - row0) * min(BOX, C - col0) * sizeof(__nv_bfloat16));",
            cause=r"whole box|even where the box hangs", not_words=("__syncthreads",)),
    Mistake("tma_box_row_first", TR, "tma_load_2d(tile, x_map, col0, row0, &bar);",
            "tma_load_2d(tile, x_map, row0, col0, &bar);", cause=r"column first"),
    Mistake("tma_never_waited_for", TR, "    mbarrier_wait(&bar, 0);\n    // END", "    // END",
            cause=r"mbarrier_wait|landed|waits"),
    Mistake("tma_wait_for_parity_1", TR, "    mbarrier_wait(&bar, 0);\n    // END",
            "    mbarrier_wait(&bar, 1);\n    // END", cause=r"parity", not_words=("__syncthreads",)),
    Mistake("tma_store_not_guarded", TR, "if (row0 + r < R && col0 + c < C) out_ptr", "out_ptr",
            cause=r"past the end|outside|guard|bounds"),
    Mistake("tma_tile_not_aligned", TR, "tma_load_2d(tile, x_map, col0, row0, &bar);",
            "tma_load_2d(tile + 8, x_map, col0, row0, &bar);", cause=r"aligned"),
    # Exercise 2: one wgmma tile
    Mistake("wgmma_swizzle_not_the_maps", WG, "uint64_t da = smem_descriptor(sa, SWIZZLE_128B)",
            "uint64_t da = smem_descriptor(sa, SWIZZLE_64B)", cause=r"swizzle"),
    Mistake("wgmma_descriptor_stride", WG, "uint64_t da = smem_descriptor(sa, SWIZZLE_128B)",
            "uint64_t da = make_smem_descriptor(smem_addr(sa), 16, 512, 1)", cause=r"stride|swizzle"),
    Mistake("wgmma_k_step_of_16_bytes", WG, "wgmma<64>(d, da + 2 * ks, db + 2 * ks, ks > 0)",
            "wgmma<64>(d, da + ks, db + ks, ks > 0)", cause=r"overlap|\+ 2|32 bytes"),
    Mistake("wgmma_scale_d_always_0", WG, "wgmma<64>(d, da + 2 * ks, db + 2 * ks, ks > 0)",
            "wgmma<64>(d, da + 2 * ks, db + 2 * ks, 0)", cause=r"scale_d"),
    Mistake("wgmma_never_waited_for", WG, "    wgmma_commit();\n    wgmma_wait<0>();\n", "    wgmma_commit();\n",
            cause=r"wgmma_wait", not_words=("whole warpgroup",),
            sim_only="undefined behaviour: accumulators read before wgmma_wait are undefined; on the H200 the "
                     "tensor cores had finished this one tile before the store read them"),
    Mistake("wgmma_half_a_warpgroup", WG, "wgmma_k[1, 128]", "wgmma_k[1, 64]", cause=r"warpgroup|128 threads"),
    Mistake("wgmma_accumulators_stored_transposed", WG, "if (row < M && col < N) c_ptr[row * N + col] = d[i];",
            "if (row < N && col < M) c_ptr[col * M + row] = d[i];", cause=r"layout|transposed"),
    # Exercise 3: the two-stage pipeline
    Mistake("pipeline_producer_does_not_wait_for_release", PP,
            "                mbarrier_wait(&empty[s], phase ^ 1);\n", "", cause=r"release|empty"),
    Mistake("pipeline_consumer_never_releases", PP, "        mbarrier_arrive(&empty[s]);\n", "",
            cause=r"never release|empty barrier", not_words=("__syncthreads",)),
    Mistake("pipeline_phase_never_flipped", PP,
            "        int s = kt % STAGES, phase = kt / STAGES % 2;\n        mbarrier_wait(&full[s], phase);",
            "        int s = kt % STAGES, phase = 0;\n        mbarrier_wait(&full[s], phase);", cause=r"parity"),
    Mistake("pipeline_producer_first_wait_for_phase_0", PP, "mbarrier_wait(&empty[s], phase ^ 1);",
            "mbarrier_wait(&empty[s], phase);", cause=r"parity 1|before the first"),
    Mistake("pipeline_bytes_of_a_only", PP, "(BM + BN) * BK * sizeof(__nv_bfloat16)", "BM * BK * sizeof(__nv_bfloat16)",
            cause=r"bytes"),
    Mistake("pipeline_release_before_wgmma_wait", PP, "        wgmma_wait<0>();\n        mbarrier_arrive(&empty[s]);\n",
            "        mbarrier_arrive(&empty[s]);\n        wgmma_wait<0>();\n", cause=r"after wgmma_wait",
            sim_only="a race: whether the next TMA load into the released stage lands before the tensor cores "
                     "have read it depends on timing, so a GPU may compute the right product"),
    Mistake("pipeline_last_k_tile_dropped", PP, "int k_tiles = (K + BK - 1) / BK;", "int k_tiles = K / BK;",
            cause=r"last k-tile|cdiv"),
    # right kernels written another way
    Mistake("pipeline_three_stages_ok", PP, "#define STAGES 2", "#define STAGES 3", verdict="accepted"),
    Mistake("tma_transpose_row_by_row_ok", TR, "int c = i / BOX, r = i % BOX;", "int r = i / BOX, c = i % BOX;",
            verdict="accepted"),
]
