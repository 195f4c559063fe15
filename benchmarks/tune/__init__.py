"""Sweeps and probes that choose a kernel's settings on a GPU: what they find goes into the
kernels' defaults (tile sizes, warps, programs per SM, configurations to autotune from).

    attention_tune      tile sizes of the Triton attention kernels, forward and backward, beside
                        SDPA's backends (the candidates of kernels/triton/attention.py)
    capture_probe       which host read inside a CUDA graph capture breaks a later capture of the
                        same process, and what recovers it (results/tune/<gpu>-capture-probe.json)
    gpt_launch_tune     lesson 11's step beyond its norms: each matmul on cuBLAS and on the Triton
                        linear (splits of K), the Triton cross-entropy launcher, the whole step
                        (results/tune/<gpu>-gpt-launch-tune.json; -tma.json: a later run with the
                        persistent TMA kernel beside the blocked one)
    gpt_step_tune       the launch settings of lesson 11's written-out training step at GPT-2
                        124M's shapes: LayerNorm backward, bias gradients, cross entropy
                        (results/tune/<gpu>-gpt-step-tune.json; kernels/gpt_step.py uses them)
    hopper_tune         lesson 12's CUDA C++ GEMM ladder: each version checked, v3-v6 against cuBLAS
                        for each persistent tile order (GROUP_M), registers and spills, ncu's
                        speed of light (DIR/hopper-tune.json)
    layernorm_tune      the knobs of the LayerNorm/RMSNorm kernels and of Triton's fp16/bf16
                        matmul, in one run (DIR/tune.json; two runs: results/tune/)
    matmul_tune         matmul configurations at 4096^3 against torch.mm (VEC4_CONFIG of
                        kernels/cuda/matmul.py); prints
    softmax_l2_probe    Triton softmax v4's settings at the widest shape: programs per SM, warps
                        (results/lessons/<gpu>-softmax-l2-probe.json: lesson 05 shows it)
    tf32_probe          how the tensor cores read float32 in tl.dot, against the interpreter's
                        model (results/lessons/<gpu>-tf32.json: lesson 06 shows it)

Each runs as ``python -m benchmarks.tune.<name>`` from the course's root (``--help``, or the
usage at the top of the script). Names: subject first, then what is measured (the rule is in
``benchmarks/__init__.py``).
"""
