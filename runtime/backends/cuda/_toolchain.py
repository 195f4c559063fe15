"""The course's compilers in one place: where they are, their flags, and the cache keys of
what they build.

* The host C++ compiler (g++ or clang++) builds kernels against the CPU emulator:
  ``cuda_kernel`` (``_emulator.py``), ``load_inline`` (``_inline.py``) and the ``setup.py``
  project (``utils/extension.py``) share ``EMU_FLAGS``.
* NVIDIA's tools come from the pip wheels in ``requirements.txt`` (``nvidia-cuda-nvrtc``,
  ``nvidia-cuda-runtime``, ``nvidia-cuda-nvdisasm``), so a laptop without a CUDA toolkit has
  them. A system toolkit (``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda``, ``PATH``) is
  used only when the wheels are missing, and never with ``COURSE_NO_SYSTEM_CUDA=1``: then
  the course behaves exactly as on a machine without one (the test suite runs that way).
* NVRTC, the GPU's own compiler, gives PTX, the cubin (``ptxas`` runs inside it) and the
  resource use of a kernel; ``nvdisasm`` turns the cubin into SASS. In simulation every
  ``cuda_kernel`` source is also compiled by NVRTC, so code a GPU would reject is rejected
  here too (``nvrtc_check``).
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ... import paths
from ._source import CudaCompileError

#: Set to 1 to ignore any CUDA toolkit installed on the system (only the pip wheels count).
ENV_NO_SYSTEM_CUDA = "COURSE_NO_SYSTEM_CUDA"
EMU_DIR = Path(__file__).resolve().parent / "emu"

#: Flags of every emulator build (cuda_kernel, load_inline, setup.py). The fibers of the
#: emulator switch stacks by hand: stack-clash probes catch a thread that overflows its stack,
#: and _FORTIFY_SOURCE's checks would misread the switched stacks.
EMU_FLAGS = ["-std=c++17", "-O2", "-fstack-clash-protection", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0",
             "-fno-strict-aliasing", "-DCOURSE_CUDA_EMULATOR=1"]
#: Extra flags of a cuda_kernel library. Warnings are on (a learner needs "control reaches end
#: of non-void function" and signed/unsigned comparisons); the emulator's own headers are
#: included as system headers, so their warnings stay silent.
KERNEL_LIB_FLAGS = ["-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wno-unused-function",
                    "-Wno-unknown-pragmas"]

#: What to tell a learner whose machine lacks NVIDIA's wheels.
INSTALL_HINT = (
    "On Linux (x86-64 or arm64) `./course test` installs them from requirements.txt; by hand: "
    "`pip install -r requirements.txt` (or `pip install \"cuda-toolkit[cudart,nvrtc]==13.0.3\" "
    "nvidia-cuda-nvdisasm==13.2.86`). NVIDIA publishes no such wheels for macOS: there, run this "
    "part on a Linux machine or a free cloud notebook with a GPU; everything else works without it.")


class ToolkitMissing(RuntimeError):
    """A feature needs a piece of NVIDIA's CUDA toolkit that is not installed."""


