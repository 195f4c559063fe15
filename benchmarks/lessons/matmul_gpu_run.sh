#!/bin/bash
# One GPU session for lesson 06: record the matmul topics into benchmarks/results/records/<gpu>.json,
# then the matmul tests and notebooks on the GPU. Results are copied to $OUT (default /tmp).
OUT=${OUT:-/tmp}
set -o pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
GPU=$(python3 -c "import torch; from utils.bench import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")  # h200 on an H200: the files' stem
timeout 330 python3 -m benchmarks --topics matmul,matmul_fp16 --update 2>&1 | tail -45
cp benchmarks/results/records/${GPU}.json benchmarks/results/records/${GPU}.md "$OUT"/ 2>/dev/null
cp benchmarks/results/records/${GPU}-matmul*.png "$OUT"/ 2>/dev/null
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_matmul.py 2>&1 | tail -4
timeout 120 python3 -m pytest -q -p no:cacheprovider --nbval-lax notebooks/06_matmul.ipynb solutions/06_matmul.ipynb 2>&1 | tail -4
