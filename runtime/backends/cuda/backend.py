"""The CUDA C++ backend behind `runtime.backends.Backend`: ``utils.cuda_kernel`` kernels, run by
the emulator in simulation (``_emulator.py``, races in ``_racecheck.py``) and by the driver
on a GPU (``_gpu.py``); profiled by ``_profile.py``."""
from __future__ import annotations

from .. import launches
from . import CudaKernel
from . import race_detection as _race_detection

__all__ = ["BACKEND", "CudaBackend"]

# Every launch, emulated or on a GPU, and every profiled launch goes through these two methods
# (a profiled run is never part of a CUDA Graph's capture: it runs at once).
launches.record_method(CudaKernel, "_launch", "cuda", lambda k: k.name)
launches.record_method(CudaKernel, "_profile_run", "cuda", lambda k: k.name, captured=False)


class CudaBackend:
    name = "cuda"
    title = "CUDA C++ (utils.cuda_kernel)"

    def owns(self, kernel) -> bool:
        return isinstance(kernel, CudaKernel)

    def launch(self, kernel, grid, block, *args, shared: int = 0):
        return kernel[grid, block, shared](*args)

    def race_detection(self, enabled: bool = True):
        return _race_detection(enabled)

    def profile(self, kernel, grid, *args, shared: int = 0, **kwargs):
        if kwargs:
            raise TypeError(f"profile() of a CUDA C++ kernel takes grid, block, the kernel's arguments and shared=; "
                            f"got unexpected keyword arguments {sorted(kwargs)}")
        if not args:
            raise TypeError(f"profile({kernel.name}, grid, block, *args): the block size is missing")
        return kernel.profile[grid, args[0], shared](*args[1:])


BACKEND = CudaBackend()