def no_system_cuda() -> bool:
    return os.environ.get(ENV_NO_SYSTEM_CUDA, "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------------------
# Where NVIDIA's pieces are
# ---------------------------------------------------------------------------------------
def _site_dirs() -> list[Path]:
    dirs = []
    for d in [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
              *getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages(), *sys.path]:
        if d and Path(d, "nvidia").is_dir() and Path(d) not in dirs:
            dirs.append(Path(d))
    return dirs


@functools.lru_cache(maxsize=None)
def wheel_roots() -> tuple[Path, ...]:
    """The roots of NVIDIA's wheels: ``site-packages/nvidia/cu13`` (CUDA 13 wheels put every
    piece there) and, for CUDA 12 wheels, one directory per piece (``nvidia/cuda_nvrtc``)."""
    roots = []
    for d in _site_dirs():
        for sub in ["cu13", "cu12", *sorted(p.name for p in Path(d, "nvidia").glob("cuda_*"))]:
            r = Path(d, "nvidia", sub)
            if r.is_dir() and r not in roots:
                roots.append(r)
    return tuple(roots)


def system_roots() -> list[Path]:
    """The system toolkit's roots, which the lookups may use (none with COURSE_NO_SYSTEM_CUDA=1)."""
    if no_system_cuda():
        return []
    out = []
    for r in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if r and Path(r).is_dir() and Path(r) not in out:
            out.append(Path(r))
    return out


def find_tool(name: str) -> Path | None:
    """``nvdisasm``, ``ptxas``, ``nvcc``...: from the wheels, else the system toolkit."""
    for r in wheel_roots() + tuple(system_roots()):
        p = r / "bin" / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    if not no_system_cuda():
        w = shutil.which(name)
        if w:
            return Path(w)
    return None


def find_library(stem: str) -> Path | None:
    """A shared library such as ``libnvrtc.so``: from the wheels, else the system toolkit."""
    for r in wheel_roots() + tuple(system_roots()):
        for sub in ("lib", "lib64", "lib/x64"):
            hits = sorted(glob.glob(str(r / sub / f"{stem}*")))
            hits = [h for h in hits if re.search(rf"{re.escape(stem)}(\.\d+)*$", h) or h.endswith(".dylib")]
            if hits:  # the most specific versioned name: libnvrtc.so.13 before libnvrtc.so
                return Path(max(hits, key=len))
    return None


def nvrtc_include_dirs() -> list[str]:
    """``include_dirs()`` and the course's C standard headers for NVRTC (runtime/backends/cuda/nvrtc_include)."""
    from .nvrtc_compat import INCLUDE_DIR
    return include_dirs() + [str(INCLUDE_DIR)]


def include_dirs() -> list[str]:
    """CUDA's own headers (``cuda_fp16.h``...) for NVRTC: the runtime wheel's, else the system's.
    A folder that also has the ``crt`` and CCCL headers (``<mma.h>`` includes ``crt/mma.h``,
    ``<cooperative_groups.h>`` includes ``<nv/target>``) comes first: torch's own CUDA wheels
    bring the runtime's headers without them."""
    found = [r / "include" for r in wheel_roots() + tuple(system_roots())
             if (r / "include" / "cuda_fp16.h").is_file()]
    complete = [d for d in found if (d / "crt" / "mma.h").is_file() and (d / "nv" / "target").is_file()]
    if not found:
        return []
    best = (complete or found)[0]
    # CUDA 13 keeps libcu++ (<cuda/std/...>) only in include/cccl
    return [str(best)] + ([str(best / "cccl")] if (best / "cccl" / "cuda" / "std").is_dir() else [])


SYSTEM_CUDA_VARIABLES = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDAToolkit_ROOT")
#: The variables hide_system_cuda removed, with their values (the tests check nothing uses them).
HIDDEN: dict[str, str] = {}


def _has_nvcc(folder: str) -> bool:
    """Whether ``folder`` holds nvcc (a folder this user may not search holds none it can run)."""
    try:
        return Path(folder, "nvcc").exists()
    except OSError:
        return False


def hide_system_cuda():
    """With COURSE_NO_SYSTEM_CUDA=1, make this process (and what it starts) see no system
    toolkit: no CUDA_HOME/CUDA_PATH, no nvcc on PATH. numba-cuda and cuda.bindings then load
    libcudart and NVRTC from the wheels, as on a laptop. Runs at ``import utils``, before numba."""
    if not no_system_cuda():
        return
    for v in SYSTEM_CUDA_VARIABLES:
        if v in os.environ:
            HIDDEN[v] = os.environ.pop(v)
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not _has_nvcc(d) and not d.startswith("/usr/local/cuda")]
    os.environ["PATH"] = os.pathsep.join(keep)
    lib = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
           if d and ("cuda" not in d.lower() or "site-packages" in d)]
    if "LD_LIBRARY_PATH" in os.environ:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(lib)


hide_system_cuda()


# ---------------------------------------------------------------------------------------
# The host compiler and cache keys
# ---------------------------------------------------------------------------------------
def host_compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise CudaCompileError(
            "the CUDA C++ emulator needs a C++ compiler (g++ or clang++) and none was found. "
            "Install one (Debian/Ubuntu: `sudo apt install g++`; macOS: `xcode-select --install`).")
    return cxx


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    """The compiler's own description of itself: a new compiler rebuilds the cache."""
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return cxx


