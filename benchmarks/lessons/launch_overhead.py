"""What one kernel launch costs the host, on a GPU: the Python time from the call to the
launch being queued, for the course's launchers and PyTorch.

    python -m benchmarks.lessons.launch_overhead            # prints and writes launch-overhead.json
    python -m benchmarks.lessons.launch_overhead --out DIR  # (default DIR: benchmarks/results/lessons)

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

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
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
LAUNCHES, BATCHES = 500, 5


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


def _per_call_us(fn, n: int, reps: int, wait: bool) -> float:
    """Microseconds per call of ``fn``: ``n`` calls back to back after a synchronisation, until
    the last call returns (``wait=False``) or until the GPU finishes them (``wait``); median of
    ``reps``."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if wait:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(times), 2)


def host_us(fn, n: int = 30, reps: int = 7) -> float:
    """Microseconds of host time per call of ``fn``: ``n`` calls back to back after a
    synchronisation (few enough that the launch queue never fills), median of ``reps``."""
    return _per_call_us(fn, n, reps, wait=False)


def loop_us(fn, n: int = 100, reps: int = 5) -> float:
    """Microseconds per call of ``fn`` in a loop, as a program sees it: the wall time of ``n``
    calls back to back, from one synchronisation to the next, over ``n``; median of ``reps``.
    The larger of the host's time per call and the GPU's."""
    return _per_call_us(fn, n, reps, wait=True)


def graph_of(call, n: int = 1):
    """A CUDA graph of ``n`` calls of ``call`` (``torch.cuda.graph``, warmed up on a side stream
    as it asks): its replay runs their kernels without their host time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            call()
    torch.cuda.synchronize()
    return graph


def graph_vs_eager(call, n: int = 20, reps: int = 20) -> dict:
    """Microseconds per call of ``call`` run ``n`` times back to back from Python, and of the
    same ``n`` calls captured once in a CUDA graph (``torch.cuda.graph``) and replayed: a
    replay is one launch for the host, whatever the number of kernels inside."""
    graph = graph_of(call, n)

    def wall(fn):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) / n * 1e6)
        return round(statistics.median(times), 2)

    def eager():
        for _ in range(n):
            call()

    def host_only():  # the host's time to issue the n calls, not waiting for the GPU
        t = time.perf_counter()
        eager()
        return time.perf_counter() - t

    eager_us = wall(eager)
    graph_us = wall(graph.replay)
    torch.cuda.synchronize()
    issue = []
    for _ in range(5):
        issue.append(host_only() / n * 1e6)
        torch.cuda.synchronize()
    return dict(calls=n, eager_us_per_call=eager_us, graph_us_per_call=graph_us,
                host_issue_us_per_call=round(statistics.median(issue), 2))


def reference_launchers():
    """(name, function) of every reference launcher of the benchmarked topics, in each language,
    with its inputs: the smallest awkward shape of the topic's spec, on the GPU."""
    import kernels
    from benchmarks.harness import CheckCase
    from benchmarks.topics import TOPICS, check_shapes

    out = []
    for topic in TOPICS:
        shape = min(check_shapes(topic, False), key=lambda s: float(np.prod(s)))
        try:
            case = CheckCase(topic, shape, seed=0)
        except Exception as e:
            print(f"{topic}: no inputs ({e})")
            continue
        for lang in kernels.LANGUAGES:
            try:
                mod = kernels.module(topic, lang)
                fn = mod.VERSIONS[mod.REFERENCE][1]
            except Exception:
                continue
            out.append((f"{lang} {topic} {mod.REFERENCE} at {'x'.join(map(str, shape))}",
                        (lambda fn=fn, a=case.inputs: fn(*a))))
    # LayerNorm's backward and RMSNorm launchers
    from utils.topics.layernorm import layernorm_input
    x, w, b = layernorm_input((4, 512), seed=0, device="cuda")
    dy = torch.randn_like(x)
    for lang in kernels.LANGUAGES:
        mod = kernels.module("layernorm", lang)
        _, mean, rstd = mod.layernorm(x, w, b, stats=True)
        _, r = mod.rmsnorm(x, w, stats=True)
        out.append((f"{lang} layernorm_backward at 4x512",
                    lambda m=mod, mean=mean, rstd=rstd: m.layernorm_backward(dy, x, w, mean, rstd)))
        out.append((f"{lang} rmsnorm at 4x512", lambda m=mod: m.rmsnorm(x, w)))
        out.append((f"{lang} rmsnorm_backward at 4x512", lambda m=mod, r=r: m.rmsnorm_backward(dy, x, w, r)))
    return out


