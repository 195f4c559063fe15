"""The GPU path of ``cuda_kernel``: NVRTC through ``cuda.core``, launched on torch's
current stream. Compiling a kernel takes about 0.1 s (torch's ``load_inline`` takes tens
of seconds), and compiled code is cached in memory and on disk."""
from __future__ import annotations

import ctypes
import io
import json
import os
from pathlib import Path

import numpy as np
import torch

from ... import paths
from . import _toolchain as _tc
from ._source import CudaCompileError

_MEM: dict[str, object] = {}
_STREAMS: dict[int, object] = {}

_CORE = None
_CONFIGS: dict[tuple, object] = {}


def _core():
    global _CORE
    if _CORE is None:
        try:
            import cuda.core as core
            core.Program
        except (ImportError, AttributeError):
            import cuda.core.experimental as core
        _CORE = core
    return _CORE


def _device():
    core = _core()
    dev = core.Device(torch.cuda.current_device())
    dev.set_current()
    return dev


def prepare(text: str, filename: str, include_dir: Path | None = None) -> str:
    return _tc.nvrtc_source(text, filename, include_dir)


def _options(core, arch: str, filename: str, include_dir: Path | None, **extra):
    incs = [str(paths.CUDA_INCLUDE_DIR)] + ([str(include_dir)] if include_dir else []) + _tc.nvrtc_include_dirs()
    return core.ProgramOptions(arch=arch, std="c++17", include_path=incs, name=filename, **extra)


def _compile(text: str, name: str, filename: str, include_dir: Path | None, target: str, arch: str):
    core = _core()
    prog = core.Program(prepare(text, filename, include_dir), "c++", _options(core, arch, filename, include_dir))
    logs = io.StringIO()
    try:
        try:
            obj = prog.compile(target, name_expressions=(name,), logs=logs)
        except TypeError:
            obj = prog.compile(target, name_expressions=(name,))
    except Exception as e:  # NVRTC reports the log in the exception text
        raise CudaCompileError(f"CUDA C++ compilation of `{name}` failed (NVRTC):\n{logs.getvalue()}{e}") from None
    return obj


def ptx(text: str, name: str, filename: str, include_dir: Path | None) -> str:
    dev = _device()
    arch = _tc.specific_arch(text, "compute_" + "".join(map(str, dev.compute_capability)))
    obj = _compile(text, name, filename, include_dir, "ptx", arch)
    code = obj.code
    return code.decode() if isinstance(code, (bytes, bytearray)) else str(code)


def ptxas_log(text: str, name: str, filename: str, include_dir: Path | None, arch: str | None = None) -> str:
    """ptxas's log of one kernel built as ``build`` builds it, with ``-v``: its registers, spills
    and performance remarks (C75xx: a wgmma serialised, setmaxnreg ignored), for ``arch`` (such as
    ``"sm_90"``; default: this GPU's). NVRTC needs no GPU for it."""
    arch = _tc.specific_arch(text, arch or "sm_" + "".join(map(str, _device().compute_capability)))
    logs = io.StringIO()
    core = _core()
    prog = core.Program(prepare(text, filename, include_dir), "c++",
                        _options(core, arch, filename, include_dir, ptxas_options=["-v"]))
    prog.compile("cubin", name_expressions=(name,), logs=logs)
    return logs.getvalue()


def build(text: str, name: str, filename: str, include_dir: Path | None):
    """A launchable ``cuda.core`` Kernel for ``name``."""
    core = _core()
    dev = _device()
    arch = _tc.specific_arch(text, "sm_" + "".join(map(str, dev.compute_capability)))
    nv = _tc.nvrtc()
    key = _tc.cache_key(prepare(text, filename, include_dir), name, arch, _tc.headers_digest(include_dir),
                        str(include_dir), _tc.include_dirs(), nv.version if nv else getattr(core, "__version__", ""))
    if key in _MEM:
        return _MEM[key]
    cache = Path(paths.CACHE_DIR) / "cuda-nvrtc"
    cubin, meta = cache / f"{key}.cubin", cache / f"{key}.json"
    kernel = None
    if cubin.exists() and meta.exists():
        try:  # the cubin and the mangled name NVRTC gave the kernel
            mangled = json.loads(meta.read_text())["mangled"]
            obj = core.ObjectCode.from_cubin(cubin.read_bytes())
            kernel = obj.get_kernel(mangled)
        except Exception:
            kernel = None
    if kernel is None:
        obj = _compile(text, name, filename, include_dir, "cubin", arch)
        kernel = obj.get_kernel(name)
        try:
            mangled = getattr(obj, "_sym_map", {}).get(name)
            if mangled:
                _tc.write_atomic(cubin, obj.code)
                _tc.write_atomic(meta, json.dumps({"mangled": mangled.decode() if isinstance(mangled, bytes)
                                                   else mangled}).encode())
        except Exception:
            pass  # the disk cache is an optimisation only
    _MEM[key] = kernel
    return kernel