def _dir_digest(h, d: Path | None, recursive: bool = True):
    if d is None or not Path(d).is_dir():
        return
    for p in sorted(Path(d).rglob("*") if recursive else Path(d).glob("*")):
        if p.suffix in (".h", ".cuh", ".hpp", ".inc") and p.is_file():
            h.update(str(p.relative_to(d)).encode() + b"\0" + p.read_bytes())


def headers_digest(include_dir: Path | None = None) -> str:
    """A digest of every header a kernel may include (the emulator's, the course's prelude,
    and the kernel's own directory): a change to any of them rebuilds the kernels."""
    from .nvrtc_compat import INCLUDE_DIR
    h = hashlib.sha256()
    for d in (EMU_DIR, paths.CUDA_INCLUDE_DIR, INCLUDE_DIR):
        _dir_digest(h, d)
    _dir_digest(h, include_dir, recursive=False)  # a kernel's folder may be large: its own headers only
    return h.hexdigest()


def cache_key(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode() + b"\0")
    return h.hexdigest()[:24]


def emulator_key(cxx: str, flags) -> str:
    """What every emulator build depends on besides its source: compiler, flags, headers."""
    return cache_key(compiler_version(cxx), " ".join(flags), headers_digest(), sys.platform)


#: The optimisation of a load_inline, setup.py or CMake build against the emulator (after
#: EMU_FLAGS: the last -O wins). Such a build compiles torch/extension.h, and g++ takes about
#: 17 s for it at -O1 against 24 s at -O2; its kernels run a lesson's few launches.
EXTENSION_OPT = "-O1"


def extension_flags() -> list[str]:
    """Flags of a load_inline or setup.py build against the emulator. The key makes torch's
    build cache see a new compiler or a changed emulator header (it hashes the flags)."""
    flags = EMU_FLAGS + [EXTENSION_OPT]
    return flags + [f"-DCOURSE_TOOLCHAIN_KEY={emulator_key(host_compiler(), flags)}"]


