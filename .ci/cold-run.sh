#!/usr/bin/env bash
# A cold run of the README's test command, as a newcomer's first `./course test` sees it:
# a fresh clone of the current commit, with empty compile caches (the course's .cache/, torch's
# extension cache, Triton's and Numba's caches). The virtual environment is reused
# (COURSE_VENV, default .venv of this checkout): pip's time is not pytest's time.
# Writes benchmarks/results/cpu-validation.txt (or $1) with the pytest total and the time
# spent per test file and per notebook.
# Usage: bash .ci/cold-run.sh [OUTFILE]
set -uo pipefail
cd "$(dirname "$0")/.."
here=$PWD
out=${1:-$here/benchmarks/results/cpu-validation.txt}
venv=$(cd "${COURSE_VENV:-.venv}" && pwd)
commit=$(git rev-parse HEAD)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$here" "$tmp/course"
git -C "$tmp/course" checkout -q "$commit"
mkdir -p "$tmp/torch_extensions" "$tmp/triton" "$tmp/numba"
cd "$tmp/course"
start=$(date +%s)
COURSE_VENV=$venv TORCH_EXTENSIONS_DIR=$tmp/torch_extensions TRITON_CACHE_DIR=$tmp/triton \
  NUMBA_CACHE_DIR=$tmp/numba COURSE_NO_SYSTEM_CUDA=1 \
  ./course test --durations=0 -q > "$tmp/log" 2>&1
status=$?
end=$(date +%s)
"$venv/bin/python" - "$tmp/log" "$out" "$commit" "$status" "$((end - start))" <<'PY'
import collections, platform, re, sys, datetime
log, out, commit, status, wall = sys.argv[1:]
text = open(log).read()
per_file = collections.Counter()
for m in re.finditer(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)(?:::|\s|$)", text, re.M):
    per_file[m.group(2)] += float(m.group(1))
summary = [l for l in text.splitlines() if re.match(r"^=+ .*(passed|failed|error)", l)]
import torch, triton, numba
try:
    import numba_cuda; nc = numba_cuda.__version__
except Exception:
    nc = "?"
lines = [
    "CPU validation run: `bash .ci/cold-run.sh`: `./course test` in a fresh clone with EMPTY compile "
    "caches (the course's .cache/, torch's extension cache, Triton's and Numba's caches); the venv reused",
    f"commit: {commit}",
    f"machine: {__import__('os').cpu_count()} cores, no GPU (simulation), python {platform.python_version()}, "
    f"torch {torch.__version__}, triton {triton.__version__}, numba-cuda {nc}",
    f"date: {datetime.date.today().isoformat()}",
    f"wall time of pytest (cold): {wall} s; pytest exit code {status}",
    *summary[-1:],
    "",
    "== seconds per test file or notebook (setup + call + teardown, summed over its tests; "
    "two workers run in parallel, so these add up to about twice the wall time) ==",
]
for f, s in sorted(per_file.items(), key=lambda kv: -kv[1]):
    lines.append(f"{s:8.1f} s  {f}")
failed = [l for l in text.splitlines() if l.startswith(("FAILED", "ERROR"))]
if failed:
    lines += ["", "== failures ==", *failed]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:8]))
PY
exit $status
