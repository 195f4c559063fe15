#!/usr/bin/env bash
# The GPU validation run: on a machine with an NVIDIA GPU, run the unit tests and every lesson
# and solution notebook under nbval (the same command as `./course test`, without the browser
# test), and write a summary. Usage:  bash .ci/gpu-validate.sh [OUTDIR]
# The summary goes to OUTDIR/h100-validation.txt; commit it as benchmarks/results/h100-validation.txt.
# It names the git commit tested; in a copy without .git, set COURSE_COMMIT to that commit's hash.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-artifacts/gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
workers=${WORKERS:-8}

# Which code is tested, taken before the run (the tests write caches and artifacts).
code=$(python3 -c 'import utils; print(utils.commit_str(utils.source_commit()))' 2>/dev/null | tail -1)
start=$(date +%s)
python3 -m pytest -n "$workers" --dist loadfile -q -p no:cacheprovider --durations=0 \
    --deselect tests/test_browser.py "${@:2}" 2>&1 | tee "$out/validation.log"
status=${PIPESTATUS[0]}
end=$(date +%s)

{
  echo "GPU validation run: unit tests + pytest --nbval-lax of notebooks/ and solutions/"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "code: ${code:-commit unknown}"
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
} > "$out/h100-validation.txt"
cat "$out/h100-validation.txt"
exit "$status"