def write_atomic(path: Path, data: bytes):
    """Write ``path`` through a unique temporary file: parallel workers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------
# NVRTC
# ---------------------------------------------------------------------------------------
#: What NVRTC lacks compared with nvcc: the C headers of the host compiler (the course's
#: stand-ins are in runtime/backends/cuda/nvrtc_include, see runtime/backends/cuda/nvrtc_compat.py)
#: and host code (set aside where no device code names it). The macros kernels have always had here without an
#: include come from this prelude.
NVRTC_PRELUDE = r"""
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
"""
#: Host-only headers: the CUDA runtime's and its host libraries', and the C++ library's that
#: kernels do not use. NVRTC compiles device code only and has none of them, so they are left
#: out, and the host code that uses them is set aside (a kernel that names one of their
#: functions is refused: "identifier ... is undefined").
_HOST_HEADERS = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"](cuda_runtime\.h|cuda_runtime_api\.h|cuda\.h|device_launch_parameters\.h|"
    r"cuda_profiler_api\.h|curand\.h|cufft\.h|cusparse\.h|"
    r"iostream|fstream|sstream|iomanip|string|vector|map|unordered_map|set|algorithm|numeric|functional|"
    r"memory|chrono|random|thread|mutex|time\.h|ctime|sys/time\.h|unistd\.h|strings\.h|exception|stdexcept|typeinfo)[>\"][^\n]*$",
    re.M)


#: cuBLAS's headers: host code, but they include cuda_fp16.h and cuda_bf16.h, on which code
#: that includes only cuBLAS may rely for __half and __nv_bfloat16.
_CUBLAS_HEADERS = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"](cublas_v2|cublas_api|cublasLt)\.h[>\"][^\n]*$", re.M)


def _without_host_headers(text: str) -> str:
    return _CUBLAS_HEADERS.sub("#include <cuda_fp16.h>\n#include <cuda_bf16.h>",
                               _HOST_HEADERS.sub("", text))


def nvrtc_source(text: str, filename: str, include_dir: Path | None = None) -> str:
    """The source as NVRTC compiles it: the prelude, then the learner's lines (with the quoted
    headers of ``include_dir`` put in place), where the host code that no device code names
    is blanked (nvcc compiles it for the CPU; NVRTC refuses every host function)."""
    from ._source import strip_comments
    from .nvrtc_compat import expand_includes, set_aside_host
    text = expand_includes(text, filename, include_dir, strip=_without_host_headers)
    return NVRTC_PRELUDE + f'#line 1 "{filename}"\n' + set_aside_host(text, strip_comments(text))


class NvrtcResult:
    def __init__(self, ok: bool, log: str, ptx: str = "", cubin: bytes = b"", lowered: dict | None = None):
        self.ok, self.log, self.ptx, self.cubin, self.lowered = ok, log, ptx, cubin, lowered or {}


class Nvrtc:
    """libnvrtc through ctypes: nothing but the library itself is needed."""

    def __init__(self, path: Path):
        self.path = path
        # libnvrtc opens its builtins library by name at compile time; loading it first from
        # the same directory makes that work without LD_LIBRARY_PATH.
        builtins = (sorted(path.parent.glob("libnvrtc-builtins.so*"))
                    + sorted(path.parent.glob("libnvrtc-builtins*.dylib")))
        for b in builtins:
            if ".alt." not in b.name:
                ctypes.CDLL(str(b), mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(str(path))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _bytes(self, prog, size_fn, get_fn) -> bytes:
        n = ctypes.c_size_t()
        if getattr(self.lib, size_fn)(prog, ctypes.byref(n)) != 0 or n.value == 0:
            return b""
        buf = ctypes.create_string_buffer(n.value)
        getattr(self.lib, get_fn)(prog, buf)
        return buf.raw[:n.value]

    def compile(self, source: str, filename: str, options, name_expressions=(), cubin: bool = False) -> NvrtcResult:
        lib = self.lib
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None)
        if rc != 0:
            return NvrtcResult(False, lib.nvrtcGetErrorString(rc).decode())
        try:
            for e in name_expressions:
                lib.nvrtcAddNameExpression(prog, e.encode())
            opts = [o.encode() for o in options]
            rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            log = self._bytes(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            log = log.rstrip(b"\0").decode(errors="replace")
            if rc != 0:
                return NvrtcResult(False, log or lib.nvrtcGetErrorString(rc).decode())
            lowered = {}
            for e in name_expressions:
                out = ctypes.c_char_p()
                if lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(out)) == 0 and out.value:
                    lowered[e] = out.value.decode()
            ptx = self._bytes(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode(errors="replace")
            code = self._bytes(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN") if cubin else b""
            return NvrtcResult(True, log, ptx, code, lowered)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


_NVRTC: list = []


def nvrtc(required: str | None = None) -> Nvrtc | None:
    """The NVRTC library, or None when it is not installed (then ``required``, if given,
    names the feature in a ``ToolkitMissing`` error)."""
    if not _NVRTC:
        path = find_library("libnvrtc.so") or find_library("libnvrtc")
        try:
            _NVRTC.append(Nvrtc(path) if path else None)
        except OSError:
            _NVRTC.append(None)
    if _NVRTC[0] is None and required:
        raise ToolkitMissing(f"{required} needs NVRTC, NVIDIA's CUDA C++ compiler library "
                             f"(pip package nvidia-cuda-nvrtc), and it is not installed. {INSTALL_HINT}")
    return _NVRTC[0]


def nvrtc_options(arch: str, include_dir: Path | None = None, extra=()) -> list[str]:
    incs = [str(paths.CUDA_INCLUDE_DIR)] + ([str(include_dir)] if include_dir else []) + nvrtc_include_dirs()
    return [f"-arch={arch}", "-std=c++17", *[f"-I{d}" for d in incs], *extra]


def default_arch() -> str:
    """``sm_XY`` of this machine's GPU when there is one, else ``sm_90`` (an H100)."""
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # a broken driver: fall back to the course's reference GPU
        pass
    return "sm_90"


def _check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not re.fullmatch(r"(sm|compute)_\d+[a-z]?", arch.strip()):
        raise ValueError(f"arch must look like 'sm_90' (an H100) or 'sm_80' (an A100), got {arch!r}")
    return arch.strip()


def _cache_dir(what: str) -> Path:
    return Path(paths.CACHE_DIR) / what


#: False only in tests of the emulator itself, which call host code from kernels on purpose.
NVRTC_PARITY = True


