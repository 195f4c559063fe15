"""CUDA C++ kernels from Python, the same way with or without a GPU.

    k = utils.cuda_kernel(source, "relu_kernel")    # CUDA C++ text, or a path to a .cu file
    k[grid, block](x, y, n)                          # tensors pass as pointers
    k[grid, block, shared_bytes](x, y, n)            # with dynamic shared memory

* With a GPU the source is compiled by NVRTC (``cuda.core``) and launched on torch's
  current stream.
* Without one it is compiled by g++ against the course's CPU emulator
  (``runtime/backends/cuda/emu/cuda_emu.h``) and runs on CPU tensors: every thread of a block is a
  fiber, shared memory and barriers behave as on a GPU, and faults become exceptions.

``load_inline`` is torch's ``load_inline`` on a GPU and its emulated twin on a CPU.
``emulation_schedule("random", seed=...)`` runs the threads of each block in a random order
between barriers (it exposes a missing ``__syncthreads()``); it does nothing on a GPU.
``cuda_ptx(source, name)`` returns the PTX of a kernel. See docs/cuda-emulator.md.
"""
from __future__ import annotations

import ctypes
import numbers

import torch

from ... import config
from . import _racecheck
from . import _toolchain as _tc
from ._errors import CudaCompileError, KernelFault
from ._racecheck import KernelRace, race_detection
from ._schedule import _current_schedule, emulation_schedule
from ._source import Param, adapt_for_emulator, has_marker, parse_params, read_source
from ._toolchain import ToolkitMissing

__all__ = ["cuda_kernel", "MAX_DYNAMIC_SHARED", "max_dynamic_shared", "load_inline", "emulation_schedule",
           "CudaCompileError", "KernelFault", "KernelRace", "race_detection",
           "cuda_ptx", "cuda_sass", "cuda_resources", "CudaKernel", "ToolkitMissing"]

