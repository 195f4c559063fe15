#!/usr/bin/env bash
# Lesson 12's GPU session on a Hopper GPU: the exercise catalog's verdicts (each entry in a
# process of its own: a trap ends its CUDA context) and the graders' TMA test kernel into
# sim-vs-gpu.json, the hopper topic's rows into the GPU's record, the ladder the lesson shows
# (hopper_ladder) and what hopper.h's choices cost (hopper_tune --variants). The lesson's
# notebooks and test_hopper run in .ci/gpu-validate.sh. Usage:
#   bash benchmarks/lessons/hopper_gpu_run.sh OUTDIR        (VARIANTS=0: without the header variants)
# Copy OUTDIR's files back into benchmarks/results/ (the paths under OUTDIR mirror it).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: hopper_gpu_run.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
t0=$(date +%s)
tmp=$(mktemp -d)  # what does not come back: the device tool returns only a few files
gpu=$(python3 -c 'import torch; from utils.bench import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))')
python3 -m benchmarks.simulators.sim_vs_gpu --record --only mistake:12_hopper/ --jobs 6 2>&1 | tail -40 \
    | tee -a "$out/hopper-gpu-run.log"
python3 -m benchmarks.simulators.sim_vs_gpu --record --only kernel:cu_tma_transpose_ok 2>&1 | tail -5 \
    | tee -a "$out/hopper-gpu-run.log"
echo "sim-vs-gpu: $(( $(date +%s) - t0 )) s"
python3 -m benchmarks --topics hopper --update --no-sweep 2>&1 | tail -40 | tee -a "$out/hopper-gpu-run.log"
echo "benchmarks: $(( $(date +%s) - t0 )) s"
python3 -m benchmarks.lessons.hopper_ladder 2>&1 | tail -30 | tee -a "$out/hopper-gpu-run.log"
echo "ladder: $(( $(date +%s) - t0 )) s"
if [ "${VARIANTS:-1}" != 0 ]; then
  python3 -m benchmarks.tune.hopper_tune --variants --out "$tmp" 2>&1 | grep -v resources | tail -12 \
      | tee -a "$out/hopper-gpu-run.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
mkdir -p "$out/results/simulators" "$out/results/records" "$out/results/lessons" "$out/results/tune"
cp benchmarks/results/simulators/sim-vs-gpu.json benchmarks/results/simulators/sim-vs-gpu.md "$out/results/simulators/"
cp "benchmarks/results/records/$gpu.json" "benchmarks/results/records/$gpu.md" "$out/results/records/" 2>/dev/null
cp "benchmarks/results/lessons/$gpu-hopper-ladder.json" "$out/results/lessons/" 2>/dev/null
cp "$tmp/hopper-tune.json" "$out/results/tune/$gpu-hopper-header-variants.json" 2>/dev/null
ls -R "$out" | head -30