def nvrtc_check(text: str, name: str, filename: str, include_dir: Path | None):
    """Compile ``text`` with NVRTC as a GPU would (to PTX for sm_90), and raise
    ``CudaCompileError`` with NVRTC's message if it fails. A success is cached on disk; a failure
    is not (a header installed later, or a fixed include path, must be seen at once). Without
    NVRTC (no wheels, e.g. on macOS) this checks nothing."""
    nv = nvrtc()
    if nv is None or not NVRTC_PARITY:
        return
    src = nvrtc_source(text, filename, include_dir)
    opts = nvrtc_options("compute_90", include_dir)
    key = cache_key("check", src, name, " ".join(opts), nv.version, headers_digest(include_dir))
    ok = _cache_dir("nvrtc-check") / f"{key}.ok"
    if ok.exists():
        return
    res = nv.compile(src, filename, opts, name_expressions=(name,))
    if res.ok:
        write_atomic(ok, b"")
        return
    msg = (f"CUDA C++ compilation of `{name}` failed (NVRTC, the compiler a GPU uses; the CPU emulator "
           f"would accept this code, but a GPU would not):\n{_clean_log(res.log, name)}")
    raise CudaCompileError(msg)


def _clean_log(log: str, name: str) -> str:
    lines = []
    for line in log.strip().splitlines():
        if "name expression" in line and name in line:  # NVRTC's wording for a missing kernel
            line = (f"error: the source has no __global__ function named `{name}` (or it cannot be "
                    "instantiated with these template arguments)")
        lines.append(line)
    from .nvrtc_compat import INCLUDE_DIR
    for m in re.finditer(r'function "(\w+)\([^"]*\)" \(declared at line \d+ of [^)]*nvrtc_include/(\w+\.h)\) '
                         r'cannot be referenced -- it is a deleted function', log):
        lines.append(f"hint: {m.group(1)}() of <{m.group(2)}> exists only on the host (the C library): a kernel "
                     "cannot call it")
    lines = [line.replace(str(INCLUDE_DIR) + "/", "") for line in lines]
    if "host functions are not allowed" in log:
        lines.append("hint: a kernel can only call device functions: mark the helper `__device__` "
                     "(or `__host__ __device__` to use it on both sides)")
    return "\n".join(lines)


#: Macros of torch's CUDA headers that the emulator provides everywhere, but that nvcc only
#: knows when the source includes one of torch's c10/cuda or ATen/cuda headers (all of them
#: include c10/cuda/CUDAException.h).
_TORCH_CUDA_MACROS = re.compile(r"\b(C10_CUDA_KERNEL_LAUNCH_CHECK|C10_CUDA_CHECK|C10_CUDA_CHECK_WARN)\b")
_TORCH_CUDA_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](c10/cuda/|ATen/cuda/)', re.M)


def check_torch_cuda_includes(text: str, filename: str):
    """Reject, as nvcc would, a load_inline or setup.py source that uses torch's CUDA checks
    without including their header."""
    from ._source import strip_comments
    code = strip_comments(text)
    m = _TORCH_CUDA_MACROS.search(code)
    if m and not _TORCH_CUDA_INCLUDE.search(code):
        line = code.count("\n", 0, m.start()) + 1
        raise CudaCompileError(
            f"{filename}({line}): error: identifier \"{m.group(1)}\" is undefined\n"
            f"(nvcc on a GPU stops here: add `#include <c10/cuda/CUDAException.h>` to this source)")


# ---------------------------------------------------------------------------------------
# NVRTC for the device code of load_inline and setup.py sources
# ---------------------------------------------------------------------------------------
#: What marks a top-level declaration as device code.
_DEVICE_MARK = re.compile(r"\b(__global__|__device__|__constant__|__managed__)\b")
#: What only host code uses: torch, pybind11, the standard library, kernel launches, the CUDA
#: runtime and the course's host macros. Other top-level declarations (types, constants, plain
#: helper functions) stay, so that a kernel calling a host helper is rejected as nvcc would.
_HOST_ONLY = re.compile(r"\b(torch|at|c10|pybind11|py|std)\s*(::|;)|\b(PYBIND11|TORCH|AT|C10)_|<<<|"
                        r"\bcuda[A-Z]\w*\s*\(|\b(CUDA_CHECK|CHECK_INPUT)\b|"
                        r"\b(cublas|cublasLt|cufft|cusparse|cusolver|cudnn|nccl)[A-Z]\w*")  # NVIDIA's host libraries