# ---------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------
def _dims(v, what: str, kname: str) -> tuple[int, int, int]:
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        v = (int(v),)
    elif isinstance(v, torch.Tensor) and v.numel() == 1:
        v = (int(v.item()),)
    if not isinstance(v, (tuple, list, torch.Size)) or not 1 <= len(v) <= 3 or \
            not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in v):
        raise TypeError(f"{kname}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    d = [int(x) for x in v] + [1] * (3 - len(v))
    if any(x < 0 for x in d) or (what == "block" and any(x == 0 for x in d)):
        raise ValueError(f"{kname}: {what} dimensions must be positive, got {tuple(v)}")
    if what == "block":
        if d[0] * d[1] * d[2] > config.MAX_THREADS_PER_BLOCK or any(a > b for a, b in zip(d, config.MAX_BLOCK)):
            raise ValueError(f"{kname}: a block has at most 1024 threads (x, y <= 1024, z <= 64), got {tuple(v)}")
    else:
        if any(a > b for a, b in zip(d, config.MAX_GRID)):
            raise ValueError(f"{kname}: grid is at most (2**31-1, 65535, 65535), got {tuple(v)}")
    return d[0], d[1], d[2]


#: Dynamic shared memory per block in the emulator: what an H100 gives a kernel that opts in.
MAX_DYNAMIC_SHARED = 227 * 1024
_max_shared = None


def max_dynamic_shared() -> int:
    """Bytes of dynamic shared memory one block may have here: this GPU's opt-in limit
    (227 KiB on an H100, less on many other GPUs), or the emulator's ``MAX_DYNAMIC_SHARED``.
    Above 48 KiB the launcher opts the kernel in, as ``cudaFuncSetAttribute`` would."""
    global _max_shared
    if _max_shared is None:
        if config.SIMULATE:
            _max_shared = MAX_DYNAMIC_SHARED
        else:
            try:
                from . import _gpu
                _max_shared = int(_gpu._device().properties.max_shared_memory_per_block_optin)
            except Exception:  # an older cuda.core: ask torch, else assume no opt-in
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                _max_shared = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
    return _max_shared


class CudaKernel:
    """A compiled CUDA C++ kernel; launch it with ``k[grid, block](*args)`` or
    ``k[grid, block, shared_bytes](*args)``."""

    def __init__(self, source, name: str):
        if not isinstance(name, str) or not name.strip():
            raise TypeError("name must be the name of a __global__ function, e.g. 'relu_kernel'")
        self.name = name.strip()
        self.text, self.filename, self.include_dir = read_source(source, self.name)
        self.simulated = config.SIMULATE
        self.not_solved = has_marker(self.text)
        self.params: list[Param] | None = parse_params(self.text, self.name)
        self.uses_printf = "printf" in self.text
        self._lib = self._kernel = None
        self._prof_lib = None  # the profiling variant of the library, built at the first profile
        self._launchers: dict = {}
        self._plan = None
        if not self.not_solved:
            key = (self.name, self.filename)
            try:
                self._build()
            except CudaCompileError:
                _FAILED_COMPILES.add(key)
                raise
            _FAILED_COMPILES.discard(key)

    def _check_not_stale(self):
        if (self.name, self.filename) in _FAILED_COMPILES:
            raise CudaCompileError(
                f"the last compile of `{self.name}` failed, so this kernel is an older one that no longer "
                "matches your source: fix the compiler error above and run that cell again")

    def _build(self):
        if self.simulated:
            from . import _emulator
            self._lib = _emulator.build(adapt_for_emulator(self.text, self.name), self.name, self.filename,
                                        self.include_dir, racecheck=_racecheck.enabled())
            # A GPU compiles with NVRTC: code it rejects must not pass in simulation either.
            _tc.nvrtc_check(self.text, self.name, self.filename, self.include_dir)
            sig = self._lib.signature
            if self.params is None or len(self.params) != len(sig):
                self.params = [Param(f"argument {k + 1}", "", c) for k, c in enumerate(sig)]
            else:  # the compiler's view of each type wins (typedefs, templates)
                self.params = [Param(p.name, p.ctype, c) for p, c in zip(self.params, sig)]
        else:
            from . import _gpu
            self._kernel = _gpu.build(self.text, self.name, self.filename, self.include_dir)
            n = getattr(self._kernel, "num_arguments", None)
            if self.params is None or (n is not None and n != len(self.params)):
                self.params = [Param(f"argument {k + 1}", "", None) for k in range(n or 0)]
            self._plan = _fast_plan(self.params)
            self._gpu_launch = _gpu.launch

    def __repr__(self):
        mode = "emulated on the CPU" if self.simulated else "on the GPU"
        args = ", ".join(f"{p.ctype} {p.name}".strip() for p in (self.params or []))
        return f"<CUDA kernel {self.name}({args}) {mode}>"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"launch a kernel with a configuration: {self.name}[grid, block](...) "
                        f"or {self.name}[grid, block, shared_bytes](...)")

    def __getitem__(self, cfg):
        launcher = self._launchers.get(cfg) if type(cfg) is tuple and len(cfg) <= 3 else None
        if launcher is not None:  # the same [grid, block] as before: parsed and checked already
            return launcher
        grid, block, shared, stream = self._parse_config(cfg)

        def launcher(*args):
            return self._launch(grid, block, int(shared), stream, args)
        if len(cfg) <= 3 and all(type(c) is int or (type(c) is tuple and all(type(d) is int for d in c))
                                 for c in cfg):
            if len(self._launchers) > 256:
                self._launchers.clear()
            self._launchers[cfg] = launcher
        return launcher

    def _parse_config(self, cfg):
        """(grid, block, shared bytes, stream) of ``k[cfg]``, checked."""
        if not isinstance(cfg, tuple) or not 2 <= len(cfg) <= 4:
            raise TypeError(f"{self.name}[...] takes grid, block and optionally shared_bytes (and a stream): "
                            f"{self.name}[grid, block](...), got {cfg!r}")
        grid = _dims(cfg[0], "grid", self.name)
        block = _dims(cfg[1], "block", self.name)
        shared = cfg[2] if len(cfg) > 2 else 0
        if not isinstance(shared, numbers.Integral) or isinstance(shared, bool) or shared < 0:
            raise TypeError(f"{self.name}: shared_bytes must be a non-negative int, got {shared!r}")
        if shared > 48 * 1024 and shared > max_dynamic_shared():  # any GPU gives a block 48 KiB
            raise ValueError(f"{self.name}: {shared} bytes of dynamic shared memory requested; "
                             f"at most {max_dynamic_shared()} bytes per block here")
        stream = cfg[3] if len(cfg) > 3 else None
        return grid, block, int(shared), stream

    # -- profiling (utils.profile; _profile.py) -------------------------------
    @property
    def profile(self) -> "_ProfileLaunch":
        """``k.profile[grid, block](*args)`` (or ``[grid, block, shared_bytes]``): run the launch
        once and return its `utils.Profile`: the emulator's counters in simulation, Nsight
        Compute's on a GPU."""
        return _ProfileLaunch(self)

    def _profile_run(self, grid, block, shared, args) -> dict:
        if self.not_solved:
            raise NotImplementedError(f"not solved yet: {self.name} still has a TODO")
        self._check_not_stale()
        from . import _profile
        if not self.simulated:
            from ._emulator import check_arg_count, check_tensor
            check_arg_count(self.name, self.params, args)
            # The same checks as a launch, here rather than in ncu's subprocess, where a wrong
            # argument would only show as "ncu failed".
            for p, a in zip(self.params, args):
                if isinstance(a, torch.Tensor) and p.code and p.code.startswith("p"):
                    check_tensor(self.name, p, p.code, a, torch.device("cuda"))
            return _profile.from_ncu(_profile.run_ncu(self, grid, block, shared, args), args, self.params)
        from . import _emulator
        if self._prof_lib is None:
            self._prof_lib = _emulator.build(adapt_for_emulator(self.text, self.name), self.name, self.filename,
                                             self.include_dir, profile=True)
        rec = _profile.Recorder()
        mode, seed = _current_schedule()
        _emulator.launch(self._prof_lib, self.name, self.params, grid, block, shared, args, mode, seed,
                         self.uses_printf, profiler=rec, racecheck=_racecheck.enabled())
        info = _profile.gpu_compile_info(self)
        with _profile.one_thread():
            out = _profile.analyze(rec.raw, rec, self._prof_lib, self.params, grid, block, info.get("atom_kinds"),
                                   info.get("predicated_lines"))
        out["backend"] = "cuda-emulator"
        return out

    def _launch(self, grid, block, shared, stream, args):
        if self.not_solved:
            raise NotImplementedError(f"not solved yet: {self.name} still has a TODO")
        self._check_not_stale()
        if self.simulated:
            from . import _emulator
            if self._lib.racecheck != _racecheck.enabled():  # race_detection() switched: the other build
                self._build()
            mode, seed = _current_schedule()
            _emulator.launch(self._lib, self.name, self.params, grid, block, shared, args, mode, seed,
                             self.uses_printf)
            return None
        return self._launch_gpu(grid, block, shared, stream, args)

    def _launch_gpu(self, grid, block, shared, stream, args):
        plan = self._plan
        if plan is not None and len(args) == len(plan) and grid[0] * grid[1] * grid[2]:
            # The common case, checked with as little Python as possible (a launch should cost
            # microseconds): tensors on the GPU, contiguous, of the pointee's dtype; plain ints
            # in range; floats. Anything else takes the path below, which explains what is wrong.
            out = []
            for (kind, ctype, allowed), a in zip(plan, args):
                if kind == 0:
                    if type(a) is not _Tensor or not a.is_cuda or not a.is_contiguous() or \
                            (allowed is not None and a.dtype not in allowed):
                        break
                    out.append(_c_uint64(a.data_ptr()))
                elif kind == 1:
                    if type(a) is not float and type(a) is not int:
                        break
                    out.append(ctype(a))
                else:
                    if type(a) is not int or not allowed[0] <= a <= allowed[1]:
                        break
                    out.append(ctype(a))
            else:
                if not self.uses_printf:
                    self._gpu_launch(self._kernel, grid, block, shared, out, stream)
                    return None
        return self._launch_gpu_checked(grid, block, shared, stream, args)

    def _launch_gpu_checked(self, grid, block, shared, stream, args):
        from . import _emulator as emu  # argument checks are shared; nothing is compiled
        from . import _gpu
        emu.check_arg_count(self.name, self.params, args)
        if grid[0] * grid[1] * grid[2] == 0:
            return None  # an empty grid has nothing to do (CUDA would call it an error)
        info = None
        out = []
        dev = torch.device("cuda")
        for k, (p, a) in enumerate(zip(self.params, args)):
            code = p.code
            if code is None:  # not parsed: decide from the argument and the kernel's own sizes
                if info is None:
                    info = list(getattr(self._kernel, "arguments_info", []) or [])
                size = info[k][1] if k < len(info) else 8
                if isinstance(a, torch.Tensor) or a is None:
                    code = "px"
                elif isinstance(a, float):
                    code = "f" if size == 4 else "d"
                else:
                    code = "i" if size == 4 else "q"
            if code.startswith("p"):
                if a is None:
                    out.append(_gpu.pointer(0))
                    continue
                emu.check_tensor(self.name, p, code, a, dev)
                out.append(_gpu.pointer(a.data_ptr()))
            else:
                out.append(emu.convert_scalar(self.name, p, code, a))
        if self.uses_printf:  # device printf is flushed at a synchronisation: show it here
            torch.cuda.synchronize()
            with emu.CaptureStdout():
                _gpu.launch(self._kernel, grid, block, shared, out, stream)
                torch.cuda.synchronize()
        else:
            _gpu.launch(self._kernel, grid, block, shared, out, stream)
        return None


