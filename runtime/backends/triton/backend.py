"""The Triton backend behind `runtime.backends.Backend`: ``triton.jit`` kernels, run by
Triton's interpreter with the course's patches (``interpreter.py``: races, poison, its
driver) in simulation and by Triton on a GPU; ``compat.py`` holds what works in both modes
(``tanh``, ``do_bench``, ``autotune``)."""
from __future__ import annotations

import sys

from ...config import SIMULATE
from .. import launches
from .._simulated import SimulatedBackend
from . import interpreter

__all__ = ["BACKEND", "TritonBackend"]


def _name(k) -> str:
    return getattr(getattr(k, "fn", None), "__name__", None) or getattr(k, "__name__", "kernel")


def _warmup(k, *args, **kwargs) -> bool:
    return bool(kwargs.get("warmup"))  # kernel.warmup(...) compiles, it does not launch


def _locate_launch():
    """Where launches happen: ``run``, which ``kernel[grid](...)``, autotuners and heuristics all
    reach (``InterpretedFunction.run`` in the interpreter, ``JITFunction.run`` on a GPU). None
    while there is nothing to hook yet."""
    if interpreter.is_applied():
        cls = getattr(sys.modules.get("triton.runtime.interpreter"), "InterpretedFunction", None)
    elif not SIMULATE:
        cls = getattr(sys.modules.get("triton.runtime.jit"), "JITFunction", None)  # imported with triton
    else:
        return None
    return None if cls is None else (cls, "run", "triton", _name, _warmup)


launches.register_hook("Triton's launch path", _locate_launch)


class TritonBackend(SimulatedBackend):
    name = "triton"
    title = "Triton (triton.jit)"
    races = interpreter

    def launch(self, kernel, grid, *args, **meta):
        return kernel[grid](*args, **meta)

    def _profile_module(self):
        from . import profile
        return profile

    def profile(self, kernel, grid, *args, shared: int = 0, **kwargs):
        from ..profile_report import from_counts
        counters = self.counters()
        return from_counts(counters.profile_triton(kernel, grid, *args, **kwargs), kernel, "triton")


BACKEND = TritonBackend()
