"""The GPU path of ``cuda_kernel``: NVRTC through ``cuda.core``, launched on torch's
current stream. Compiling a kernel takes about 0.1 s (torch's ``load_inline`` takes tens
of seconds), and compiled code is cached in memory and on disk."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import torch

from .. import paths
from ._source import CudaCompileError

_MEM: dict[str, object] = {}
_STREAMS: dict[int, object] = {}

#: What NVRTC lacks compared with nvcc: the C headers of the host compiler. Their lines
#: are blanked (NVRTC has its own math functions and printf) and the few macros they
#: would define come from this prelude instead.
_NVRTC_PRELUDE = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38f
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.175494351e-38f
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef INT_MIN
#define INT_MIN (-2147483647 - 1)
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t;
typedef long int64_t; typedef unsigned long uint64_t;  /* as in glibc on 64-bit Linux */
"""
_HOST_HEADERS = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*<(cstdio|stdio\.h|cmath|math\.h|cstdint|stdint\.h|cfloat|float\.h|climits|"
    r"limits\.h|cstdlib|stdlib\.h|cassert|assert\.h|cuda_runtime\.h|cuda\.h|device_launch_parameters\.h)>[^\n]*$",
    re.M)


_CORE = None
_CONFIGS: dict[tuple, object] = {}


def _core():
    global _CORE
    if _CORE is None:
        try:
            import cuda.core as core
            core.Program  # noqa: B018
        except (ImportError, AttributeError):
            import cuda.core.experimental as core
        _CORE = core
    return _CORE


def _device():
    core = _core()
    dev = core.Device(torch.cuda.current_device())
    dev.set_current()
    return dev


def _cuda_include_dirs() -> list[str]:
    out = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").exists():
            out.append(str(Path(root, "include")))
            break
    return out


def prepare(text: str, filename: str) -> str:
    text = _HOST_HEADERS.sub("", text)
    return _NVRTC_PRELUDE + f'#line 1 "{filename}"\n' + text


def _options(core, arch: str, filename: str, include_dir: Path | None):
    incs = [str(paths.CUDA_INCLUDE_DIR)] + ([str(include_dir)] if include_dir else []) + _cuda_include_dirs()
    return core.ProgramOptions(arch=arch, std="c++17", include_path=incs, name=filename)


def _compile(text: str, name: str, filename: str, include_dir: Path | None, target: str, arch: str):
    core = _core()
    prog = core.Program(prepare(text, filename), "c++", _options(core, arch, filename, include_dir))
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
    arch = "compute_" + "".join(map(str, dev.compute_capability))
    obj = _compile(text, name, filename, include_dir, "ptx", arch)
    code = obj.code
    return code.decode() if isinstance(code, (bytes, bytearray)) else str(code)


def build(text: str, name: str, filename: str, include_dir: Path | None):
    """A launchable ``cuda.core`` Kernel for ``name``."""
    core = _core()
    dev = _device()
    arch = "sm_" + "".join(map(str, dev.compute_capability))
    hdr = hashlib.sha256()
    for p in sorted(Path(paths.CUDA_INCLUDE_DIR).glob("*.h")):
        hdr.update(p.read_bytes())
    key = hashlib.sha256("\0".join([text, name, arch, hdr.hexdigest(), str(include_dir)]).encode()).hexdigest()[:24]
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
                cache.mkdir(parents=True, exist_ok=True)
                tmp = cubin.with_suffix(".tmp")
                tmp.write_bytes(obj.code)
                os.replace(tmp, cubin)
                meta.write_text(json.dumps({"mangled": mangled.decode() if isinstance(mangled, bytes) else mangled}))
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


_NP = {"f": np.float32, "d": np.float64, "i": np.int32, "I": np.uint32, "l": np.int64, "L": np.uint64,
       "q": np.int64, "Q": np.uint64, "h": np.int16, "H": np.uint16, "c": np.int8, "b": np.int8,
       "B": np.uint8, "?": np.bool_}


def to_np(code: str, ctype_value):
    return _NP[code](ctype_value.value)


def launch(kernel, grid, block, shared: int, args, stream=None):
    core = _core()
    key = (tuple(grid), tuple(block), shared)
    cfg = _CONFIGS.get(key)
    if cfg is None:  # building a LaunchConfig costs more than the launch itself
        cfg = _CONFIGS[key] = core.LaunchConfig(grid=key[0], block=key[1], shmem_size=shared)
    s = _stream(stream)
    try:
        core.launch(s, cfg, kernel, *args)
    except TypeError:
        core.launch(kernel, cfg, *args)  # cuda.core < 0.2: the stream lives in the config
