"""``load_inline``: torch's own on a GPU; on a CPU the same sources built against the
emulator through torch's cpp_extension (ninja + g++).

The CPU build adapts the CUDA source without changing its line numbers:
``kernel<<<grid, block, shared, stream>>>(args)`` becomes a call into the emulator,
CUDA-only headers (``cuda_runtime.h``, ``c10/cuda/...``, ``ATen/cuda/...``) are dropped
(``cuda_emu.h`` provides what they declare), and host checks written for CUDA tensors
(``x.is_cuda()``, ``torch::kCUDA``) accept the CPU tensors the course uses in simulation.
Everything is compiled as one translation unit: ``torch/extension.h`` is expensive, so it
is parsed once, and torch's build cache makes a second load instant.
"""
from __future__ import annotations

import ctypes
import functools
import re
import types

from ... import config, paths
from . import _toolchain as _tc
from ._errors import CudaCompileError, KernelFault
from ._source import adapt_for_emulator, adapt_torch_host_code, has_marker

#: Names of the extensions whose last emulated build failed.
_FAILED_BUILDS: set[str] = set()


def _as_list(src) -> list[str]:
    if src is None:
        return []
    if isinstance(src, str):
        return [src]
    return list(src)


def _function_names(functions, sources: list[str]) -> list[str]:
    if isinstance(functions, str):
        return [functions]
    if isinstance(functions, dict):
        return list(functions)
    if functions:
        return list(functions)
    names = []
    for s in sources:
        names += re.findall(r"\bm\s*\.\s*def\s*\(\s*\"(\w+)\"", s)
    return names


def _not_solved_module(name: str, functions, sources) -> types.ModuleType:
    mod = types.ModuleType(name, "an extension whose CUDA source still has a TODO")
    for fname in _function_names(functions, sources):
        def stub(*args, _f=fname, **kwargs):
            raise NotImplementedError(f"not solved yet: {_f} still has a TODO")
        stub.__name__ = fname
        setattr(mod, fname, stub)
    return mod


def load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                build_directory=None, verbose=False, with_cuda=None, is_python_module=True,
                with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False, **kwargs):
    """``torch.utils.cpp_extension.load_inline`` with the same arguments, on a GPU or not.

    ``#include "common.h"`` finds the course's prelude (``CHECK_INPUT(x)``, ``cdiv``,
    ``CUDA_CHECK``). On a GPU this IS torch's ``load_inline``. On a CPU the sources are
    built against the CUDA emulator; kernel faults raise ``KernelFault``, kernel
    ``printf`` output appears in the cell, and ``emulation_schedule`` applies."""
    cpp = _as_list(cpp_sources)
    cuda = _as_list(cuda_sources)
    include = list(extra_include_paths or []) + [str(paths.CUDA_INCLUDE_DIR)]
    if any(has_marker(s) for s in cpp + cuda):
        return _not_solved_module(name, functions, cpp + cuda)
    from torch.utils import cpp_extension as ce
    if not config.SIMULATE:
        return ce.load_inline(name, cpp, cuda or None, functions=functions, extra_cflags=extra_cflags,
                              extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
                              extra_include_paths=include, build_directory=build_directory, verbose=verbose,
                              with_cuda=with_cuda, is_python_module=is_python_module,
                              with_pytorch_error_handling=with_pytorch_error_handling,
                              keep_intermediates=keep_intermediates, use_pch=use_pch, **kwargs)
    EMU_DIR = _tc.EMU_DIR
    try:
        for s in cpp:  # what nvcc would reject on a GPU (torch writes cpp_sources to main.cpp)
            _tc.check_torch_cuda_includes(s, "main.cpp")
        for k, s in enumerate(cuda):
            _tc.check_torch_cuda_includes(s, "cuda.cu" if len(cuda) == 1 else f"cuda_{k}.cu")
            # nvcc compiles the kernels on a GPU: what it rejects must not pass in simulation
            # either. Before the build, which takes much longer than this check.
            _tc.nvrtc_check_device_code(s, "cuda.cu" if len(cuda) == 1 else f"cuda_{k}.cu")
        sources = [adapt_torch_host_code(s) for s in cpp]
        for k, s in enumerate(cuda):
            fname = "cuda.cu" if len(cuda) == 1 else f"cuda_{k}.cu"
            sources.append('#include "cuda_emu.h"\n'
                           f'#line 1 "{fname}"\n' + adapt_torch_host_code(adapt_for_emulator(s)))
        # COURSE_CUDA_EMULATOR on the command line: cpp_sources come before cuda_emu.h in the
        # translation unit, and common.h's CHECK_INPUT must see it there too.
        cflags = list(extra_cflags or []) + _tc.extension_flags()
        mod = ce.load_inline(name, sources, None, functions=functions, extra_cflags=cflags,
                             extra_ldflags=extra_ldflags, extra_include_paths=[str(EMU_DIR)] + include,
                             build_directory=build_directory, verbose=verbose, with_cuda=False,
                             is_python_module=is_python_module,
                             with_pytorch_error_handling=with_pytorch_error_handling,
                             keep_intermediates=keep_intermediates, use_pch=use_pch, **kwargs)
    except Exception:
        _FAILED_BUILDS.add(name)  # the module of an older, successful build must not run
        raise
    _FAILED_BUILDS.discard(name)
    if not is_python_module or not cuda:
        return mod
    return wrap_emulated_module(mod, uses_printf=any("printf" in s for s in cpp + cuda))


def wrap_emulated_module(mod, uses_printf: bool):
    """A module whose functions run like the GPU version would look from Python: faults
    in kernels raise ``KernelFault``, kernel ``printf`` output goes to ``sys.stdout``, and
    the current ``emulation_schedule`` applies."""
    from ..launches import launching
    from ._emulator import _LAUNCH_LOCK, CaptureStdout, FaultInfo, python_handles_interrupts
    from ._schedule import _current_schedule
    lib = ctypes.CDLL(mod.__file__)
    lib.emu_fault.restype = ctypes.POINTER(FaultInfo)
    lib.emu_set_schedule.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
    wrapped = types.ModuleType(mod.__name__, mod.__doc__)
    wrapped.__file__ = mod.__file__
    wrapped.__wrapped_extension__ = mod

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if mod.__name__ in _FAILED_BUILDS:
                raise CudaCompileError(f"the last build of extension `{mod.__name__}` failed, so this is an older "
                                       "build that no longer matches your source: fix the error and run that "
                                       "cell again")
            mode, seed = _current_schedule()
            with launching("cuda", f"{mod.__name__}.{fn.__name__}", (args, kwargs)), _LAUNCH_LOCK:
                lib.emu_set_schedule(mode, seed)
                fault = lib.emu_fault().contents
                fault.kind = 0
                try:
                    if uses_printf:
                        with CaptureStdout():
                            return fn(*args, **kwargs)
                    return fn(*args, **kwargs)
                except RuntimeError as e:
                    if fault.kind:
                        msg = str(e) or fault.msg.decode(errors="replace")
                        raise KernelFault(msg) from None
                    raise
                finally:
                    python_handles_interrupts()
        return call

    for attr in dir(mod):
        if attr.startswith("__"):
            continue
        val = getattr(mod, attr)
        setattr(wrapped, attr, wrap(val) if callable(val) and not isinstance(val, type) else val)
    return wrapped