class _ProfileLaunch:
    """``k.profile[grid, block(, shared_bytes)]``: a launcher that returns a `utils.Profile`."""

    def __init__(self, kernel: CudaKernel):
        self.kernel = kernel

    def __getitem__(self, cfg):
        k = self.kernel
        if isinstance(cfg, tuple) and len(cfg) == 4:
            raise TypeError(f"{k.name}.profile[...] takes grid, block and optionally shared_bytes (no stream)")
        grid, block, shared, _ = k._parse_config(cfg)

        def run(*args):
            from ._profile import cuda_profile
            return cuda_profile(k, grid, block, shared, args)
        return run

    def __call__(self, *args, **kwargs):
        raise TypeError(f"profile a launch with a configuration: {self.kernel.name}.profile[grid, block](...)")


#: (kernel name, source file) of the compiles that failed last: an older kernel of that name
#: must not run (a check cell would grade the previous version of the learner's code).
_FAILED_COMPILES: set[tuple[str, str]] = set()
_Tensor = torch.Tensor
_c_uint64 = ctypes.c_uint64


def _fast_plan(params):
    """Per parameter (kind, ctypes type, check): 0 a pointer (allowed dtypes or None for any),
    1 a float or double, 2 an integer (its range). None when a parameter's type is unknown."""
    from ._emulator import _INT_RANGES, _SCALAR_CTYPES, POINTEE_DTYPES
    plan = []
    for p in params:
        code = p.code
        if code is None:
            return None
        if code.startswith("p"):
            pointee = code[2:] if code.startswith("pc") else code[1:]
            plan.append((0, None, POINTEE_DTYPES.get(pointee)))
        elif code in ("f", "d"):
            plan.append((1, _SCALAR_CTYPES[code], None))
        elif code in _INT_RANGES and code != "?":
            plan.append((2, _SCALAR_CTYPES[code], _INT_RANGES[code]))
        else:
            return None
    return plan