#: Headers a kernel may need, which NVRTC has; every other <...> header is host code.
_DEVICE_HEADERS = re.compile(r'^\s*#\s*include\s*(<(cooperative_groups|cuda_fp16\.h|cuda_bf16\.h|mma\.h|'
                             r'cuda_pipeline|cuda/)[^>]*>|"common\.h")')
_KEPT_DIRECTIVES = re.compile(r"^\s*#\s*(define|undef|if|ifdef|ifndef|elif|else|endif)\b")
_DEVICE_HINT = re.compile(r"\b(__global__|__device__|__constant__)\b")


def device_part(text: str) -> str | None:
    """The device code of a source that mixes host code (torch, pybind) with kernels, for
    NVRTC, which cannot compile host code: top-level ``__global__``/``__device__``
    functions and variables, ``__constant__`` data, macros, ``common.h``, and the types and
    plain helpers they may use. Every other character becomes a blank and newlines stay, so
    NVRTC's line numbers are the learner's. None when there is no kernel."""
    part = _device_part(text)
    return part and part[0]


#: Top-level declarations that are not functions, and the name of one that is.
_NOT_A_FUNCTION = re.compile(r"\s*(template\s*<.*>\s*)?(struct|class|union|enum|typedef|using)\b", re.S)
#: ``template void launcher<float>(...);`` instantiates a host function, which is left out.
_EXPLICIT_INSTANTIATION = re.compile(r"\s*(extern\s+)?template\b(?!\s*<)")
_FUNCTION_NAME = re.compile(r"[^=(]*?\b(\w+)\s*\(", re.S)


def _device_part(text: str) -> tuple[str, set[int]] | None:
    """``device_part`` and the lines of the host helpers it kept (as a kernel calls them)."""
    from ._source import strip_comments
    from .nvrtc_compat import scan_declaration
    code = strip_comments(text)
    if not _DEVICE_HINT.search(code):
        return None
    n = len(code)
    keep = bytearray(n)  # 1 where the character is kept
    device, helpers = [], []
    i = 0
    while i < n:
        c = code[i]
        if c.isspace():
            i += 1
            continue
        if c == "#":  # a preprocessor line, with its continuations
            j = i
            while True:
                e = code.find("\n", j)
                e = n if e < 0 else e
                if e > 0 and code[e - 1] == "\\" and e < n:
                    j = e + 1
                    continue
                break
            line = code[i:e]
            if _KEPT_DIRECTIVES.match(line) or _DEVICE_HEADERS.match(line):
                keep[i:e] = b"\1" * (e - i)
            i = e
            continue
        if c == "}":  # the end of a namespace or extern "C" block that was kept open
            keep[i] = 1
            i += 1
            continue
        # One top-level declaration: up to `;` or to the `}` that closes its body.
        start = i
        j, head_end, opens = scan_declaration(code, start)
        if j >= n:
            break
        end = j + 1
        head = code[start:head_end if head_end is not None else end]
        body = code[start:end]
        if opens:
            keep[start:end] = b"\1" * (end - start)  # namespace X { : kept open
        elif _DEVICE_MARK.search(head):
            keep[start:end] = b"\1" * (end - start)
            device.append(body)
        elif not _HOST_ONLY.search(body) and not _EXPLICIT_INSTANTIATION.match(head):
            f = None if _NOT_A_FUNCTION.match(head) else _FUNCTION_NAME.match(head)
            if f:
                helpers.append((start, end, f.group(1)))
            else:  # a type, a constant
                keep[start:end] = b"\1" * (end - start)
        i = end
    # A plain (host) function stays only where device code calls it: NVRTC rejects every host
    # function, nvcc only those that a kernel calls.
    dev_code = "\n".join(device)
    helper_lines = set()
    for start, end, name in helpers:
        if re.search(rf"(?<![\w.>:]){re.escape(name)}\s*\(", dev_code):
            keep[start:end] = b"\1" * (end - start)
            first = code.count("\n", 0, start) + 1
            helper_lines.update(range(first, first + code.count("\n", start, end) + 1))
    kept = "".join(ch if keep[k] or ch == "\n" else " " for k, ch in enumerate(code))
    return "\n".join(line.rstrip() for line in kept.split("\n")), helper_lines


