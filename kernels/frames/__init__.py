"""The topics' frames: what the CUDA C++, Numba and Triton launchers of a topic share, written
once (see kernels/__init__.py). A frame imports only the runtime, torch, ``kernels._launch`` and
other frames, never a language's module; each ``kernels/<lang>/<topic>.py`` imports its frame.

    add                 add_2d_input, check_grid_rows, add_ref
    relu                relu_backward_input, relu_ref
    gelu                gelu_ref, the PyTorch baselines (BASELINES: op by op, F.gelu, torch.compile)
    reduction           sum_input, sum_frame, row_max_input, row_max_frame, num_blocks_grid_stride, the refs
    softmax             softmax_input, softmax_frame, check_fused_cols, softmax_ref
    matmul              FP32, HALF, check_operands, prepare_operands, matmul_ref
    matmul_fp16         matmul's rules with HALF, matmul_fp16_ref
    layernorm           EPS, check_norm_inputs, check_norm_backward_inputs, norm_forward, norm_backward, the refs
    attention           check_qkv, check_backward_inputs, empty_result, finish_grads, backward_designs, the refs
    cross_entropy       IGNORE_INDEX, check_ce_inputs, prepare_forward, prepare_backward, prepare_mean_loss, the refs
    embedding           the input rules, forward_frame, backward_frame, CHUNK, chunk_partials, the refs
    adamw               adamw_tensors, check_hyper, prepare_grad_norm, MAX_BLOCKS, NORM_BLOCKS, the refs
    bias_gelu           check_bias_inputs, check_bias_backward_inputs, THREADS, grid_for, the refs
    residual_layernorm  check_residual_inputs, unfused_frame, fused_frame, THREADS, grid_for, the ref
"""