def cuda_kernel(source, name: str) -> CudaKernel:
    """Compile the ``__global__`` function ``name`` of ``source`` (CUDA C++ text, or a
    path to a .cu file) for this machine: NVRTC on a GPU, the CPU emulator otherwise.
    ``name`` may carry template arguments: ``cuda_kernel(src, "scale<float, 256>")``.
    ``#include "common.h"`` finds the course's prelude (``utils.CUDA_INCLUDE_DIR``)."""
    return CudaKernel(source, name)


# ---------------------------------------------------------------------------------------
# PTX, SASS and resources: what the GPU's compiler makes of a kernel (NVRTC + nvdisasm,
# from NVIDIA's pip wheels, so they work on a laptop without a GPU too)
# ---------------------------------------------------------------------------------------
def _gpu_compile(source, name: str, arch, what: str):
    text, filename, include_dir = read_source(source, name)
    return _tc.compile_for_gpu(text, name.strip(), filename, include_dir, arch or _tc.default_arch(), what)


def cuda_ptx(source, name: str, arch: str | None = None) -> str:
    """The PTX (the GPU's portable assembly language) of kernel ``name`` in ``source`` (CUDA C++
    text or a .cu path), as NVRTC makes it for ``arch`` (default: this machine's GPU, else
    ``"sm_90"``, an H100). Works without a GPU."""
    res, _ = _gpu_compile(source, name, arch, "cuda_ptx")
    return res.ptx


def cuda_sass(source, name: str, arch: str | None = None) -> str:
    """The SASS (the machine code the GPU runs) of kernel ``name``, compiled for ``arch``
    (default: this machine's GPU, else ``"sm_90"``) and disassembled by ``nvdisasm``."""
    res, mangled = _gpu_compile(source, name, arch, "cuda_sass")
    return _tc.sass(res.cubin, mangled)


def cuda_resources(source, name: str, arch: str | None = None) -> dict:
    """What one thread of kernel ``name`` uses, as ``ptxas`` reports it for ``arch``:
    ``registers``, ``spill_stores`` and ``spill_loads`` (bytes moved to local memory because
    the registers ran out), ``shared_bytes`` (static shared memory per block), ``local_bytes``
    (the stack frame per thread), ``constant_bytes`` and ``max_threads_per_block`` (1024, or
    fewer when ``__launch_bounds__`` or the registers limit it), plus ``arch``."""
    arch = arch or _tc.default_arch()
    res, mangled = _gpu_compile(source, name, arch, "cuda_resources")
    return {**_tc.resources(res.log, res.ptx, mangled), "arch": arch}


from ._inline import load_inline  # noqa: E402