class _TorchStream:
    """torch's current stream, in the form cuda.core accepts."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _stream(torch_stream=None):
    s = torch_stream if torch_stream is not None else torch.cuda.current_stream()
    handle = int(s.cuda_stream)
    if handle not in _STREAMS:
        core = _core()
        wrapped = _TorchStream(handle)
        try:
            _STREAMS[handle] = core.Stream.from_handle(handle)
        except Exception:
            try:
                _STREAMS[handle] = _device().create_stream(wrapped)
            except Exception:
                _STREAMS[handle] = wrapped
    return _STREAMS[handle]


#: Set COURSE_CUDA_LAUNCH=core to launch through cuda.core's generic launcher instead of
#: calling the driver's cuLaunchKernel directly (the direct call costs a few microseconds
#: of Python per launch; the generic one several times that).
_DIRECT = os.environ.get("COURSE_CUDA_LAUNCH", "direct") != "core"
_DEFAULT_SHARED = 48 * 1024  # what a kernel may use without opting in


class _Driver:
    """The two driver calls a launch needs, through ctypes: the cheapest way from Python."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self.ctypes = ctypes
        vp, u = ctypes.c_void_p, ctypes.c_uint
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        self.launch.restype = ctypes.c_int
        self.set_attribute = lib.cuFuncSetAttribute
        self.set_attribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
        self.set_attribute.restype = ctypes.c_int
        self._name = lib.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._text = lib.cuGetErrorString
        self._text.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def error(self, code: int) -> str:
        name, text = self.ctypes.c_char_p(), self.ctypes.c_char_p()
        self._name(code, self.ctypes.byref(name))
        self._text(code, self.ctypes.byref(text))
        return f"{(name.value or b'CUDA error').decode()}: {(text.value or b'').decode()}"


_DRIVER: _Driver | None = None
_FUNCS: dict[int, list] = {}  # id(kernel) -> [kernel, CUfunction address, dynamic shared memory allowed]


def _function(kernel):
    """The CUfunction of a cuda.core Kernel in the current context, or None if unavailable."""
    global _DRIVER, _DIRECT
    entry = _FUNCS.get(id(kernel))
    if entry is None:
        try:
            from cuda.bindings import driver
            if _DRIVER is None:
                _DRIVER = _Driver()
            err, func = driver.cuKernelGetFunction(kernel.handle)
            if int(err) != 0:
                raise RuntimeError(f"cuKernelGetFunction: {err}")
            entry = _FUNCS[id(kernel)] = [kernel, int(func), _DEFAULT_SHARED]
        except Exception:  # an older driver or bindings: use cuda.core's launcher
            _DIRECT = False
            return None
    return entry


def _raw_stream(torch_stream=None) -> int:
    if torch_stream is not None:
        return int(torch_stream.cuda_stream)
    try:  # torch's own fast accessors (what torch.compile's generated code calls)
        return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    except AttributeError:
        return int(torch.cuda.current_stream().cuda_stream)


def pointer(address: int):
    return ctypes.c_uint64(address)


def launch(kernel, grid, block, shared: int, args, stream=None):
    """Launch on torch's current stream (or ``stream``). ``args`` are ctypes values."""
    entry = _function(kernel) if _DIRECT else None
    if entry is not None:
        d = _DRIVER
        c = d.ctypes
        func = entry[1]
        if shared > entry[2]:  # above 48 KiB a kernel must opt in to more shared memory
            rc = d.set_attribute(func, 8, shared)  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            if rc:
                raise RuntimeError(f"cannot give the kernel {shared} bytes of shared memory: {d.error(rc)}")
            entry[2] = shared
        params = (c.c_void_p * len(args))(*[c.addressof(a) for a in args])
        rc = d.launch(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                      _raw_stream(stream), params, None)
        if rc:
            raise RuntimeError(f"the kernel launch failed: {d.error(rc)}")
        return
    _launch_core(kernel, grid, block, shared, [_NP_OF[type(a)](a.value) for a in args], stream)


def _launch_core(kernel, grid, block, shared: int, args, stream=None):
    core = _core()
    if shared > _DEFAULT_SHARED:
        from cuda.bindings import driver
        (err,) = driver.cuKernelSetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared, kernel.handle,
            _device().device_id)
        if int(err) != 0:
            raise RuntimeError(f"cannot give the kernel {shared} bytes of shared memory: {err}")
    key = (tuple(grid), tuple(block), shared)
    cfg = _CONFIGS.get(key)
    if cfg is None:  # building a LaunchConfig costs more than the launch itself
        cfg = _CONFIGS[key] = core.LaunchConfig(grid=key[0], block=key[1], shmem_size=shared)
    s = _stream(stream)
    try:
        core.launch(s, cfg, kernel, *args)
    except TypeError:
        core.launch(kernel, cfg, *args)  # cuda.core < 0.2: the stream lives in the config


def _np_of():
    c = ctypes
    return {c.c_float: np.float32, c.c_double: np.float64, c.c_int32: np.int32, c.c_uint32: np.uint32,
            c.c_int64: np.int64, c.c_uint64: np.uint64, c.c_int16: np.int16, c.c_uint16: np.uint16,
            c.c_int8: np.int8, c.c_uint8: np.uint8, c.c_bool: np.bool_, c.c_long: np.int64,
            c.c_ulong: np.uint64, c.c_longlong: np.int64, c.c_ulonglong: np.uint64, c.c_int: np.int32,
            c.c_uint: np.uint32, c.c_short: np.int16, c.c_ushort: np.uint16, c.c_byte: np.int8,
            c.c_ubyte: np.uint8, c.c_char: np.int8}


_NP_OF = _np_of()
