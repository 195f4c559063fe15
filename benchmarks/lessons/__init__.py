"""Captures that a lesson shows: GPU numbers and outputs recorded once and committed in
``benchmarks/results/lessons/``, so that the lesson shows them on any machine.

    collectives_bandwidth          lesson 13: the ring all-reduce written from sends and receives
                                   beside torch.distributed.all_reduce, 4 KB to 1 GB, bus
                                   bandwidth (<gpu>-collectives-<backend>-<world>.json, .png)
    ddp_scaling                    lesson 13 on several GPUs: lesson 11's GPT on one rank and on N
                                   (NCCL, or gloo with --tiny), the same global batch, under the
                                   DDP from scratch, torch's DDP, the naive all-reduce and ZeRO-1:
                                   tokens/s, scaling, losses against one rank's
                                   (<gpu>-ddp-scaling-<backend>-<world>.json, .png)
    ddp_step_time                  lesson 13: the training step under the bucketed DDP written
                                   from scratch beside torch's DDP on gloo ranks of the CPU, and
                                   AdamW's state a rank under ZeRO-1 (cpu-ddp-step-time.json)
    gpt_cpu_train                  lesson 11's laptop run: a character-level GPT trained on the
                                   CPU (gpt-cpu-train.json)
    gpt_kernels                    lesson 11's kernels (fused cross-entropy, embedding backward,
                                   AdamW, bias + GELU, residual + LayerNorm) beside torch
                                   (<gpu>-lesson11.json)
    gpt_train                      lesson 11: GPT-2 124M trained on torch's kernels and on the
                                   course's (gpt-train.json, gpt-train.png)
    hopper_ladder                  lesson 12: the TMA + wgmma GEMM ladder and Triton's beside
                                   cuBLAS, and Hopper's mistakes run on the GPU
                                   (<gpu>-hopper-ladder.json)
    launch_overhead                lessons 03 and 08: what one launch costs the host
                                   (launch-overhead.json)
    layernorm_forward_backward     lesson 09: LayerNorm and RMSNorm forward and backward beside
                                   torch and Liger (<gpu>-layernorm.json)
    output_code                    lesson 07: what torch.compile writes around a custom op
                                   (<gpu>-output-code.txt)
    step_time_and_dram             lessons 08 and 06: a training step with and without
                                   print(loss) (<gpu>-print-loss.json), the DRAM bytes of every
                                   matmul version under ncu (<gpu>-matmul-dram.json)
    streams_and_graphs             lesson 13: a copy beside compute on two CUDA streams, the
                                   LayerNorm launchers replayed as CUDA graphs, and what breaks a
                                   graph's capture (<gpu>-streams-graphs.json,
                                   <gpu>-streams-trace.json.gz)

GPU sessions, run with bash from the course's root on the GPU machine:

    hopper_gpu_run.sh              lesson 12: its exercise catalog's GPU verdicts (sim_vs_gpu, one process
                                   an entry), the hopper topic into the GPU's record, hopper_ladder, and
                                   what hopper.h's choices cost (benchmarks/tune/hopper_tune.py --variants)
    matmul_gpu_run.sh              lesson 06: the matmul topics into the GPU's record, then the
                                   matmul tests and notebook
    step_time_and_dram_gpu_run.sh  lessons 06 and 08: step_time_and_dram (under ncu for the
                                   DRAM bytes) and Nsight Systems' stats of a training loop
                                   (<gpu>-profiler-nsys.txt)

Each script runs as ``python -m benchmarks.lessons.<name>`` from the course's root (``--help``,
or the usage at the top of the script). Names: subject first, then what is measured, no
lesson number (the rule is in ``benchmarks/__init__.py``).
"""
from __future__ import annotations

import json
from pathlib import Path


def load_gpu_record(pattern: str, script: str, path=None) -> tuple[dict, str | None]:
    """A lesson's recorded GPU result and the GPU's short name: ``path``, else the newest GPU's
    file named by ``pattern`` (``"{gpu}-hopper-ladder.json"``) in ``benchmarks/results/``; a
    clear error naming the ``script`` that records it when there is none."""
    import utils
    gpu = None
    if path is None:
        path, gpu = utils.recorded_gpu_file(pattern)
        if path is None:
            raise FileNotFoundError(f"no {pattern.format(gpu='<gpu>')} in {utils.LESSON_RESULTS_DIR}: run "
                                    f"python -m benchmarks.lessons.{script} on a GPU")
    data = json.loads(Path(path).read_text())
    return data, gpu or utils.gpu_short_name(data.get("gpu"))
