#!/usr/bin/env bash
# The GPU side of the profiling comparison, in one batch (run from the repository root on the
# GPU machine, with $OUT the folder whose files come back). Arg 1: the commit measured.
#   - Nsight Compute's raw counters of every case of benchmarks/simulators/ncu_patterns.py
#   - do_bench timings of the same cases (a separate pass: ncu's replays distort time)
#   - ncu's sections of one course kernel, as text
#   - torch.profiler trace and, when nsys runs, nsys stats of a small training loop (on the lent
#     H100 the nsys inside Nsight Compute records, but its importer lacks libdw.so.1, so no
#     report comes out: the torch.profiler trace shows the same wait)
#   - compute-sanitizer racecheck / memcheck of the racy and out-of-bounds test kernels
# Everything lands in $OUT/ncu-results.tgz and $OUT/log files; of those, ncu-<gpu>.json,
# ncu-<gpu>-sections.txt and <gpu>-sanitizer.txt belong in benchmarks/results/simulators/,
# <gpu>-profiler-loop.* in benchmarks/results/lessons/ (rerecord_gpu_run.sh puts them there).
# STEPS (default all: "ncu sections profiler sanitizer") picks the steps to run.
set -uo pipefail
export COURSE_COMMIT=${1:-unknown} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
GPU=$(python3 -c "import torch; from utils.bench import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")  # h200 on an H200: the files' stem
R=$OUT/results; mkdir -p $R
BIN=$(dirname "$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)")
NCU=$BIN/ncu; SAN=$BIN/compute-sanitizer
NSYS=${NSYS-$(find /usr/local /opt -name nsys -type f -perm -u+x 2>/dev/null | head -1)}  # NSYS= (empty) skips Nsight Systems
echo "ncu: $NCU  sanitizer: $SAN  nsys: ${NSYS:-none}"; $NCU --version | tail -1 > $R/ncu-version.txt
t0=$(date +%s); step() { echo "--- $1 ($(( $(date +%s) - t0 )) s)"; }
STEPS=${STEPS:-ncu sections profiler sanitizer}
want() { [[ " $STEPS " == *" $1 "* ]]; }

if want ncu; then
step "ncu raw counters"
M=$(python3 -c "import benchmarks.simulators.ncu_run as r; print(','.join(r.METRICS + r.EXTRA_METRICS))")
MC=$(python3 -c "import benchmarks.simulators.ncu_run as r; print(','.join(r.METRICS))")
timeout 300 $NCU --profile-from-start off --csv --page raw --metrics "$M" --log-file $R/ncu-raw.csv \
    python3 -m benchmarks.simulators.ncu_run launches $R/order.json > $R/ncu-launches.log 2>&1
rc=$?; echo "ncu rc=$rc"; grep -m5 "ERROR" $R/ncu-raw.csv $R/ncu-launches.log
if [ $rc -ne 0 ] || grep -q "==ERROR==" $R/ncu-raw.csv; then
    echo "retrying with the contract's metrics only"
    timeout 300 $NCU --profile-from-start off --csv --page raw --metrics "$MC" --log-file $R/ncu-raw.csv \
        python3 -m benchmarks.simulators.ncu_run launches $R/order.json > $R/ncu-launches.log 2>&1; echo "ncu rc=$?"
fi
tail -3 $R/ncu-launches.log

step "timings"
timeout 240 python3 -m benchmarks.simulators.ncu_run time $R/times.json 2>&1 | tail -40
python3 -m benchmarks.simulators.ncu_run collect $R/ncu-raw.csv $R/order.json $R/times.json $R/ncu-${GPU}.json "$(cat $R/ncu-version.txt)"
fi

if want sections; then
step "ncu sections of one course kernel"
timeout 120 $NCU --profile-from-start off -k regex:sum_interleaved_kernel --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --print-details all python3 -m benchmarks.simulators.ncu_run launches /tmp/order2.json > $R/ncu-sections.txt 2>&1
echo "rc=$?"; grep -v "^launched" $R/ncu-sections.txt | head -5
fi

if want profiler; then
step "torch.profiler trace of the training loop"
timeout 120 python3 -m benchmarks.simulators.ncu_run loop $R/${GPU}-profiler-loop.json.gz > $R/${GPU}-profiler-loop.txt 2>&1
echo "rc=$?"; ls -la $R/${GPU}-profiler-loop.json.gz
if [ -n "$NSYS" ]; then
    step "nsys"
    timeout 150 $NSYS profile --trace=cuda,nvtx,osrt --sample=none -o /tmp/loop --force-overwrite true \
        python3 -m benchmarks.simulators.ncu_run loop > /tmp/nsys.log 2>&1; echo "nsys rc=$?"; tail -3 /tmp/nsys.log
    # The nsys that ships inside Nsight Compute may leave the raw .qdstrm unconverted: its
    # importer (QdstrmImporter) sits in the same install.
    if [ ! -f /tmp/loop.nsys-rep ] && [ -f /tmp/loop.qdstrm ]; then
        IMP=$(find "$(dirname "$NSYS")/.." /opt/nvidia -name 'QdstrmImporter*' -type f 2>/dev/null | head -1)
        # it needs libdw, which the machine may have outside the loader's path
        DW=$(find / -xdev -name 'libdw.so.1' 2>/dev/null | head -1)
        echo "importer: ${IMP:-none}, libdw: ${DW:-none}"
        [ -n "$IMP" ] && LD_LIBRARY_PATH=${DW:+$(dirname "$DW"):}${LD_LIBRARY_PATH:-} timeout 90 "$IMP" -i /tmp/loop.qdstrm 2>&1 | tail -3
    fi
    timeout 90 $NSYS stats --report cuda_api_sum,cuda_gpu_kern_sum,osrt_sum /tmp/loop.nsys-rep > $R/${GPU}-profiler-nsys.txt 2>&1
    echo "rc=$?"; head -30 $R/${GPU}-profiler-nsys.txt
fi
fi

if want sanitizer; then
step "compute-sanitizer"
S=$R/${GPU}-sanitizer.txt; : > $S
# The race cases run to the end (a race is no fault), so one process each tool takes them all;
# an out-of-bounds access poisons the CUDA context, so each of those gets its own process.
san() {  # tool, cases...
    local tool=$1; shift
    echo "##### compute-sanitizer --tool $tool --report-api-errors no: $*" >> $S
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 90 $SAN --tool $tool --report-api-errors no \
        python3 -m benchmarks.simulators.ncu_run sanitize "$@" >> $S 2>&1
    echo "##### exit status $?" >> $S
}
RACES="block_sum missing_barrier global_race warp_shift"
san racecheck $RACES
san memcheck $RACES
for c in read_past_end write_past_end shared_overrun; do san memcheck $c; done
grep -c "#####" $S; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard" $S | head -40
fi

step "done"
cp $R/ncu-${GPU}.json $OUT/ 2>/dev/null
tar czf $OUT/ncu-results.tgz -C $OUT results
