#!/usr/bin/env bash
# Lesson 12's GPU session on a Hopper GPU: the exercise catalog's verdicts (each entry in a
# process of its own: a trap ends its CUDA context) and the graders' TMA test kernel into
# sim-vs-gpu.json, the hopper topic's rows into the GPU's record, and the lesson's exercise
# notebook with test_hopper. Usage: bash benchmarks/lessons/hopper_gpu_run.sh OUTDIR
# Copy OUTDIR's files back into benchmarks/results/ (the paths under OUTDIR mirror it).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: hopper_gpu_run.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
t0=$(date +%s)
python3 -m benchmarks.simulators.sim_vs_gpu --record --only mistake:12_hopper/ --jobs 6 2>&1 | tail -40 \
    | tee "$out/sim-vs-gpu-12.log"
python3 -m benchmarks.simulators.sim_vs_gpu --record --only kernel:cu_tma_transpose_ok 2>&1 | tail -5 \
    | tee -a "$out/sim-vs-gpu-12.log"
echo "sim-vs-gpu: $(( $(date +%s) - t0 )) s"
python3 -m benchmarks --topics hopper --update --no-sweep 2>&1 | tail -40 | tee "$out/benchmarks-hopper.log"
echo "benchmarks: $(( $(date +%s) - t0 )) s"
python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadfile solutions/12_hopper.ipynb tests/test_hopper.py \
    tests/test_hopper_triton.py 2>&1 | tail -15 | tee "$out/pytest-hopper.log"
echo "total: $(( $(date +%s) - t0 )) s"
mkdir -p "$out/results/simulators" "$out/results/records"
cp benchmarks/results/simulators/sim-vs-gpu.json benchmarks/results/simulators/sim-vs-gpu.md "$out/results/simulators/"
cp benchmarks/results/records/*.json "$out/results/records/" 2>/dev/null
ls -R "$out" | head -30