#: NVRTC errors that can come from what the extraction left out (a type, a header, a macro
#: of the host code) rather than from the kernel: a source whose device part fails only like
#: this may still be fine for nvcc, and the host compiler checks it anyway.
_MAYBE_EXTRACTION = re.compile(r'is undefined|has no member|is not a template|must be a class or namespace|'
                               r'incomplete type|explicit type is missing|expected a|not a type name|'
                               r'cannot open source file|undefined type|is not a member|namespace name|'
                               r'from a __host__ function\b')


def _error_line(error: str, filename: str) -> int:
    m = re.match(rf"{re.escape(filename)}\((\d+)\)", error.strip())
    return int(m.group(1)) if m else 0


def nvrtc_check_device_code(text: str, filename: str, include_dir: Path | None = None):
    """``nvrtc_check`` for the kernels of a source that also has host code (load_inline,
    setup.py, CMake): only its device part is compiled; sources without a kernel pass."""
    nv = nvrtc()
    if nv is None or not NVRTC_PARITY:
        return
    part = _device_part(text)
    if part is None:
        return
    dev, helper_lines = part
    src = nvrtc_source(dev, filename)
    opts = nvrtc_options("compute_90", include_dir)
    key = cache_key("check-device", src, " ".join(opts), nv.version, headers_digest(include_dir))
    ok = _cache_dir("nvrtc-check") / f"{key}.ok"
    if ok.exists():
        return
    res = nv.compile(src, filename, opts)
    # A host function in the part (a struct's method, say) that no kernel calls: nvcc accepts
    # it, so its error is left out, and so are warnings.
    log, errors, skipping = [], [], False
    for line in res.log.splitlines():
        if line.startswith(f"{filename}(") or line.startswith("Remark"):
            # warnings too: the blanked host code leaves functions "never referenced"
            skipping = ": error" not in line or ("not allowed in JIT mode" in line
                                                 and _error_line(line, filename) not in helper_lines)
            if not skipping and ": error" in line:
                errors.append(line)
        elif re.match(r"\d+ errors? detected", line):
            skipping = False
            continue
        if not skipping:
            log.append(line)
    if res.ok or not errors or any(_MAYBE_EXTRACTION.search(e) for e in errors):
        write_atomic(ok, b"")
        return
    log = _clean_log("\n".join(log), "")
    raise CudaCompileError(f"CUDA C++ compilation of the kernels in `{filename}` failed (NVRTC, the compiler a "
                           f"GPU uses; the CPU emulator would accept this code, but nvcc on a GPU would not):\n{log}")


# ---------------------------------------------------------------------------------------
# PTX, SASS, resources
# ---------------------------------------------------------------------------------------
#: Code that needs an architecture-specific target (sm_90a): wgmma and setmaxnreg, which
#: kernels/cuda/hopper.h wraps, exist only there.
_ARCH_SPECIFIC = re.compile(r'#\s*include\s*[<"]hopper\.h[>"]|\bwgmma\.|\bsetmaxnreg\.')


def specific_arch(text: str, arch: str) -> str:
    """``arch`` (``sm_90``, ``compute_90``), with the architecture-specific ``a`` (``sm_90a``)
    for a Hopper when ``text`` uses what only that target has."""
    if re.fullmatch(r"(sm|compute)_90", arch) and _ARCH_SPECIFIC.search(text):
        return arch + "a"
    return arch


