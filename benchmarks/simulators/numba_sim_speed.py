"""How fast Numba's CUDA simulator runs, before and after the course's patch.

    python -m benchmarks.simulators.numba_sim_speed            # about a minute on a 2-core CPU
    python -m benchmarks.simulators.numba_sim_speed --quick    # smaller sizes, no file written

Two kernels, each in a fresh Python process so that the variants cannot influence each
other:

* ``elementwise``: ``out[i] = x[i] + y[i]``, 256 threads per block, no barrier;
* ``tree_reduction``: the 256-thread shared-memory tree of lesson 04 (sequential
  addressing, ``cuda.syncthreads()`` after each of its 9 steps), one atomic per block.

Variants:

* ``stock``: numba-cuda's simulator as installed;
* ``stock_switchinterval``: the same with ``sys.setswitchinterval(1e-4)``, the cheap fix
  that speeds up the stock scheduler's polling loop;
* ``patched``: the course's simulator (``runtime/backends/numba/simulator.py``), as ``import utils``
  sets it up in simulation, race detection (``runtime/backends/numba/races.py``) included;
* ``patched_norace``: the same with race detection off (``COURSE_RACECHECK=0``), to
  show what detection costs (at most 3x is the budget);
* ``patched_unpinned``: the patched simulator without pinning its OS threads to one core
  (``COURSE_NUMBA_SIM_PIN=0``);
* ``patched_switchinterval``: the patched simulator with the short switch interval, to
  show that it no longer helps (it costs, in fact).

Writes ``benchmarks/results/simulators/numba-simulator-speed.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (not runtime.paths.SIMULATOR_RESULTS_DIR: importing the runtime would set up the simulator here)
RESULT = ROOT / "benchmarks" / "results" / "simulators" / "numba-simulator-speed.json"
VARIANTS = ("stock", "stock_switchinterval", "patched", "patched_norace", "patched_unpinned",
            "patched_switchinterval")
THREADS = 256


def _child(variant: str, n_elementwise: int, n_reduction: int, repeats: int) -> dict:
    """Runs in a fresh process: set up the simulator, time both kernels."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if variant.startswith("patched"):
        os.environ["COURSE_SIMULATE"] = "1"
        if variant == "patched_unpinned":
            os.environ["COURSE_NUMBA_SIM_PIN"] = "0"
        if variant == "patched_norace":
            os.environ["COURSE_RACECHECK"] = "0"
        sys.path.insert(0, str(ROOT))
        import runtime
        assert runtime.backends.numba.simulator.is_applied()
    if variant.endswith("switchinterval"):
        sys.setswitchinterval(1e-4)

    # Kernels find `cuda` among their globals, where the simulator swaps in its fake
    # module during a launch, so these names must be module globals, not locals.
    global np, cuda, float32
    import numpy as np

    from numba import cuda, float32

    @cuda.jit
    def add_kernel(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + y[i]

    @cuda.jit
    def tree_sum_kernel(x, out):
        sdata = cuda.shared.array(THREADS, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        sdata[t] = x[i] if i < x.size else float32(0.0)
        cuda.syncthreads()
        s = THREADS // 2
        while s > 0:
            if t < s:
                sdata[t] += sdata[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            cuda.atomic.add(out, 0, sdata[0])

    rng = np.random.default_rng(0)
    out = {}

    def timed(launch, check):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            launch()
            best = min(best, time.perf_counter() - t0)
            check()
        return best

    n = n_elementwise
    x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    z = np.zeros(n, np.float32)
    add_kernel[1, 32](x[:32], y[:32], z[:32])  # warm-up (first launch sets things up)
    grid = (n + THREADS - 1) // THREADS
    s = timed(lambda: add_kernel[grid, THREADS](x, y, z),
              lambda: np.testing.assert_array_equal(z, x + y))
    out["elementwise"] = dict(n=n, threads_per_block=THREADS, seconds=s, threads_per_s=n / s)

    n = n_reduction
    x = rng.random(n, dtype=np.float32)
    total = np.zeros(1, np.float32)
    grid = (n + THREADS - 1) // THREADS

    def launch():
        total[0] = 0
        tree_sum_kernel[grid, THREADS](x, total)

    s = timed(launch, lambda: np.testing.assert_allclose(total[0], x.astype(np.float64).sum(),
                                                         rtol=1e-5))
    launched = grid * THREADS
    out["tree_reduction"] = dict(n=n, threads_per_block=THREADS, barriers_per_thread=9,
                                 seconds=s, threads_per_s=launched / s)
    return out


def _run_variant(variant: str, n_elementwise: int, n_reduction: int, repeats: int) -> dict:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from benchmarks.simulators.numba_sim_speed import _child; import json; "
            f"print(json.dumps(_child({variant!r}, {n_elementwise}, {n_reduction}, {repeats})))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("COURSE_SIMULATE", "COURSE_NUMBA_SIM_PIN", "COURSE_RACECHECK")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; print, write nothing")
    args = ap.parse_args(argv)
    # Sizes the stock simulator gets through in a few seconds (about 10,000 threads/s
    # without barriers, 700/s with them); the patched one also runs the 2^20 elementwise.
    n_elem, n_red = (2048, 512) if args.quick else (1 << 14, 1 << 12)
    # Other processes slow the simulator down (it is CPU-bound): record the load.
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results = {}
    for variant in VARIANTS:
        repeats = 1 if variant.startswith("stock") else 3
        results[variant] = _run_variant(variant, n_elem, n_red, repeats)
        print(variant, {k: f"{v['seconds']:.3f}s ({v['threads_per_s']:,.0f} threads/s)"
                        for k, v in results[variant].items()}, flush=True)
    if not args.quick:
        for variant in ("patched", "patched_norace"):
            big = _run_variant(variant, 1 << 20, 1 << 14, 1)
            results[f"{variant}_large"] = big
            print(f"{variant}_large", {k: f"{v['seconds']:.3f}s" for k, v in big.items()})

    speedup = {k: round(results["stock"][k]["seconds"] / results["patched"][k]["seconds"], 1)
               for k in results["stock"]}
    print("speed-up of patched over stock:", speedup)
    print("race detection cost (patched / patched_norace):",
          {k: round(results["patched"][k]["seconds"] / results["patched_norace"][k]["seconds"], 2)
           for k in results["patched"]})
    if args.quick:
        return 0

    import numba
    try:
        from importlib.metadata import version
        numba_cuda = version("numba-cuda")
    except Exception:
        numba_cuda = "unknown"
    record = {
        "what": "Numba CUDA simulator speed on the CPU, stock vs the course's patch "
                "(runtime/backends/numba/simulator.py); each variant in a fresh process, best of the "
                "repeats (1 for stock, 3 for patched)",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, cwd=ROOT).stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "numba": numba.__version__,
                    "numba_cuda": numba_cuda},
        "command": "python -m benchmarks.simulators.numba_sim_speed",
        "load_average_1min": {"before": load_before,
                              "after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "note": "CPU-bound and sensitive to other load on the machine: compare variants "
                "within one run, not across runs",
        "variants": {
            "stock": "numba-cuda simulator as installed",
            "stock_switchinterval": "stock, with sys.setswitchinterval(1e-4)",
            "patched": "the course's scheduler (import utils in simulation), race detection on",
            "patched_norace": "patched, with race detection off (COURSE_RACECHECK=0)",
            "patched_unpinned": "patched, with COURSE_NUMBA_SIM_PIN=0 (OS threads not pinned)",
            "patched_switchinterval": "patched, with sys.setswitchinterval(1e-4)",
            "patched_large": "patched, 2^20 elements elementwise and 2^14 reduced",
            "patched_norace_large": "patched_norace, 2^20 elements elementwise and 2^14 reduced",
        },
        "results": results,
        "speedup_patched_over_stock": speedup,
        "race_detection_cost": {
            **{k: round(results["patched"][k]["seconds"] / results["patched_norace"][k]["seconds"], 2)
               for k in results["patched"]},
            **{f"{k}_large": round(results["patched_large"][k]["seconds"]
                                   / results["patched_norace_large"][k]["seconds"], 2)
               for k in results["patched_large"]}},
        "speedup_stock_switchinterval_over_stock": {
            k: round(results["stock"][k]["seconds"] / results["stock_switchinterval"][k]["seconds"], 1)
            for k in results["stock"]},
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
