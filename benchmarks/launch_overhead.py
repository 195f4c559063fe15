"""What one kernel launch costs the host, on a GPU: the Python time from the call to the
launch being queued, for the course's launchers and PyTorch.

    python benchmarks/launch_overhead.py            # prints and writes benchmarks/results/launch-overhead.json
    python benchmarks/launch_overhead.py --out DIR

A kernel on one element takes the GPU about 2 us; launched back to back, the host is the
bottleneck whenever it takes longer than that to queue the next launch. So the wall time
of many launches divided by their number is the per-launch host cost. Each figure is the
median of several batches of launches, measured between two synchronisations.

``utils.cuda_kernel`` launches through the driver's cuLaunchKernel, called with ctypes; the
``cuda.core`` row is the same kernel through ``cuda.core.launch`` (COURSE_CUDA_LAUNCH=core
selects that path for the whole course).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import utils  # noqa: E402

SCALE = r"""
__global__ void scale_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = a * x_ptr[i];
}
"""
LAUNCHES, BATCHES = 2000, 7


def per_launch_us(fn) -> dict:
    for _ in range(200):  # warm-up: compile, caches, allocator
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(BATCHES):
        t = time.perf_counter()
        for _ in range(LAUNCHES):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / LAUNCHES * 1e6)
    times.sort()
    return dict(median_us=round(statistics.median(times), 2), min_us=round(times[0], 2),
                max_us=round(times[-1], 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(utils.RESULTS_DIR))
    args = p.parse_args(argv)
    if utils.SIMULATE:
        print(f"This measures launches on a GPU; this machine runs in simulation ({utils.REASON}). "
              "The recorded numbers are in benchmarks/results/launch-overhead.json.")
        return 2
    from utils.backends.cuda import _gpu

    import triton
    import triton.language as tl
    from numba import cuda

    x = torch.randn(1, device="cuda")
    y = torch.empty_like(x)
    k = utils.cuda_kernel(SCALE, "scale_kernel")
    k[1, 32](x, y, 2.0, 1)
    torch.cuda.synchronize()
    assert torch.equal(y, 2 * x), "the CUDA C++ kernel gave a wrong result"

    @triton.jit
    def scale_triton(x_ptr, y_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, a * tl.load(x_ptr + offs, mask=mask), mask=mask)

    @cuda.jit
    def scale_numba(x, y, a):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = a * x[i]

    xn, yn = utils.to_numba(x), utils.to_numba(y)
    stream = utils.numba_stream()

    rows = {}
    direct = _gpu._DIRECT
    rows["cuda_kernel (cuLaunchKernel via ctypes)"] = per_launch_us(lambda: k[1, 32](x, y, 2.0, 1))
    _gpu._DIRECT = False
    rows["cuda_kernel (cuda.core.launch)"] = per_launch_us(lambda: k[1, 32](x, y, 2.0, 1))
    _gpu._DIRECT = direct
    rows["triton kernel[grid](...)"] = per_launch_us(lambda: scale_triton[(1,)](x, y, 2.0, 1, BLOCK=32))
    rows["numba kernel[grid, block, stream](...)"] = per_launch_us(lambda: scale_numba[1, 32, stream](xn, yn, 2.0))
    rows["torch.mul(x, 2.0, out=y)"] = per_launch_us(lambda: torch.mul(x, 2.0, out=y))
    # Where a Numba launcher's time goes: the conversion of each tensor, a launch of seven
    # arguments, and LayerNorm's whole launcher on one short row (its checks, three
    # torch.empty, six conversions and the launch). LayerNorm's Numba versions take 0.40-0.48
    # ms at every shape recorded, from 33 MB to 537 MB: the host, not the GPU, sets that time.
    rows["utils.to_numba(t)"] = per_launch_us(lambda: utils.to_numba(x))
    rows["numba kernel[grid, block](...) with utils.to_numba(x), utils.to_numba(y) each call"] = per_launch_us(
        lambda: scale_numba[1, 32](utils.to_numba(x), utils.to_numba(y), 2.0))
    from kernels.numba import layernorm as ln_numba
    xr, w, b = torch.randn(1, 32, device="cuda"), torch.ones(32, device="cuda"), torch.zeros(32, device="cuda")
    yr, mean, rstd = torch.empty_like(xr), torch.empty(1, device="cuda"), torch.empty(1, device="cuda")
    ln_args = [utils.to_numba(t) for t in (xr, w, b, yr, mean, rstd)] + [np.float32(1e-5)]
    ln_threads = ln_numba._warps(ln_numba.cdiv(32, ln_numba.ITEMS))
    rows["numba layernorm_reg_kernel[1, 32](7 arguments, converted once)"] = per_launch_us(
        lambda: ln_numba.layernorm_reg_kernel[1, ln_threads](*ln_args))
    rows["kernels.numba.layernorm.layernorm(x, w, b) on 1 x 32 (the whole launcher)"] = per_launch_us(
        lambda: ln_numba.layernorm(xr, w, b))
    data = dict(
        gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), **utils.source_commit(), direct_launch_available=direct,
        method=f"wall time of {LAUNCHES} back-to-back calls (a launch of a 1-element kernel, or the "
               f"named step alone) between two synchronisations, divided by {LAUNCHES}; median (min, max) "
               f"of {BATCHES} batches",
        per_launch=rows,
    )
    for name, r in rows.items():
        print(f"{name:<80} {r['median_us']:7.2f} us  (min {r['min_us']:.2f}, max {r['max_us']:.2f})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch-overhead.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out / 'launch-overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
