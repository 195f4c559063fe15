#!/usr/bin/env bash
# The cold-cache CPU validation run: `./course test` as a newcomer runs it, from a fresh clone
# with every build cache empty, and a record of where the time went.
#
#   bash .ci/cold-run.sh [--out FILE] [--log FILE] [--keep-home] [-- PYTEST_ARGS...]
#
# * The clone is of this repository's HEAD (commit first: uncommitted changes are not tested).
# * Caches start empty: the clone's .cache/ (emulated kernels, NVRTC checks, extension builds),
#   torch's extension builds (TORCH_EXTENSIONS_DIR), Triton's and Numba's caches, and HOME
#   itself (matplotlib's font cache, Jupyter's and IPython's folders), unless --keep-home.
#   The record says whether torch's extension cache held anything when the run started.
# * The virtual environment: COURSE_VENV if set (e.g. COURSE_VENV=$PWD/.venv to reuse an installed
#   one), else `./course` creates .venv in the clone and installs requirements.txt (minutes, and
#   the network), exactly as for a newcomer. The record says which.
# * --log FILE keeps pytest's whole output.
# * The record goes to FILE (default benchmarks/results/validation/cpu-validation.txt of this
#   repository): pytest's wall time and summary, the time of each file (the sum of its tests'
#   setup, call and teardown), the slowest tests, and the machine. Commit it.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$here/benchmarks/results/validation/cpu-validation.txt
keep_home=0
log=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --keep-home) keep_home=1; shift ;;
    --log) log=$(realpath -m "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: bash .ci/cold-run.sh [--out FILE] [--log FILE] [--keep-home] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/course-cold-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone -q "$here" "$work/course" || exit 1
cd "$work/course"
commit=$(git rev-parse HEAD)
dirty=$(git -C "$here" status --porcelain --untracked-files=no | head -1)

# Empty caches, all of them outside the clone's own .cache/ (which a fresh clone does not have).
export TORCH_EXTENSIONS_DIR=$work/torch_extensions
export TRITON_CACHE_DIR=$work/triton-cache
export NUMBA_CACHE_DIR=$work/numba-cache
mkdir -p "$TORCH_EXTENSIONS_DIR"
if [ "$keep_home" = 0 ]; then
  mkdir -p "$work/home"
  export HOME=$work/home XDG_CACHE_HOME=$work/home/.cache
  unset MPLCONFIGDIR JUPYTER_CONFIG_DIR JUPYTER_DATA_DIR IPYTHONDIR
fi
torch_ext_before=$(find "$TORCH_EXTENSIONS_DIR" -mindepth 1 | wc -l)
course_cache_before=$(find .cache -mindepth 1 2>/dev/null | wc -l)
if [ -n "${COURSE_VENV:-}" ]; then
  # ./course would install into a reused environment whose packages differ: not in a timing run
  if [ "$(cat "$COURSE_VENV/.requirements.sha256" 2>/dev/null)" != "$(sha256sum requirements.txt | cut -d' ' -f1)" ]; then
    echo "$COURSE_VENV was not installed from this requirements.txt: unset COURSE_VENV for a fresh one" >&2
    exit 1
  fi
  venv_note="reused $COURSE_VENV (installed before the run; its own .pyc files were warm)"
else
  venv_note="created by ./course in the clone (pip install included in the wall time below)"
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

start=$(date +%s)
# bash's `time`: the CPU time of every process of the run (pytest's workers, the notebooks'
# kernels, the compilers), which says more than the wall time on a machine shared with others
TIMEFORMAT='%U %S'
{ time { ./course test --durations=40 -o junit_family=xunit1 --junitxml="$work/junit.xml" "$@" \
           2>&1 | tee "$work/test.log"; echo "${PIPESTATUS[0]}" > "$work/status"; } ; } 2> "$work/cpu"
status=$(cat "$work/status")
end=$(date +%s)
cpu=$(awk '{printf "%.0f s (user %.0f s, system %.0f s)", $1 + $2, $1, $2}' "$work/cpu")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python=${COURSE_VENV:-.venv}/bin/python
mkdir -p "$(dirname "$out")"
{
  echo "CPU validation run, cold caches: bash .ci/cold-run.sh (./course test from a fresh clone)"
  echo "code: commit $commit${dirty:+ (the worktree it was cloned from had uncommitted changes, not tested)}"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) cores, $(uname -m), no GPU expected (simulation); load average before $load_before, after $load_after"
  "$python" - <<'PY'
import platform
try:
    import torch, triton, numba, numba_cuda
    print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"numba {numba.__version__}, numba-cuda {numba_cuda.__version__}")
except Exception as e:  # the record is still worth having
    print(f"python {platform.python_version()} (versions unknown: {e})")
PY
  echo "virtual environment: $venv_note"
  echo "caches at the start: torch extension cache (TORCH_EXTENSIONS_DIR) $( [ "$torch_ext_before" = 0 ] && echo cold, empty || echo "WARM, $torch_ext_before entries"); course .cache/ $( [ "$course_cache_before" = 0 ] && echo cold, empty || echo "WARM, $course_cache_before entries"); Triton and Numba caches empty; HOME $( [ "$keep_home" = 1 ] && echo "kept ($HOME)" || echo "fresh and empty")"
  echo "torch extension builds during the run: $(find "$TORCH_EXTENSIONS_DIR" -name '*.so' | wc -l) libraries; course .cache/cuda-emu: $(ls .cache/cuda-emu 2>/dev/null | grep -c '\.so$') emulated kernel libraries"
  echo "wall time of ./course test: $((end - start)) s (exit status $status); CPU time: $cpu"
  grep -E "^=+ .*(passed|failed|error).* in [0-9.]+s" "$work/test.log" | tail -1
  echo
  echo "== time per file: the sum of its tests' setup, call and teardown (both workers together) =="
  "$python" - "$work/junit.xml" <<'PY'
import collections, sys
import xml.etree.ElementTree as ET
per_file, count = collections.Counter(), collections.Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    f = case.get("file") or case.get("classname", "?").replace(".", "/") + ".py"
    per_file[f] += float(case.get("time") or 0)
    count[f] += 1
for f, t in sorted(per_file.items(), key=lambda kv: -kv[1]):
    print(f"{t:8.1f} s  {count[f]:4d} items  {f}")
print(f"{sum(per_file.values()):8.1f} s  {sum(count.values()):4d} items  total (about twice the wall time with 2 workers)")
PY
  echo
  echo "== slowest tests (pytest --durations=40) =="
  sed -n '/slowest 40 durations/,/^=/p' "$work/test.log" | grep -E "^[0-9.]+s "
} > "$out"
if [ -n "$log" ]; then cp "$work/test.log" "$log"; fi
echo "wrote $out"
exit "$status"