def compile_for_gpu(text: str, name: str, filename: str, include_dir: Path | None, arch: str,
                    what: str, extra=()) -> tuple[NvrtcResult, str]:
    """(NVRTC's result with the PTX, the cubin and ptxas's report, the kernel's mangled name)."""
    nv = nvrtc(required=what)
    arch = specific_arch(text, _check_arch(arch))
    sm = arch.replace("compute_", "sm_")
    # On a machine with a GPU driver, NVRTC keeps compiled code in the driver's compute cache,
    # and a cached compile prints no ptxas report: the cache is off for this compile.
    before = os.environ.get("CUDA_CACHE_DISABLE")
    os.environ["CUDA_CACHE_DISABLE"] = "1"
    try:
        res = nv.compile(nvrtc_source(text, filename, include_dir), filename,
                         nvrtc_options(sm, include_dir, ["-Xptxas=-v", *extra]), name_expressions=(name,), cubin=True)
    finally:
        if before is None:
            os.environ.pop("CUDA_CACHE_DISABLE", None)
        else:
            os.environ["CUDA_CACHE_DISABLE"] = before
    if res.ok and "Used " not in res.log:
        res.log += _ptxas_report(res.ptx, sm)
    if not res.ok:
        raise CudaCompileError(f"CUDA C++ compilation of `{name}` failed (NVRTC):\n{_clean_log(res.log, name)}")
    return res, res.lowered.get(name, name)


def _ptxas_report(ptx: str, sm: str) -> str:
    """ptxas's -v report, from ptxas itself (when NVRTC gave none)."""
    tool = find_tool("ptxas")
    if tool is None:
        return ""
    with tempfile.TemporaryDirectory(prefix="course-ptxas-") as d:
        f = Path(d, "kernel.ptx")
        f.write_text(ptx)
        proc = subprocess.run([str(tool), "-v", f"-arch={sm}", str(f), "-o", str(Path(d, "kernel.cubin"))],
                              capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


def sass(cubin: bytes, mangled: str, line_info: bool = False) -> str:
    """The SASS of one kernel of a cubin, from ``nvdisasm`` (with ``//## File "...", line N``
    comments when ``line_info`` and the cubin was compiled with ``-lineinfo``)."""
    tool = find_tool("nvdisasm")
    if tool is None:
        raise ToolkitMissing("cuda_sass needs nvdisasm, NVIDIA's disassembler (pip package "
                             f"nvidia-cuda-nvdisasm), and it is not installed. {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="course-sass-") as d:
        f = Path(d, "kernel.cubin")
        f.write_bytes(cubin)
        proc = subprocess.run([str(tool), *(["-g"] if line_info else []), "-c", str(f)], capture_output=True,
                              text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed:\n{proc.stderr}")
    out, keep = [], False
    for line in proc.stdout.splitlines():
        head = re.match(r"//-+ (\S+)\s+-+", line)
        if head:  # "//------ .text.<kernel> ------": a new section starts
            keep = head.group(1) == f".text.{mangled}"
        if keep:
            out.append(line)
    while out and re.search(r"\bNOP\b|^\s*$|^\.L_x_\d+:$", out[-1]):
        out.pop()  # padding to the section's alignment
    return "\n".join(out) if out else proc.stdout


def without_line_comments(sass_text: str) -> str:
    """SASS from ``sass(..., line_info=True)`` without its ``//## File "...", line N`` comments."""
    return "\n".join(line for line in sass_text.splitlines() if not line.lstrip().startswith("//##"))


_PTXAS = {
    "registers": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "shared_bytes": r"(\d+) bytes smem",
    "local_bytes": r"(\d+) bytes stack frame",
    "constant_bytes": r"(\d+) bytes cmem\[0\]",
}


def resources(log: str, ptx: str, mangled: str) -> dict:
    """The resources of one kernel from ptxas's ``-v`` report (and ``__launch_bounds__``)."""
    block = log
    m = re.search(rf"Compiling entry function '{re.escape(mangled)}'.*?(?=Compiling entry function|\Z)", log, re.S)
    if m:
        block = m.group(0)
    out = {}
    for k, pat in _PTXAS.items():
        hit = re.search(pat, block)
        out[k] = int(hit.group(1)) if hit else 0
    # The most threads a block may have: 1024, fewer with __launch_bounds__, and fewer when the
    # registers of a full block do not fit in one SM's 65536 (allocated per warp, 256 at a time).
    limit = 1024
    ent = re.search(rf"\.entry {re.escape(mangled)}\b.*?\{{", ptx, re.S)
    ntid = re.search(r"\.maxntid\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", ent.group(0)) if ent else None
    if ntid:
        limit = 1
        for g in ntid.groups():
            limit *= int(g or 1)
    if out["registers"]:
        per_warp = -(-out["registers"] * 32 // 256) * 256
        limit = min(limit, 65536 // per_warp * 32)
    out["max_threads_per_block"] = limit
    return out
