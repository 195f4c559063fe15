"""How long ``utils.profile`` takes in the CPU emulator (no GPU needed).

    python -m benchmarks.simulators.profile_speed   # prints, and writes results/simulators/profile-speed.json

Measures, each as the best of a few runs, one profiled launch (the launch, the counters, the
source lines, the sentences and the trace) of:
* an elementwise kernel over 2**16 floats (256 blocks of 256 threads),
* a naive and a shared-memory (padded) transpose of a 256x256 matrix (64 blocks of 32x8 threads);
and, once, the cold start: building the profiling variant of a new source (g++) and asking NVRTC
for its registers. Target on a 2-core machine: 2 s per profiled launch, cold start excluded.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("COURSE_SIMULATE", "1")  # the emulator, even on a machine with a GPU

import torch  # noqa: E402

import utils  # noqa: E402
from benchmarks.simulators.emulator_speed import ELEMENTWISE, best  # noqa: E402

TRANSPOSE = r"""
#define TILE 32
#define ROWS 8
__global__ void transpose_naive(const float* x_ptr, float* y_ptr, int n) {
    int col = blockIdx.x * TILE + threadIdx.x, row = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS) y_ptr[col * n + row + j] = x_ptr[(row + j) * n + col];
}
__global__ void transpose_shared(const float* x_ptr, float* y_ptr, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int col = blockIdx.x * TILE + threadIdx.x, row = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS) tile[threadIdx.y + j][threadIdx.x] = x_ptr[(row + j) * n + col];
    __syncthreads();
    col = blockIdx.y * TILE + threadIdx.x;
    row = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS) y_ptr[(row + j) * n + col] = tile[threadIdx.x][threadIdx.y + j];
}
"""
TARGET_S = 2.0


def main():
    if not utils.SIMULATE:
        raise SystemExit("run with COURSE_SIMULATE=1: this measures the CPU emulator")
    results = {}
    n = 1 << 16
    x, y = torch.randn(n), torch.empty(n)
    ew = utils.cuda_kernel(ELEMENTWISE + f"\n// {uuid.uuid4()}\n", "scale_kernel")
    t = time.perf_counter()
    ew.profile[n // 256, 256](x, y, 2.0, n)  # builds the profiling variant, asks NVRTC for registers
    cold = time.perf_counter() - t
    assert torch.equal(y, 2 * x)
    results["elementwise_2e16_s"] = best(lambda: ew.profile[n // 256, 256](x, y, 2.0, n), repeat=3)
    m = 256
    a, b = torch.randn(m, m), torch.empty(m, m)
    for name in ("transpose_naive", "transpose_shared"):
        k = utils.cuda_kernel(TRANSPOSE, name)
        k.profile[(m // 32, m // 32), (32, 8)](a, b, m)
        assert torch.equal(b, a.t())
        results[f"{name}_256_s"] = best(lambda: k.profile[(m // 32, m // 32), (32, 8)](a, b, m), repeat=3)
    plain = best(lambda: ew[n // 256, 256](x, y, 2.0, n))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    record = {
        "commit": head.stdout.strip() or None,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_1min": round(os.getloadavg()[0], 2),
                    "python": platform.python_version(), "torch": torch.__version__},
        "profiled_launch_s": {k: round(v, 4) for k, v in results.items()},
        "cold_start_s": round(cold, 4),
        "elementwise_2e16_plain_launch_s": round(plain, 4),
        "target_s": TARGET_S,
        "met": all(v <= TARGET_S for v in results.values()),
    }
    for k, v in results.items():
        print(f"{k:26s} {v * 1000:8.1f} ms   target {TARGET_S * 1000:.0f} ms   {'ok' if v <= TARGET_S else 'SLOW'}")
    print(f"{'cold start (g++ + NVRTC)':26s} {cold * 1000:8.1f} ms")
    print(f"{'elementwise, not profiled':26s} {plain * 1000:8.1f} ms")
    out_path = utils.SIMULATOR_RESULTS_DIR / "profile-speed.json"
    out_path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out_path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
