#!/usr/bin/env bash
# Bring a GPU's records up to date, on the GPU machine, from the repository root. STEPS picks
# the steps (default: "stale overhead simvsgpu paths"); each writes into its kind of
# benchmarks/results/ (records/, lessons/, simulators/):
#   tune       benchmarks.tune.layernorm_tune, the parts TUNE_PARTS (default "bwd3:90": the
#              LayerNorm backward's configurations), into tune/<gpu>-layernorm-tune-<n>.json;
#              before the stale step, which records with the configurations the sources choose
#   stale      python -m benchmarks --update --stale: the topics whose kernels changed since
#              their most recent record, measured into this GPU's file (records/<gpu>.json,
#              .md, plots)
#   overhead   benchmarks.lessons.launch_overhead: what one launch costs the host
#              (lessons/launch-overhead.json)
#   simvsgpu   benchmarks.simulators.sim_vs_gpu --record: every catalog verdict graded on this
#              GPU (simulators/sim-vs-gpu.*); SIMVSGPU_ONLY=text: only the entries whose key
#              contains it, merged into the file
#   paths      the tests of the GPU-only paths of the harness (test_gpu_paths.py, the guard's)
#   lesson08   lessons 06 and 08: step time with and without print(loss), Nsight Systems
#              stats of the training loop, DRAM bytes of every matmul version, into lessons/
#              (benchmarks/lessons/step_time_and_dram_gpu_run.sh; LIBDW names a folder with
#              libdw.so.1)
#   ncu        lessons 02, 04 and 08: Nsight Compute counters of
#              benchmarks/simulators/ncu_patterns.py, sections of one kernel and
#              compute-sanitizer's reports into simulators/, the torch.profiler trace into
#              lessons/ (benchmarks/simulators/ncu_gpu_run.sh)
#   probes     lesson 07's torch.compile output code, lesson 05's softmax L2 probe, lesson 06's
#              TF32 probe, into lessons/
#   layernorm  lesson 09's forward and backward timings, into lessons/
#              (benchmarks.lessons.layernorm_forward_backward)
#   lesson11   lesson 11's kernels beside torch, into lessons/ (benchmarks.lessons.gpt_kernels)
#   gpttrain   lesson 11's GPT-2 124M: torch eager, torch.compile, the kernel-swap ablation and
#              the written-out step, into lessons/gpt-train.json (benchmarks.lessons.gpt_train;
#              about 4 minutes on an H200)
#   sweeps     SWEEP_TOPICS (comma-separated, default every topic) re-measured whole, with
#              their size sweeps, within BUDGET_S
#   validate   .ci/gpu-validate.sh (WORKERS, default 16; BUDGET_S, default 390; 3-4 minutes
#              on an H200), its summary
#              into validation/. It runs before every other step, so that a call cut short
#              loses records, which the next call can take again, not half a validation
# Every results file written or changed is packed into OUT/records.tgz (unpack it in the
# repository root and commit); the log of each step is in OUT/rerecord.log.
# Usage: [STEPS="..."] bash benchmarks/rerecord_gpu_run.sh [OUT] [BUDGET_S]
#   (BUDGET_S: seconds for the stale and sweeps steps, default 330)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-artifacts/gpu}}
budget=${2:-330}
STEPS=${STEPS:-stale overhead simvsgpu paths}
want() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export COURSE_COMMIT=${COURSE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
GPU=$(python3 -c "import torch; from utils.bench import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")
[ -n "$GPU" ] || { echo "no GPU here: nothing to record"; exit 2; }
RES=benchmarks/results
LES=$RES/lessons SIM=$RES/simulators
marker=$(mktemp); touch "$marker"; sleep 1
{
  start=$(date +%s)
  mark() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
  if want validate; then
    mark "validate: .ci/gpu-validate.sh"
    tmp=$(mktemp -d)
    WORKERS=${WORKERS:-16} BUDGET_S=${BUDGET_S:-390} timeout 460 bash .ci/gpu-validate.sh "$tmp" 2>&1 \
        | sed -n '/^wall time/,/== per-file/p'
    cp "$tmp/$GPU-validation.txt" $RES/validation/ 2>/dev/null && echo "summary: $RES/validation/$GPU-validation.txt"
  fi
  if want tune; then
    mark "tune: benchmarks.tune.layernorm_tune --parts ${TUNE_PARTS:-bwd3:90}"
    tmp=$(mktemp -d)
    timeout 200 python3 -m benchmarks.tune.layernorm_tune --out "$tmp" --budget 150 --parts "${TUNE_PARTS:-bwd3:90}" \
        2>&1 | tail -20; echo "rc=$?"
    n=1; while [ -e "$RES/tune/$GPU-layernorm-tune-$n.json" ]; do n=$((n + 1)); done
    cp "$tmp/tune.json" "$RES/tune/$GPU-layernorm-tune-$n.json" 2>/dev/null && echo "tune: $RES/tune/$GPU-layernorm-tune-$n.json"
  fi
  if want stale; then
    mark "stale: python -m benchmarks --update --stale --budget $budget"
    timeout $((budget + 60)) python3 -m benchmarks --update --stale --budget "$budget"; echo "rc=$?"
  fi
  if want overhead; then
    mark "launch overhead"
    timeout 120 python3 -m benchmarks.lessons.launch_overhead; echo "rc=$?"
  fi
  if want simvsgpu; then
    mark "sim-vs-gpu verdicts"
    timeout 240 python3 -m benchmarks.simulators.sim_vs_gpu --record --jobs 12 ${SIMVSGPU_ONLY:+--only "$SIMVSGPU_ONLY"} \
        | tail -40; echo "rc=$?"
  fi
  if want paths; then
    mark "the harness's GPU-only paths"
    timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 --dist loadfile -o addopts="" \
        tests/test_gpu_paths.py tests/test_grader_guard.py tests/test_traffic.py 2>&1 | tail -25
  fi
  if want lesson08; then
    mark "lesson08"
    tmp=$(mktemp -d)
    OUT=$tmp timeout 420 bash benchmarks/lessons/step_time_and_dram_gpu_run.sh "${LIBDW:-}" 2>&1 | tail -60
    cp "$tmp/$GPU-print-loss.json" "$tmp/$GPU-profiler-nsys.txt" "$tmp/$GPU-matmul-dram.json" $LES/ 2>/dev/null
    ls "$tmp"
  fi
  if want ncu; then
    mark "ncu"
    tmp=$(mktemp -d)
    # Nsight Systems runs in the lesson08 step; ncu, sections, the profiler trace and the sanitizer here
    OUT=$tmp NSYS= STEPS="${NCU_STEPS:-ncu sections profiler sanitizer}" timeout 560 bash benchmarks/simulators/ncu_gpu_run.sh "$COURSE_COMMIT" 2>&1 | tail -60
    r=$tmp/results
    cp "$r/ncu-$GPU.json" "$r/$GPU-sanitizer.txt" $SIM/ 2>/dev/null
    cp "$r/$GPU-profiler-loop.json.gz" "$r/$GPU-profiler-loop.txt" $LES/ 2>/dev/null
    [ -s "$r/ncu-sections.txt" ] && cp "$r/ncu-sections.txt" "$SIM/ncu-$GPU-sections.txt"
    ls "$r"
  fi
  if want probes; then
    mark "probes: output code"
    timeout 240 python3 -m benchmarks.lessons.output_code --commit "$COURSE_COMMIT" 2>&1 | tail -8; echo "rc=$?"
    mark "probes: softmax L2"
    timeout 120 python3 -m benchmarks.tune.softmax_l2_probe --out "$LES/$GPU-softmax-l2-probe.json" 2>&1 | tail -12; echo "rc=$?"
    mark "probes: tf32"
    timeout 90 python3 -m benchmarks.tune.tf32_probe "$LES/$GPU-tf32.json" 2>&1 | tail -12; echo "rc=$?"
  fi
  if want layernorm; then
    mark "layernorm forward and backward"
    timeout 300 python3 -m benchmarks.lessons.layernorm_forward_backward --out "$LES/$GPU-layernorm.json" --budget 200 2>&1 | tail -30; echo "rc=$?"
  fi
  if want lesson11; then
    mark "lesson11"
    timeout 300 python3 -m benchmarks.lessons.gpt_kernels --budget 200 2>&1 | tail -40; echo "rc=$?"
  fi
  if want gpttrain; then
    mark "gpttrain"
    timeout 420 python3 -m benchmarks.lessons.gpt_train --steps 200 --ablation-steps 60 --budget 360 \
        --out "$LES" 2>&1 | grep -v '^ \|^{\|^}' | tail -30; echo "rc=$?"
  fi
  if want sweeps; then
    mark "sweeps: ${SWEEP_TOPICS:-every topic}"
    timeout $((budget + 60)) python3 -m benchmarks --update --topics "${SWEEP_TOPICS:-relu,gelu,reduction,softmax,matmul,matmul_fp16,layernorm,attention}" --budget "$budget" 2>&1 | tail -40; echo "rc=$?"
  fi
  mark "done"
} 2>&1 | tee "$out/rerecord.log"
find $RES -type f -newer "$marker" | sort > "$out/changed.txt"
cat "$out/changed.txt"
tar czf "$out/records.tgz" -T "$out/changed.txt"
