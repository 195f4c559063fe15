"""How fast the CUDA C++ emulator is on this machine (no GPU needed).

    python -m benchmarks.simulators.emulator_speed   # prints, and writes results/simulators/emulator-speed.json

Measures, each as the best of a few runs:
* an elementwise kernel over 2**20 floats (one launch of 4096 blocks of 256 threads),
* a 256-thread shared-memory tree reduction over 2**20 floats (9 barriers per block),
* compiling a kernel source: cold (a source never seen, so g++ runs) and cached.
The results are with the race detector on (the default in simulation); the two kernels are
also measured with it off (``utils.race_detection(False)``), and the ratio is recorded: the
detector may cost at most 3x.
Targets on a 2-core machine: <= 0.3 s, <= 1.5 s, <= 2 s cold and <= 50 ms cached.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))
os.environ.setdefault("COURSE_SIMULATE", "1")  # the emulator, even on a machine with a GPU

import torch  # noqa: E402
from cuda_sources import TREE_SUM  # noqa: E402  (tests/cuda_sources.py)

import utils  # noqa: E402

ELEMENTWISE = r"""
__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""
REDUCTION = TREE_SUM + r"""
__global__ void sum_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float s[256];
    float total = block_tree_sum(x, s, n);
    if (threadIdx.x == 0) atomicAdd(out, total);
}
"""
TARGETS = {"elementwise_2e20_s": 0.3, "reduction_2e20_s": 1.5, "compile_cold_s": 2.0, "compile_cached_s": 0.05}


def best(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure_kernels():
    n = 1 << 20
    x = torch.randn(n)
    y = torch.empty(n)
    out = torch.zeros(1)
    ew = utils.cuda_kernel(ELEMENTWISE, "scale_kernel")
    red = utils.cuda_kernel(REDUCTION, "sum_kernel")
    ew[n // 256, 256](x, y, 2.0, n)
    assert torch.equal(y, 2 * x)
    red[n // 256, 256](x, out, n)
    torch.testing.assert_close(out.double(), x.double().sum().reshape(1), rtol=1e-4, atol=1e-2)
    return {
        "elementwise_2e20_s": best(lambda: ew[n // 256, 256](x, y, 2.0, n)),
        "reduction_2e20_s": best(lambda: red[n // 256, 256](x, out, n), repeat=3),
    }


def main():
    if not utils.SIMULATE:
        raise SystemExit("run with COURSE_SIMULATE=1: this measures the CPU emulator")
    results = measure_kernels()
    with utils.race_detection(False):
        unchecked = measure_kernels()

    def cold():
        utils.cuda_kernel(ELEMENTWISE + f"\n// {uuid.uuid4()}\n", "scale_kernel")
    results["compile_cold_s"] = best(cold, repeat=3)
    results["compile_cached_s"] = best(lambda: utils.cuda_kernel(ELEMENTWISE, "scale_kernel"), repeat=20)
    # the portable fiber switch (what arm64 machines use), for comparison
    os.environ["COURSE_EMU_UCONTEXT"] = "1"
    portable = measure_kernels()
    del os.environ["COURSE_EMU_UCONTEXT"]
    fast = "x86-64 assembly" if platform.machine() in ("x86_64", "AMD64") else "ucontext"
    import subprocess
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    record = {
        "commit": head.stdout.strip() or None,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_1min": round(os.getloadavg()[0], 2),
                    "python": platform.python_version(), "torch": torch.__version__, "context_switch": fast},
        "results_s": {k: round(v, 4) for k, v in results.items()},
        "race_detection_off_results_s": {k: round(v, 4) for k, v in unchecked.items()},
        "race_detection_cost_x": {k: round(results[k] / unchecked[k], 2) for k in unchecked},
        "portable_ucontext_results_s": {k: round(v, 4) for k, v in portable.items()},
        "targets_s": TARGETS,
        "met": {k: results[k] <= TARGETS[k] for k in TARGETS},
    }
    for k, v in results.items():
        verdict = "ok" if v <= TARGETS[k] else "SLOW"
        print(f"{k:22s} {v * 1000:9.1f} ms   target {TARGETS[k] * 1000:7.0f} ms   {verdict}")
    for k, v in unchecked.items():
        print(f"{k:22s} {v * 1000:9.1f} ms   (race detection off: it costs {results[k] / v:.1f}x)")
    for k, v in portable.items():
        print(f"{k:22s} {v * 1000:9.1f} ms   (portable ucontext switch)")
    out_path = utils.SIMULATOR_RESULTS_DIR / "emulator-speed.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out_path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