def measure_all() -> dict:
    """Every row of the record: bare launches, the steps of a Numba launch, every reference launcher."""
    from runtime.backends.cuda import _gpu

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
    fast = utils.NumbaLauncher(scale_numba)
    fast(1, 32, x, y, np.float32(2.0))
    fast(1, 32, x, y, np.float32(3.0))
    torch.cuda.synchronize()
    assert torch.equal(y, 3 * x), "utils.NumbaLauncher gave a wrong result"

    rows = {}
    direct = _gpu._DIRECT
    rows["cuda_kernel (cuLaunchKernel via ctypes)"] = per_launch_us(lambda: k[1, 32](x, y, 2.0, 1))
    _gpu._DIRECT = False
    rows["cuda_kernel (cuda.core.launch)"] = per_launch_us(lambda: k[1, 32](x, y, 2.0, 1))
    _gpu._DIRECT = direct
    rows["triton kernel[grid](...)"] = per_launch_us(lambda: scale_triton[(1,)](x, y, 2.0, 1, BLOCK=32))
    rows["numba kernel[grid, block, stream](...)"] = per_launch_us(lambda: scale_numba[1, 32, stream](xn, yn, 2.0))
    rows["utils.NumbaLauncher(kernel)(grid, block, x, y, a) with torch tensors"] = per_launch_us(
        lambda: fast(1, 32, x, y, np.float32(2.0)))
    rows["torch.mul(x, 2.0, out=y)"] = per_launch_us(lambda: torch.mul(x, 2.0, out=y))
    rows["torch.empty_like(x)"] = per_launch_us(lambda: torch.empty_like(x))
    rows["utils.to_numba(t)"] = per_launch_us(lambda: utils.to_numba(x))
    rows["numba kernel[grid, block](...) with utils.to_numba(x), utils.to_numba(y) each call"] = per_launch_us(
        lambda: scale_numba[1, 32](utils.to_numba(x), utils.to_numba(y), 2.0))
    for name, fn in reference_launchers():
        try:
            rows[f"launcher: {name}"] = per_launch_us(fn)
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {e}")
    for name, r in rows.items():
        print(f"{name:<80} {r['median_us']:7.2f} us  (min {r['min_us']:.2f}, max {r['max_us']:.2f})", flush=True)
    return dict(rows=rows, direct_launch_available=direct)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(utils.LESSON_RESULTS_DIR))
    args = p.parse_args(argv)
    if utils.SIMULATE:
        print(f"This measures launches on a GPU; this machine runs in simulation ({utils.REASON}). "
              "The recorded numbers are in benchmarks/results/lessons/launch-overhead.json.")
        return 2
    import kernels
    from utils.topics.layernorm import layernorm_input

    import triton

    measured = measure_all()
    # LayerNorm at 4096 x 4096 (128 MB, about 45 us of copy): launched one by one from Python,
    # then 20 launches captured in a CUDA graph and replayed (Numba launches on torch's stream).
    x, w, b = layernorm_input((4096, 4096), seed=0, device="cuda")
    graphs = {}
    for lang in kernels.LANGUAGES:
        f = kernels.get("layernorm", lang)
        try:
            graphs[f"{lang} layernorm 4096x4096"] = graph_vs_eager(lambda f=f: f(x, w, b))
        except Exception as e:
            graphs[f"{lang} layernorm 4096x4096"] = dict(error=f"{type(e).__name__}: {e}")
        print(lang, graphs[f"{lang} layernorm 4096x4096"], flush=True)
    data = dict(
        gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), **utils.source_commit(),
        direct_launch_available=measured["direct_launch_available"],
        method=f"wall time of {LAUNCHES} back-to-back calls (a launch of a 1-element kernel, a named step "
               f"alone, or a reference launcher on the smallest awkward input of its topic) between two "
               f"synchronisations, divided by {LAUNCHES}; median (min, max) of {BATCHES} batches",
        per_launch=measured["rows"],
        graphs=graphs,
        graphs_method="graph_vs_eager: wall time per call of 20 calls issued from Python, against one replay of "
                      "the same 20 calls captured with torch.cuda.graph; median of 20 repetitions",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch-overhead.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out / 'launch-overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
