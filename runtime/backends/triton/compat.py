"""Triton features that exist only on a GPU, made to work in Triton's interpreter too.

Triton's interpreter (``TRITON_INTERPRET=1``, what the course uses without a GPU) runs a
kernel's programs one after another with NumPy. GPU-side features fail there; libdevice
(``tl.extra.cuda.libdevice.tanh`` and friends) is given NumPy twins by ``libdevice.py``,
and the others have a stand-in here:

* :func:`tanh` from ``tl.exp``, written before the interpreter had libdevice, and still a
  worked example of a numerically careful formula.
* ``triton.testing.do_bench``: needs a GPU driver ("0 active drivers"). Time kernels with
  ``utils.bench``, which labels CPU timings as simulated. :func:`do_bench` below keeps the
  signature for code written against Triton's, and warns that its numbers are CPU times.
* ``@triton.autotune``: benchmarks every config with ``do_bench``, so it fails the same
  way. :func:`autotune` below is ``triton.autotune`` on a GPU and, in simulation, simply
  runs the first config (list the one you want simulated first).

Everything here behaves the same in both modes, so a kernel written with it runs
unchanged on an H100 and on a laptop.
"""
from __future__ import annotations

import time
import warnings

from ...config import SIMULATE

import triton
import triton.language as tl

__all__ = ["tanh", "do_bench", "autotune"]


@triton.jit
def tanh(x):
    """tanh(x) in float32 from ``tl.exp``: runs on a GPU and in the interpreter.

    ``tanh(|x|) = (1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` never overflows (e <= 1)
    and is within about 1e-7 of the true value. Near 0, ``1 - e`` loses the relative
    accuracy a tiny ``x`` deserves, so |x| < 1/16 uses the series
    ``x - x^3/3 + 2x^5/15`` (its next term is below 4e-10 there).
    """
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0)))
    t = tl.where(ax < 0.0625, small, tl.where(x < 0, -big, big))
    return tl.where(x != x, x, t)  # NaN stays NaN


def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
    """``triton.testing.do_bench`` on a GPU; in simulation, CPU wall-clock times of ``fn``.

    Same arguments and return value (milliseconds; a list if ``quantiles`` is given).
    In simulation the time is that of the interpreter on the CPU: a warning says so, and
    it says nothing about the GPU. Prefer ``utils.bench``, which labels it in its output.
    """
    if not SIMULATE:
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                       quantiles=quantiles, return_mode=return_mode)
    warnings.warn("do_bench in simulation: these are CPU times of Triton's interpreter, "
                  "not GPU timings (utils.bench labels them, and shows recorded H100 numbers)",
                  stacklevel=2)
    fn()  # warm-up: the first call also does the one-time setup
    times, budget_s, start = [], max(rep, 1) / 1000.0, time.perf_counter()
    while not times or (time.perf_counter() - start < budget_s and len(times) < 100):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    times.sort()

    def quantile(q):
        pos = q * (len(times) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(times) - 1)
        return times[lo] + (times[hi] - times[lo]) * (pos - lo)

    if quantiles is not None:
        out = [quantile(q) for q in quantiles]
        return out[0] if len(out) == 1 else out
    return {"mean": sum(times) / len(times), "median": quantile(0.5), "min": times[0],
            "max": times[-1], "all": times}[return_mode]


class _FirstConfig:
    """What ``autotune`` returns in simulation: launches with the first config only."""

    def __init__(self, fn, configs):
        self.fn = fn
        self.configs = list(configs)
        self.best_config = self.configs[0]
        self.arg_names = list(getattr(fn, "arg_names", []))

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            config = self.best_config
            consts = dict(config.kwargs)
            meta = {**dict(zip(self.arg_names, args)), **kwargs, **consts}
            g = grid(meta) if callable(grid) else grid
            extra = {k: getattr(config, k) for k in ("num_warps", "num_stages")
                     if getattr(config, k, None) is not None}
            return self.fn[g](*args, **kwargs, **consts, **extra)
        return launch

    def run(self, *args, grid, **kwargs):
        return self[grid](*args, **kwargs)


def autotune(configs, key, **kwargs):
    """``triton.autotune`` on a GPU; in simulation, the first of ``configs``, untimed."""
    if not SIMULATE:
        return triton.autotune(configs=configs, key=key, **kwargs)
    if not configs:
        raise ValueError("autotune needs at least one triton.Config")

    def decorator(fn):
        return _FirstConfig(fn, configs)
    return decorator
