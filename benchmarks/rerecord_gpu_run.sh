#!/usr/bin/env bash
# Bring a GPU's records up to date, on the GPU machine, from the repository root:
#   1. python -m benchmarks --update --stale: the topics whose kernels changed since their most
#      recent record, measured into this GPU's file (<gpu>.json, .md, plots);
#   2. benchmarks/launch_overhead.py: what one launch costs the host (launch-overhead.json);
#   3. benchmarks/sim_vs_gpu.py --record: every catalog verdict graded on this GPU (sim-vs-gpu.*);
#   4. the tests of the GPU-only paths of the harness (tests/test_gpu_paths.py and the guard's).
# Every results file written or changed is packed into OUT/records.tgz (unpack it in the
# repository root and commit); the log of each step is in OUT/rerecord.log.
# Usage: bash benchmarks/rerecord_gpu_run.sh [OUT] [BUDGET_S]   (BUDGET_S: seconds for step 1)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-artifacts/gpu}}
budget=${2:-330}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
marker=$(mktemp); touch "$marker"; sleep 1
{
  start=$(date +%s)
  echo "== 1. python -m benchmarks --update --stale --budget $budget"
  timeout $((budget + 60)) python3 -m benchmarks --update --stale --budget "$budget"; echo "rc=$?"
  echo "   $(( $(date +%s) - start )) s"
  echo "== 2. launch overhead"
  timeout 120 python3 benchmarks/launch_overhead.py; echo "rc=$?"
  echo "   $(( $(date +%s) - start )) s"
  echo "== 3. sim-vs-gpu verdicts"
  timeout 240 python3 benchmarks/sim_vs_gpu.py --record --jobs 12 | tail -40; echo "rc=$?"
  echo "   $(( $(date +%s) - start )) s"
  echo "== 4. the harness's GPU-only paths"
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 --dist loadfile -o addopts="" \
      tests/test_gpu_paths.py tests/test_grader_guard.py tests/test_traffic.py 2>&1 | tail -25
  echo "   $(( $(date +%s) - start )) s"
} 2>&1 | tee "$out/rerecord.log"
find benchmarks/results -type f -newer "$marker" | sort > "$out/changed.txt"
cat "$out/changed.txt"
tar czf "$out/records.tgz" -T "$out/changed.txt"
