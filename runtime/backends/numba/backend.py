"""The Numba backend behind `runtime.backends.Backend`: ``numba.cuda.jit`` kernels, run by
Numba's CUDA simulator with the course's scheduler (``simulator.py``) and race detector
(``races.py``) in simulation, by numba-cuda's dispatcher on a GPU; profiled in simulation
by ``profile.py``."""
from __future__ import annotations

import sys

from ...config import SIMULATE
from .. import launches
from .._simulated import SimulatedBackend
from . import races, simulator

__all__ = ["BACKEND", "NumbaBackend"]


def _name(k) -> str:
    fn = getattr(k, "py_func", None) or getattr(k, "fn", None)
    return getattr(fn, "__name__", None) or getattr(k, "__name__", "kernel")


def _skip_simulated(k, *args, **kwargs) -> bool:
    """A device function's call, or a call from inside a simulated kernel: not a launch."""
    from numba.cuda.simulator import kernel as K
    return k._device or K._kernel_context is not None


def _locate_launch():
    """Where launches happen: the simulator's ``FakeCUDAKernel.__call__`` (a configured kernel
    called from the host, not a device function), or on a GPU ``CUDADispatcher.call``, which
    every ``kernel[grid, block](...)`` of numba-cuda reaches. None while there is nothing to
    hook yet (on a GPU, until a notebook imports ``numba.cuda``)."""
    if simulator.is_applied():
        from numba.cuda.simulator import kernel
        return kernel.FakeCUDAKernel, "__call__", "numba", _name, _skip_simulated, simulator.on_torch_stream
    if not SIMULATE:
        dispatcher = sys.modules.get("numba.cuda.dispatcher")  # imported with numba.cuda
        if dispatcher is None or not hasattr(dispatcher, "CUDADispatcher"):
            return None
        return dispatcher.CUDADispatcher, "call", "numba", _name, None
    return None


launches.register_hook("Numba's launch path", _locate_launch)


def _locate_copy():
    """Where a device array is copied to the host: ``copy_to_host`` of the simulator's
    ``FakeCUDAArray``, or of numba-cuda's ``DeviceNDArrayBase`` on a GPU."""
    if simulator.is_applied():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray, "copy_to_host"
    devicearray = sys.modules.get("numba.cuda.cudadrv.devicearray")
    if not SIMULATE and devicearray is not None and hasattr(devicearray, "DeviceNDArrayBase"):
        return devicearray.DeviceNDArrayBase, "copy_to_host"
    return None


launches.register_copy_hook(_locate_copy)


class NumbaBackend(SimulatedBackend):
    name = "numba"
    title = "Numba (numba.cuda.jit)"
    races = races

    def launch(self, kernel, grid, block, *args, shared: int = 0):
        return kernel[grid, block, 0, shared](*args)

    def _profile_module(self):
        from . import profile
        return profile

    def profile(self, kernel, grid, *args, shared: int = 0, **kwargs):
        from ..profile_report import from_counts
        counters = self.counters()
        if not args:
            raise TypeError("profile(numba_kernel, grid, block, *args): the block size is missing")
        return from_counts(counters.profile_numba(kernel, grid, args[0], *args[1:], shared=shared, **kwargs),
                           kernel, "numba")


BACKEND = NumbaBackend()
