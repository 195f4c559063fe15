"""The Triton backend behind `utils.backends.Backend`: ``triton.jit`` kernels, run by
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


def _hook_launches() -> bool:
    """Record launches at ``run``, which ``kernel[grid](...)``, autotuners and heuristics all
    reach: ``InterpretedFunction.run`` in the interpreter, ``JITFunction.run`` on a GPU.
    False while there is nothing to hook yet."""
    if interpreter.is_applied():
        cls = getattr(sys.modules.get("triton.runtime.interpreter"), "InterpretedFunction", None)
    elif not SIMULATE:
        cls = getattr(sys.modules.get("triton.runtime.jit"), "JITFunction", None)  # imported with triton
    else:
        return False
    if cls is None:
        return False
    launches.record_method(cls, "run", "triton", _name, _warmup)
    return True


launches.install_hooks_on_record(_hook_launches)


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
