#!/usr/bin/env bash
# The GPU validation run: on a machine with an NVIDIA GPU, run the unit tests and every lesson
# and solution notebook under nbval (the same command as `./course test`, without the browser
# test), and write a summary. Usage:  bash .ci/gpu-validate.sh [OUTDIR [PYTEST ARGS...]]
# The summary goes to OUTDIR/<gpu>-validation.txt, named from the GPU by the rule of the GPU
# records (utils.gpu_slug: h100-validation.txt on an H100, h200-validation.txt on an H200);
# commit it in benchmarks/results/validation/. Its first lines name the GPU and the code tested
# (`code: commit <hash>`, "plus uncommitted changes" when the tree differed from it); in a copy
# without .git, set COURSE_COMMIT to that commit's hash.
# A change to runtime/, kernels/, utils/, notebooks/, exercises/ or solutions/ ends with one such
# call at its final commit: `python -m benchmarks --stale` reads the newest summary's `code:` line
# (and whether that call passed) and says when one is due.
# BUDGET_S (seconds) stops the tests when they run longer (SIGINT: pytest reports what ran), so
# that a summary is written before the device call's own limit kills everything; the summary
# then says "cut short", and --stale does not count it as a validation.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-artifacts/gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
workers=${WORKERS:-8}

# Which code is tested, taken before the run (the tests write caches and artifacts).
code=$(python3 -c 'import utils; print(utils.commit_str(utils.source_commit()))' 2>/dev/null | tail -1)
# Which GPU, and the summary's name from it (the same rule as python -m benchmarks).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
name=$(python3 -c 'import sys; from utils.bench import gpu_slug; print(gpu_slug(sys.argv[1]))' "$gpu" 2>/dev/null | tail -1)
summary="$out/${name:-gpu}-validation.txt"
start=$(date +%s)
budget=${BUDGET_S:-0}
limit=()
[ "$budget" -gt 0 ] && limit=(timeout --signal=INT --kill-after=30 "$budget")
${limit[@]+"${limit[@]}"} python3 -m pytest -n "$workers" --dist loadfile -q -p no:cacheprovider --durations=0 \
    --deselect tests/test_browser.py "${@:2}" 2>&1 | tee "$out/validation.log"
status=${PIPESTATUS[0]}
end=$(date +%s)

{
  echo "GPU validation run on ${gpu:-an unknown GPU}: unit tests + pytest --nbval-lax of notebooks/ and solutions/"
  echo "code: ${code:-commit unknown}"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  python3 - <<'PY'
import platform, torch, triton, numba
try:
    import numba_cuda; nc = numba_cuda.__version__
except Exception:
    nc = "?"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, numba {numba.__version__}, numba-cuda {nc}")
PY
  echo "wall time: $((end - start)) s with $workers workers; pytest exit code $status"
  if [ "$budget" -gt 0 ] && { [ "$status" -eq 124 ] || [ "$status" -eq 130 ] || [ "$((end - start))" -ge "$budget" ]; }; then
    echo "cut short: BUDGET_S=$budget s ran out before every test ran (what ran is counted below)"
  fi
  echo
  echo "== summary =="
  grep -E "^(FAILED|ERROR) |^=+ .*(passed|failed)|^[0-9]+ (passed|failed)" "$out/validation.log" | tail -40
  echo
  echo "== per-file wall time (notebooks and solutions: the sum of their cells) =="
  python3 - "$out/validation.log" <<'PY'
import re, sys, collections
tot = collections.defaultdict(float)
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+?)::", line)
    if m:
        tot[m.group(3)] += float(m.group(1))
for f, t in sorted(tot.items()):
    if f.endswith(".ipynb") or t > 5:
        print(f"{t:8.1f} s  {f}")
PY
} > "$summary"
cat "$summary"
exit "$status"
