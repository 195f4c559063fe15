"""The course's three backends, one package each, behind one small interface.

======================  ===================================================================
``backends/cuda/``      CUDA C++ (``utils.cuda_kernel``, ``utils.load_inline``): the loader,
                        the emulator (``_emulator.py``, ``emu/``), its race detector
                        (``_racecheck.py``), profiler (``_profile.py``), the GPU path
                        (``_gpu.py``) and the toolchain (``_toolchain.py``, NVRTC, g++)
``backends/numba/``     Numba (``numba.cuda.jit``): the simulator's scheduler and warp
                        primitives (``simulator.py``), race detection (``races.py``) and the
                        simulators' profilers (``profile.py``)
``backends/triton/``    Triton (``triton.jit``): the interpreter's patches (``interpreter.py``)
                        and what works in both modes (``compat.py``)
``launches.py``         which kernels and torch operators a call ran (``record_launches``)
``profile_report.py``   `Profile`, the result of profiling one launch on any backend
======================  ===================================================================

Graders, ``utils.profile`` and benchmarks talk to a backend through `Backend`, found with
``backend_of(kernel)``; none of them asks which kind of kernel it holds::

    b = utils.backend_of(kernel)      # b.name: "cuda", "numba" or "triton"
    b.launch(kernel, grid, block, *args)       # Triton: b.launch(kernel, grid, *args, **meta)
    with b.race_detection(False): ...
    p = b.profile(kernel, grid, block, *args)  # a Profile (= utils.profile(...))
    with utils.record_launches() as seen: fn(x)   # seen.kernels, seen.torch_ops
"""
from __future__ import annotations

from typing import ContextManager, Protocol, runtime_checkable

from .cuda.backend import BACKEND as CUDA
from .launches import Launch, Launches, record_launches
from .numba.backend import BACKEND as NUMBA
from .triton.backend import BACKEND as TRITON

__all__ = ["Backend", "BACKENDS", "backend_of", "record_launches", "Launch", "Launches"]


@runtime_checkable
class Backend(Protocol):
    """What the rest of the course may ask of a backend."""

    name: str   # "cuda", "numba", "triton"
    title: str  # for messages: "Triton (triton.jit)"

    def owns(self, kernel) -> bool:
        """Whether ``kernel`` is one of this backend's kernels."""

    def launch(self, kernel, grid, *args, **kwargs):
        """Launch ``kernel`` once: ``(kernel, grid, block, *args)``, Triton ``(kernel, grid, *args, **meta)``."""

    def race_detection(self, enabled: bool = True) -> ContextManager:
        """Check launches inside the ``with`` block for data races, or not (simulation only)."""

    def profile(self, kernel, grid, *args, **kwargs):
        """Run one launch and return its `utils.Profile`."""


BACKENDS: tuple[Backend, ...] = (CUDA, NUMBA, TRITON)


def backend_of(kernel) -> Backend:
    """The backend of a kernel made by ``utils.cuda_kernel``, ``numba.cuda.jit`` or ``triton.jit``."""
    for b in BACKENDS:
        if b.owns(kernel):
            return b
    raise TypeError(f"expected a kernel made by utils.cuda_kernel, numba.cuda.jit or triton.jit, "
                    f"got {type(kernel).__name__}")
