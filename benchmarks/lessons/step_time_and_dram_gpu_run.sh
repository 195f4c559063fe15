#!/usr/bin/env bash
# Lessons 06 and 08 on the GPU machine, from the repository root, results under $OUT (they
# belong in benchmarks/results/lessons/):
# step time with and without print(loss), Nsight Systems stats of the training loop, and the
# DRAM bytes of every matmul version (ncu). Arg 1: a folder holding libdw.so.1/libelf.so.1
# (Nsight Systems' importer needs them; the GPU image lacks them).
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
GPU=$(python3 -c "import torch; from utils.bench import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")  # h200 on an H200: the files' stem
DW=${1:-}
BIN=$(dirname "$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)")
NSYS=$(find /usr/local /opt -name nsys -type f -perm -u+x 2>/dev/null | head -1)
echo "ncu: $BIN/ncu nsys: ${NSYS:-none}"
echo "--- step time"; timeout 90 python3 -m benchmarks.lessons.step_time_and_dram steptime $OUT/${GPU}-print-loss.json 2>/dev/null
echo "--- nsys"
if [ -n "$NSYS" ]; then
    export LD_LIBRARY_PATH=${DW:+$DW:}${LD_LIBRARY_PATH:-}
    timeout 100 $NSYS profile --trace=cuda,osrt --sample=none -o /tmp/loop --force-overwrite true \
        python3 -m benchmarks.simulators.ncu_run loop > /tmp/nsys.log 2>&1; echo "nsys rc=$?"; tail -4 /tmp/nsys.log
    ls /tmp/loop* 
    if [ ! -f /tmp/loop.nsys-rep ] && [ -f /tmp/loop.qdstrm ]; then
        IMP=$(find "$(dirname "$NSYS")/.." /opt/nvidia -name 'QdstrmImporter*' -type f 2>/dev/null | head -1)
        echo "importer $IMP"; [ -n "$IMP" ] && timeout 60 "$IMP" -i /tmp/loop.qdstrm 2>&1 | tail -3
    fi
    { echo "# nsys profile --trace=cuda,osrt python3 -m benchmarks.simulators.ncu_run loop; nsys stats, commit ${COURSE_COMMIT:-unknown}";
      timeout 60 $NSYS stats --report cuda_api_sum,cuda_gpu_kern_sum /tmp/loop.nsys-rep 2>&1; } > $OUT/${GPU}-profiler-nsys.txt
    echo "rc=$?"; head -40 $OUT/${GPU}-profiler-nsys.txt
fi
echo "--- ncu dram bytes"
timeout 170 $BIN/ncu --profile-from-start off --csv --page raw \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum --log-file /tmp/dram.csv \
    python3 -m benchmarks.lessons.step_time_and_dram dram > /tmp/dram.log 2>&1; echo "ncu rc=$?"; tail -20 /tmp/dram.log
python3 -m benchmarks.lessons.step_time_and_dram collect /tmp/dram.csv /tmp/dram-order.json $OUT/${GPU}-matmul-dram.json
cp /tmp/dram.csv $OUT/dram-raw.csv 2>/dev/null; true
