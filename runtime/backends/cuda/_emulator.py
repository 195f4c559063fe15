"""The CPU path of ``cuda_kernel``: compile with g++ against ``emu/cuda_emu.h``, load the
library with ctypes, and launch on CPU tensors.

Tensor arguments are copied into buffers that sit between two inaccessible (PROT_NONE)
guard regions, so a read or write past either end of a tensor stops the kernel with a
`KernelFault` that names the argument; after the launch the results are copied back.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from ... import paths
from ...tma import EMULATOR_BASE_OFFSET, emulated_map_base
from . import _racecheck
from ._errors import KernelFault
from ._source import CODE_NAMES, CudaCompileError, Param, _closing, project_headers, strip_comments
from ._toolchain import (
    EMU_DIR,
    EMU_FLAGS,
    KERNEL_LIB_FLAGS,
    compiler_version,
    emulator_key,
    headers_digest,
    host_compiler,
    write_atomic,
)

EMU_HEADER = EMU_DIR / "cuda_emu.h"
CXX_FLAGS = EMU_FLAGS + KERNEL_LIB_FLAGS
_CACHE: dict[str, "EmuLibrary"] = {}
_LAUNCH_LOCK = threading.RLock()  # one launch at a time: the emulator's state is global


class LaunchParams(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_ulonglong), ("schedule", ctypes.c_int),
                ("seed", ctypes.c_ulonglong), ("stack_pool", ctypes.c_ulonglong), ("racecheck", ctypes.c_int)]


class FaultInfo(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("sig", ctypes.c_int), ("is_write", ctypes.c_int),
                ("thread", ctypes.c_int * 3), ("block", ctypes.c_int * 3),
                ("addr", ctypes.c_ulonglong), ("msg", ctypes.c_char * 8192)]


def compiler() -> str:
    return host_compiler()


def entry_code(name: str) -> str:
    """The two functions Python calls: the kernel's signature as the compiler sees it, and
    the launch that unpacks an argument array into a call of the kernel."""
    return (
        "\n#line 1 \"<course-entry>\"\n"
        f"static auto emu_kernel_ptr_ = &{name};\n"
        "EMU_API const char* emu_signature() { return ::emu::signature(emu_kernel_ptr_); }\n"
        "EMU_API int emu_run(const emu_launch_params* p, void** a) "
        "{ return ::emu::launch_from_python(emu_kernel_ptr_, p, a); }\n")


def entries_code(names) -> str:
    """The entry points of a library for every kernel of ``names``: ``emu_signature_<i>`` and
    ``emu_run_<i>`` for ``names[i]``, and ``emu_entry_names``, the names in that order."""
    lines = ["\n#line 1 \"<course-entry>\""]
    for i, name in enumerate(names):
        lines += [f"static auto emu_kernel_ptr_{i}_ = &{name};",
                  f"EMU_API const char* emu_signature_{i}() {{ return ::emu::signature(emu_kernel_ptr_{i}_); }}",
                  f"EMU_API int emu_run_{i}(const emu_launch_params* p, void** a) "
                  f"{{ return ::emu::launch_from_python(emu_kernel_ptr_{i}_, p, a); }}"]
    lines.append(f'EMU_API const char* emu_entry_names() {{ return "{",".join(names)}"; }}')
    return "\n".join(lines) + "\n"


class _Entry:
    """The library as one of its kernels sees it: ``emu_run`` is that kernel's entry point,
    every other symbol the library's own."""

    def __init__(self, cdll, run):
        self._cdll, self.emu_run = cdll, run

    def __getattr__(self, attr):
        return getattr(self._cdll, attr)


class EmuLibrary:
    """A compiled kernel library (with ``index``, the kernel ``index`` of a library that has
    entry points for several kernels, see `entries_code`)."""

    def __init__(self, path: Path, index: int | None = None, cdll=None):
        self.path = path
        self.lib = cdll if cdll is not None else ctypes.CDLL(str(path))
        if index is not None:
            sig_f, run_f = getattr(self.lib, f"emu_signature_{index}"), getattr(self.lib, f"emu_run_{index}")
            self.lib = _Entry(self.lib, run_f)
        else:
            sig_f, run_f = self.lib.emu_signature, self.lib.emu_run
        sig_f.restype = ctypes.c_char_p
        run_f.argtypes = [ctypes.POINTER(LaunchParams), ctypes.POINTER(ctypes.c_void_p)]
        run_f.restype = ctypes.c_int
        self.lib.emu_fault.restype = ctypes.POINTER(FaultInfo)
        self.signature = [c for c in sig_f().decode().split(",") if c]
        layout = (ctypes.c_ulonglong * 3)()
        self.lib.emu_stack_layout(layout)
        self.stack_layout = tuple(layout)
        self.racecheck = bool(self.lib.emu_race_instrumented())
        self.profile = bool(self.lib.emu_prof_instrumented())  # the profiling variant (_profile.py)
        self.lib.emu_race_info.restype = ctypes.POINTER(_racecheck.RaceInfo)
        self.lib.emu_race_begin.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong),
                                            ctypes.POINTER(ctypes.c_ulonglong)]
        self.source, self.filename = "", ""


_STACK_POOLS: dict[tuple, int] = {}


def stack_pool(layout: tuple) -> int:
    """One pool of fiber stacks for every kernel library of the process: (count, stride,
    guard) as the library lays it out, each stack above an inaccessible guard page."""
    if layout not in _STACK_POOLS:
        count, stride, guard = layout
        total = count * stride
        base = _libc.mmap(None, total, _PROT_RW, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError("cannot reserve the emulator's thread stacks")
        for i in range(count):
            _libc.mprotect(base + i * stride, guard, _PROT_NONE)
        _STACK_POOLS[layout] = base
    return _STACK_POOLS[layout]


def build(text: str, name: str, filename: str, include_dir: Path | None,
          racecheck: bool = False, profile: bool = False) -> EmuLibrary:
    """Compile (or fetch from the caches) the emulated kernel ``name`` of ``text``; with
    ``racecheck`` instrumented for race detection (see _racecheck.py); with ``profile`` the
    profiling variant, which is also instrumented for race detection (see _profile.py).

    One library serves every kernel of a source: the first build of a kernel compiles the
    source once with entry points for each of its kernels that can have one (see
    `entry_kernels`), and the other kernels of the source come from that library. A kernel
    that cannot have such an entry (a template, an overloaded name, ...), or a source whose
    library with all entries does not build, gets a library of its own, as the messages of
    a failed build are those of that library."""
    lib = _build_shared(text, name, filename, include_dir, racecheck, profile)
    if lib is not None:
        return lib
    return _build_one(text, name, filename, include_dir, racecheck=racecheck, profile=profile)


def _setup(text: str, include_dir: Path | None, racecheck: bool, profile: bool):
    """(compiler, flags, the project's headers as the emulator needs them, their digest)."""
    cxx = compiler()
    flags = list(CXX_FLAGS)
    if os.environ.get("COURSE_EMU_UCONTEXT", "") not in ("", "0"):
        flags.append("-DEMU_FORCE_UCONTEXT")  # the portable fiber switch, also on x86-64
    if racecheck or profile:
        flags += _racecheck.FLAGS
    if profile:
        from . import _profile
        flags += _profile.flags(cxx)
    if sys.platform.startswith("linux"):  # the header's exit() and __assert_fail win over the C library's
        flags.append("-Wl,-Bsymbolic-functions")
    headers = project_headers(text, include_dir) if include_dir is not None else {}
    adapted = hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in sorted(headers.items())).encode()).hexdigest()[:24]
    return cxx, flags, headers, adapted


def _key(full: str, cxx: str, flags: list[str], include_dir: Path | None, adapted: str) -> str:
    return hashlib.sha256("\0".join([full, emulator_key(cxx, flags), str(include_dir),
                                     headers_digest(include_dir), adapted]).encode()).hexdigest()[:24]


def _compile(full: str, out: Path, cxx: str, flags: list[str], include_dir: Path | None,
             headers: dict[str, str], adapted: str, racecheck: bool) -> str | None:
    """Compile ``full`` into ``out`` (and its warnings beside it); None, or g++'s messages."""
    cache_dir = out.parent
    # -isystem: the emulator's and the prelude's own warnings stay silent, the learner's show
    incs = ["-isystem", str(EMU_DIR), "-isystem", str(paths.CUDA_INCLUDE_DIR)]
    if include_dir is not None:
        incs = ["-I", str(include_dir)] + incs
    if headers:  # the project's headers as the emulator needs them, found before the originals
        folder = cache_dir / "cuda-emu-headers" / adapted
        for rel, body in headers.items():
            if not (folder / rel).is_file():
                write_atomic(folder / rel, body.encode())
        incs = ["-I", str(folder)] + incs
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir)
    os.close(fd)
    obj = tmp + ".o" if racecheck else tmp  # instrumented: linked apart, without the sanitizer's runtime
    rt = runtime_object(cxx, flags)  # the launcher's machinery, compiled once: only the kernel here
    if rt:
        flags = [*flags, "-DEMU_RUNTIME_SPLIT"]
    pch = precompiled_header(cxx, flags)
    cmd = [cxx, *flags, *pch, *incs, "-x", "c++", "-", "-o", obj] + (["-c"] if racecheck else ["-x", "none", *rt])
    proc = subprocess.run(cmd, input=full, capture_output=True, text=True)
    if pch:  # the messages read as without it
        proc.stderr = proc.stderr.replace(f"In file included from {pch[1]}:1:", "In file included from <stdin>:1:")
    compile_log = proc.stderr  # the learner's warnings come from the compile, not the link
    if proc.returncode == 0 and racecheck:
        proc = subprocess.run([cxx, "-shared", *[f for f in flags if f.startswith("-Wl,")], obj, *rt, "-o", tmp],
                              capture_output=True, text=True)
        os.unlink(obj)
    if proc.returncode != 0:
        os.unlink(tmp)
        if os.path.exists(obj):
            os.unlink(obj)
        return proc.stderr
    warn = _warnings_of(compile_log)
    write_atomic(out.with_suffix(".warnings"), warn.encode())
    os.replace(tmp, out)  # atomic: a parallel process never loads half a file
    return None


def _build_one(text: str, name: str, filename: str, include_dir: Path | None, _retry: bool = True,
               racecheck: bool = False, profile: bool = False) -> EmuLibrary:
    """The library of the one kernel ``name`` of ``text`` (see `build`)."""
    full = ('#include "cuda_emu.h"\n'
            f'#line 1 "{filename}"\n' + text + entry_code(name))
    cxx, flags, headers, adapted = _setup(text, include_dir, racecheck, profile)
    racecheck = racecheck or profile  # (both are compiled apart and linked without a runtime)
    key = _key(full, cxx, flags, include_dir, adapted)
    if key in _CACHE:
        if not profile:  # (the profiling variant's warnings are the normal build's, shown already)
            _show_warnings(_CACHE[key].path)
        return _CACHE[key]
    cache_dir = Path(paths.CACHE_DIR) / "cuda-emu"
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = cache_dir / f"{key}.so"
    if not out.exists() or out.stat().st_size == 0:
        err = _compile(full, out, cxx, flags, include_dir, headers, adapted, racecheck)
        if err is not None:
            raise CudaCompileError(_compile_message(name, filename, err))
    if not profile:
        _show_warnings(out)
    try:
        lib = EmuLibrary(out)
    except (OSError, AttributeError) as e:  # a damaged cache entry: build it again, once
        out.unlink(missing_ok=True)
        missing = re.search(r"undefined symbol: (\S+)", str(e))
        if missing:  # not damage: the source calls a function that it only declares
            raise CudaCompileError(_undefined_message(name, filename, missing.group(1))) from None
        if not _retry:
            raise
        return _build_one(text, name, filename, include_dir, _retry=False, racecheck=racecheck,
                          profile=profile)
    lib.source, lib.filename = text, filename
    _CACHE[key] = lib
    return lib


_SHARED: dict[str, dict[str, EmuLibrary]] = {}  # key of a library of several kernels -> name -> its view
_SHARED_FAILED: set[str] = set()  # keys of such libraries that did not build: each kernel builds alone


@functools.lru_cache(maxsize=64)
def entry_kernels(text: str) -> tuple[str, ...]:
    """The kernels of ``text`` that a library of the whole source gives an entry point, in
    the order of the source: every ``__global__`` function defined at file scope (not in a
    namespace, not ``static``) that is not a template and whose name no other ``__global__``
    function has (``&name`` names it alone). Kernels written by macros are not seen."""
    code = strip_comments(text)
    code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', code)  # (a brace in a string is no block)
    code = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", code, flags=re.M)  # directives, macros
    code = re.sub(r"\b__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)", " ", code)
    code = re.sub(r"\b__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", " ", code)
    depth_at, depth = [], 0
    for c in code:
        depth_at.append(depth)
        depth += (c == "{") - (c == "}")
    found: dict[str, list[bool]] = {}  # name -> for each definition, whether it can have an entry
    for m in re.finditer(r"\b__global__\b", code):
        d = re.match(r"([^;{}()]*?)\(", code[m.end():])
        if not d:
            continue
        decl = d.group(1).rstrip()
        nm = re.search(r"(::\s*)?\b([A-Za-z_]\w*)$", decl)
        close = _closing(code, m.end() + d.end() - 1, "(", ")")
        if close < 0:
            continue
        body = re.match(r"[^;{]*\{", code[close + 1:])
        if not nm or not body:
            continue  # a declaration (the definition counts), or a name the reader does not see
        head_start = max(code.rfind(c, 0, m.start()) for c in ";{}") + 1
        head = code[head_start:m.start()] + " " + decl
        ok = (nm.group(1) is None and depth_at[m.start()] == 0
              and not re.search(r"\b(template|static|inline|__forceinline__|operator)\b", head))
        found.setdefault(nm.group(2), []).append(ok)
    return tuple(n for n, oks in found.items() if oks == [True])


def _build_shared(text: str, name: str, filename: str, include_dir: Path | None,
                  racecheck: bool, profile: bool) -> EmuLibrary | None:
    """The view for ``name`` of the library of every kernel of ``text``, or None where the
    kernel is to have a library of its own (see `build`). A compile error of the learner's
    code is raised as `_build_one` raises it."""
    if include_dir is None and filename == re.sub(r"\W", "_", name) + ".cu":
        return None  # a text named after its kernel (read_source): the messages name each kernel's own
    names = entry_kernels(text)
    if name not in names or len(names) < 2:
        return None
    full = ('#include "cuda_emu.h"\n'
            f'#line 1 "{filename}"\n' + text + entries_code(names))
    cxx, flags, headers, adapted = _setup(text, include_dir, racecheck, profile)
    key = _key(full, cxx, flags, include_dir, adapted)
    views = _SHARED.get(key)
    if views is not None and name in views:
        if not profile:  # (the profiling variant's warnings are the normal build's, shown already)
            _show_warnings(views[name].path)
        return views[name]
    if key in _SHARED_FAILED:
        return None
    cache_dir = Path(paths.CACHE_DIR) / "cuda-emu"
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = cache_dir / f"{key}.so"
    failed = out.with_suffix(".failed")
    if failed.exists():
        _SHARED_FAILED.add(key)
        return None
    if not out.exists() or out.stat().st_size == 0:
        err = _compile(full, out, cxx, flags, include_dir, headers, adapted, racecheck or profile)
        if err is not None:
            if "<course-entry>" not in err:  # the learner's code: the same messages as a library of its own
                raise CudaCompileError(_compile_message(name, filename, err))
            _SHARED_FAILED.add(key)  # an entry that cannot be formed: each kernel builds alone
            write_atomic(failed, b"")
            return None
    try:
        cdll = ctypes.CDLL(str(out))
        cdll.emu_entry_names.restype = ctypes.c_char_p
        if tuple(cdll.emu_entry_names().decode().split(",")) != names:
            raise OSError("entry table does not match")
        views = {n: EmuLibrary(out, i, cdll) for i, n in enumerate(names)}
    except (OSError, AttributeError):  # damaged, or a symbol missing: the kernel's own library tells
        out.unlink(missing_ok=True)
        _SHARED_FAILED.add(key)
        return None
    for v in views.values():
        v.source, v.filename = text, filename
    _SHARED[key] = views
    if not profile:
        _show_warnings(out)
    return views[name]


_PCH: dict[str, list[str]] = {}


def precompiled_header(cxx: str, flags: list[str]) -> list[str]:
    """``-include`` flags that give g++ ``cuda_emu.h`` precompiled, or ``[]``. Parsing the header
    is about a quarter of compiling a small kernel, and a run of the tests builds hundreds of
    kernel libraries. One precompiled header per compiler, set of flags (plain, race detection,
    profiling) and version of the emulator's headers, in .cache/cuda-emu-pch/, made by the first
    build that needs it. The libraries and the messages are the same with it as without; where
    it cannot be made, or g++ finds it unusable, g++ reads the header as before."""
    cflags = [f for f in flags if f != "-shared" and not f.startswith("-Wl,")]  # link flags: no part of it
    key = emulator_key(cxx, cflags)
    if key in _PCH:
        return _PCH[key]
    _PCH[key] = []
    if "Free Software Foundation" not in compiler_version(cxx):  # clang names its precompiled headers apart
        return []
    folder = Path(paths.CACHE_DIR) / "cuda-emu-pch" / key
    header = folder / "cuda_emu_pch.h"  # includes the real header through -isystem: its warnings stay silent
    gch = folder / "cuda_emu_pch.h.gch"
    if not gch.is_file():
        write_atomic(header, b"#include <cuda_emu.h>\n")
        fd, tmp = tempfile.mkstemp(suffix=".gch", dir=folder)
        os.close(fd)
        proc = subprocess.run([cxx, *cflags, "-isystem", str(EMU_DIR), "-x", "c++-header", str(header), "-o", tmp],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            return []
        os.replace(tmp, gch)  # atomic: a parallel build never reads half a file
    _PCH[key] = ["-include", str(header)]
    return _PCH[key]


_RUNTIME: dict[str, list[str]] = {}  # emulator key -> [the runtime object] or [] (build each library whole)


def runtime_object(cxx: str, flags: list[str]) -> list[str]:
    """``[path]`` of the emulator's launcher machinery (``launch``, the block scheduler, the fault
    and race reports, the ``__tsan_*`` hooks: ``EMU_RT`` and ``EMU_RUNTIME_IMPL`` in cuda_emu.h)
    compiled for these flags, or ``[]``. It is most of the code of a kernel's library, the same
    for every kernel: compiled once per compiler, set of flags and version of the headers, in
    .cache/cuda-emu-rt/, and linked into each library (each keeps its own copy and its own
    state), a kernel's build generates code for the kernel alone (about half the time). Where it
    cannot be made, or the compiler is not g++, each library is compiled whole, as before."""
    cflags = [f for f in flags if f != "-shared" and not f.startswith("-Wl,")]
    key = emulator_key(cxx, cflags)
    if key in _RUNTIME:
        return _RUNTIME[key]
    _RUNTIME[key] = []
    if "Free Software Foundation" not in compiler_version(cxx):  # tried with g++ (gnu_inline's meaning)
        return []
    folder = Path(paths.CACHE_DIR) / "cuda-emu-rt" / key
    obj = folder / "emu_runtime.o"
    if not obj.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=folder)
        os.close(fd)
        proc = subprocess.run([cxx, *cflags, "-DEMU_RUNTIME_IMPL", "-isystem", str(EMU_DIR), "-x", "c++", "-",
                               "-c", "-o", tmp], input='#include "cuda_emu.h"\n', capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            return []
        os.replace(tmp, obj)  # atomic: a parallel build never links half a file
    _RUNTIME[key] = [str(obj)]
    return _RUNTIME[key]


def _warnings_of(stderr: str) -> str:
    """The compiler's warnings about the learner's code, paths of the emulator removed."""
    lines = [line.replace(str(EMU_DIR) + os.sep, "") for line in stderr.splitlines() if "<course-entry>" not in line]
    return "\n".join(lines).strip()


def _show_warnings(lib_path: Path):
    """Print the warnings of a build in the cell, at every build (also a cached one)."""
    w = lib_path.with_suffix(".warnings")
    text = w.read_text() if w.exists() else ""
    if text:
        print(f"CUDA C++ compiler warnings:\n{text}", file=sys.stderr)


def _undefined_message(name: str, filename: str, symbol: str) -> str:
    if symbol.startswith("_Z"):
        try:
            symbol = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip() or symbol
        except OSError:
            pass
    return (f"CUDA C++ compilation of `{name}` failed (emulator build with g++):\n{filename}: error: `{symbol}` is "
            "declared but not defined in this source. The emulator builds the file on its own (host code "
            "included), so a function that another file of its program defines is missing: define it here, "
            "or leave out the code that calls it")


def _compile_message(name: str, filename: str, stderr: str) -> str:
    lines = []
    for line in stderr.splitlines():
        if "<course-entry>" in line:
            if "error" in line:
                lines.append(f"{filename}: error: the source has no __global__ function named `{name}` "
                             "(or it cannot be called with these template arguments)")
            continue
        lines.append(line.replace(str(EMU_DIR) + os.sep, ""))
    body = "\n".join(lines).strip()
    return f"CUDA C++ compilation of `{name}` failed (emulator build with g++):\n{body}"


# ---------------------------------------------------------------------------------------
# Guarded buffers
# ---------------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.fflush.argtypes = [ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")
_PROT_NONE, _PROT_RW = 0, 3
_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x02, 0x20, 0x4000
if sys.platform == "darwin":
    _MAP_ANONYMOUS, _MAP_NORESERVE = 0x1000, 0x40
CANARY = 0xFF  # reads of the slack give NaN (float) or -1 (int): never a plausible answer


def _round(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class GuardedBuffer:
    """``nbytes`` of memory whose end touches an inaccessible region, with a large
    inaccessible region before it as well. The data start is 16-byte aligned (float4
    loads work); the few bytes between the data's end and the guard, and before its start
    on the same page, are filled with a canary that is checked after the launch."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.padded = _round(nbytes, 16)
        self.guard = min(max(1 << 20, _round(nbytes, PAGE)), 64 << 20)
        self.data_pages = _round(max(self.padded, 1), PAGE)
        self.total = self.guard + self.data_pages + self.guard
        base = _libc.mmap(None, self.total, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError("cannot map guarded memory for a kernel argument")
        self.base = base
        self.page_start = base + self.guard
        if _libc.mprotect(self.page_start, self.data_pages, _PROT_RW) != 0:
            _libc.munmap(base, self.total)
            raise MemoryError("cannot map guarded memory for a kernel argument")
        self.end = self.page_start + self.data_pages
        self.start = self.end - self.padded
        ctypes.memset(self.page_start, CANARY, self.data_pages)

    def canary_damage(self) -> str | None:
        """'before' or 'after' when the kernel wrote into the canary bytes, else None."""
        head = self.start - self.page_start
        if head and ctypes.string_at(self.page_start, head).strip(b"\xff"):
            return "before"
        tail = self.padded - self.nbytes
        if tail and ctypes.string_at(self.start + self.nbytes, tail).strip(b"\xff"):
            return "after"
        return None

    def where(self, addr: int) -> str | None:
        if self.base <= addr < self.page_start:
            return "before"
        if self.end <= addr < self.base + self.total:
            return "after"
        if self.start <= addr < self.end:
            return "inside"
        return None

    def free(self):
        if self.base:
            _libc.munmap(self.base, self.total)
            self.base = 0


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------
_SCALAR_CTYPES = {"f": ctypes.c_float, "d": ctypes.c_double, "i": ctypes.c_int32, "I": ctypes.c_uint32,
                  "l": ctypes.c_int64, "L": ctypes.c_uint64, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
                  "h": ctypes.c_int16, "H": ctypes.c_uint16, "c": ctypes.c_int8, "b": ctypes.c_int8,
                  "B": ctypes.c_uint8, "?": ctypes.c_bool}
_INT_RANGES = {"i": (-2**31, 2**31 - 1), "I": (0, 2**32 - 1), "l": (-2**63, 2**63 - 1), "q": (-2**63, 2**63 - 1),
               "L": (0, 2**64 - 1), "Q": (0, 2**64 - 1), "h": (-2**15, 2**15 - 1), "H": (0, 2**16 - 1),
               "c": (-128, 127), "b": (-128, 127), "B": (0, 255), "?": (0, 1)}
#: pointee code -> tensor dtypes it may point into
POINTEE_DTYPES = {
    "f": {torch.float32}, "d": {torch.float64}, "i": {torch.int32}, "I": {torch.int32, torch.uint32},
    "l": {torch.int64}, "q": {torch.int64}, "L": {torch.int64, torch.uint64}, "Q": {torch.int64, torch.uint64},
    "h": {torch.int16}, "H": {torch.int16, torch.uint16}, "c": {torch.int8, torch.uint8, torch.bool},
    "b": {torch.int8}, "B": {torch.uint8, torch.bool}, "?": {torch.bool},
    "e": {torch.float16}, "E": {torch.bfloat16},  # __half, __nv_bfloat16 (emu/cuda_fp16.h, cuda_bf16.h)
}
_DTYPE_C = {torch.float32: "float", torch.float64: "double", torch.int32: "int", torch.int64: "long long",
            torch.int16: "short", torch.int8: "signed char", torch.uint8: "unsigned char", torch.bool: "bool",
            torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def describe_code(code: str) -> str:
    if code.startswith("p"):
        const = code.startswith("pc")
        inner = code[2:] if const else code[1:]
        base = CODE_NAMES.get(inner, "a struct or vector type" if inner.startswith("x") else inner)
        return ("const " if const else "") + base + "*"
    return CODE_NAMES.get(code, "a struct type")


#: 16-bit floats passed by value: (torch dtype, significant bits, smallest normal exponent, largest exponent)
_HALF_FORMATS = {"e": (torch.float16, 11, -14, 15), "E": (torch.bfloat16, 8, -126, 127)}


def half_bits(x: float, code: str) -> int:
    """The bits of ``x`` as a ``__half`` ("e") or ``__nv_bfloat16`` ("E"), rounded to nearest
    even from the double directly, as CUDA's __double2half / __double2bfloat16 do (through
    float first, the rounding could differ)."""
    _, digits, emin, emax = _HALF_FORMATS[code]
    if math.isnan(x):
        return 0x7FFF  # CUDA's canonical NaN
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a != math.inf:
        exp = max(math.frexp(a)[1] - 1, emin) - (digits - 1)  # the spacing of representable values
        a = math.ldexp(round(math.ldexp(a, -exp)), exp)  # exact scaling; round() ties to even
    if a >= math.ldexp(1.0, emax + 1):
        return sign | (0x7C00 if code == "e" else 0x7F80)
    if code == "e":
        return sign | struct.unpack("<H", struct.pack("<e", a))[0]
    return sign | struct.unpack("<I", struct.pack("<f", a))[0] >> 16


def _half_arg(kname: str, p: Param, code: str, value) -> ctypes.c_uint16:
    import numbers
    dtype = _HALF_FORMATS[code][0]
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == dtype:
        return ctypes.c_uint16(int(value.view(torch.int16).item()) & 0xFFFF)
    if isinstance(value, numbers.Real):
        return ctypes.c_uint16(half_bits(float(value), code))
    got = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
           else type(value).__name__)
    raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}` (passed by value): pass a Python float "
                    f"(converted to {describe_code(code)}, rounding to nearest even) or a 0-dim {dtype} tensor, "
                    f"got {got}")


def convert_scalar(kname: str, p: Param, code: str, value):
    """A Python number as the C type ``code`` of parameter ``p`` (ctypes object)."""
    import numbers
    if code in _HALF_FORMATS:
        return _half_arg(kname, p, code, value)
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{kname}: argument `{p.name}` is declared `{describe_code(code)}` (a number), "
                        f"but got a tensor; pass a Python number (use .item() for a one-element tensor)")
    if code.startswith("x") or code not in _SCALAR_CTYPES:
        raise TypeError(f"{kname}: argument `{p.name}` has a type ({p.ctype or describe_code(code)}) that the course's "
                        "launcher cannot pass from Python; use pointers and plain numbers")
    if code in ("f", "d"):
        if not isinstance(value, numbers.Real):
            raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}`, got {type(value).__name__}")
        return _SCALAR_CTYPES[code](float(value))
    if isinstance(value, bool) or (isinstance(value, numbers.Integral)):
        v = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer() is False:
        raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}` (an integer), got {value!r}")
    elif isinstance(value, numbers.Real):
        raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}` (an integer), got float {value!r}; "
                        "pass an int")
    else:
        raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}`, got {type(value).__name__}")
    lo, hi = _INT_RANGES[code]
    if not lo <= v <= hi:
        raise ValueError(f"{kname}: argument `{p.name}` = {v} does not fit in `{describe_code(code)}` "
                         f"(range {lo}..{hi})" + ("; declare it `long long` or `size_t`" if code in "iI" else ""))
    return _SCALAR_CTYPES[code](v)


def check_tensor(kname: str, p: Param, code: str, t: torch.Tensor, device: torch.device):
    """The argument of pointer parameter ``p``: a contiguous torch tensor on ``device``, of the
    pointee's dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}`: pass a torch tensor, "
                        f"got {type(t).__name__}")
    if t.device.type != device.type:
        raise TypeError(f"{kname}: argument `{p.name}` is on {t.device}, but kernels run on {device} here "
                        f"(use tensors on utils.DEVICE)")
    if not t.is_contiguous():
        raise ValueError(f"{kname}: argument `{p.name}` is not contiguous (a kernel sees raw memory); "
                         "pass x.contiguous()")
    pointee = code[2:] if code.startswith("pc") else code[1:]
    allowed = POINTEE_DTYPES.get(pointee)
    if allowed is not None and t.dtype not in allowed:
        raise TypeError(f"{kname}: argument `{p.name}` is `{describe_code(code)}` but the tensor is {t.dtype} "
                        f"({_DTYPE_C.get(t.dtype, str(t.dtype))} elements); convert it, e.g. x.to(torch.float32)")


def check_arg_count(kname: str, params: list[Param], args):
    if len(args) != len(params):
        names = ", ".join(f"{p.ctype} {p.name}".strip() for p in params)
        raise TypeError(f"{kname} takes {len(params)} argument{'s' if len(params) != 1 else ''} ({names}), "
                        f"got {len(args)}")


# ---------------------------------------------------------------------------------------
# printf capture: kernel printf writes to file descriptor 1; the notebook shows sys.stdout.
# ---------------------------------------------------------------------------------------
class CaptureStdout:
    def __enter__(self):
        try:
            sys.stdout.flush()
        except Exception:
            pass
        _libc.fflush(None)
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(1)
        os.dup2(self.tmp.fileno(), 1)
        return self

    def __exit__(self, *exc):
        _libc.fflush(None)
        os.dup2(self.saved, 1)
        os.close(self.saved)
        self.tmp.seek(0)
        data = self.tmp.read()
        self.tmp.close()
        if data:
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        return False


# ---------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------
def python_handles_interrupts():
    """Give SIGINT back to Python after a launch. A kernel library catches it while its threads
    run (the notebook's stop button) and puts the previous handler back; re-installing Python's
    own makes sure the next Ctrl-C reaches Python whatever path the launch took out (a fault,
    another library's emulator state). Only the main thread may set signal handlers."""
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        # a fiber switch that unwound through a fault may leave SIGINT blocked in this thread
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


SIGNALS = {11: "SIGSEGV", 7: "SIGBUS", 8: "SIGFPE", 4: "SIGILL", 6: "SIGABRT", 2: "SIGINT", 10: "SIGBUS"}


def _fmt3(v) -> str:
    return f"({v[0]},{v[1]},{v[2]})"


def launch(lib: EmuLibrary, kname: str, params: list[Param], grid, block, shared: int, args,
           schedule: int, seed: int, capture: bool, profiler=None, racecheck: bool | None = None):
    """Run the kernel on CPU tensors. ``profiler`` (a _profile.Recorder, with a profiling
    library) collects the counters of this launch; ``racecheck`` overrides whether an
    instrumented library checks for races."""
    sig = lib.signature
    check_races = lib.racecheck if racecheck is None else bool(racecheck and lib.racecheck)
    check_arg_count(kname, params, args)
    if len(sig) != len(args):  # the compiler knows best; names come from the parser
        raise TypeError(f"{kname} takes {len(sig)} arguments, got {len(args)}")
    cpu = torch.device("cpu")
    holders, tensors = [], []  # (index, tensor, const)
    for k, (p, code, a) in enumerate(zip(params, sig, args)):
        if code.startswith("p"):
            if a is None:
                holders.append(ctypes.c_void_p(0))
                continue
            check_tensor(kname, p, code, a, cpu)
            tensors.append((k, a, code.startswith("pc")))
            holders.append(None)
        else:
            holders.append(convert_scalar(kname, p, code, a))
    # Tensors that share memory (in-place kernels pass the same tensor twice) share one
    # guarded buffer, so the kernel sees the aliasing it would see on a GPU.
    groups: list[dict] = []
    for k, t, const in tensors:
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        for g in groups:
            if lo < g["hi"] and g["lo"] < hi or (lo == g["lo"] and hi == g["hi"]):
                g["lo"], g["hi"] = min(g["lo"], lo), max(g["hi"], hi)
                g["members"].append((k, t, const))
                break
        else:
            groups.append({"lo": lo, "hi": hi, "members": [(k, t, const)]})
    buffers = []
    try:
        for g in groups:
            buf = GuardedBuffer(g["hi"] - g["lo"])
            g["buf"] = buf
            buffers.append(buf)
            if g["hi"] > g["lo"]:
                ctypes.memmove(buf.start, g["lo"], g["hi"] - g["lo"])
            for k, t, const in g["members"]:
                holders[k] = ctypes.c_void_p(buf.start + (t.data_ptr() - g["lo"]))
        _retarget_tensor_maps(groups)
        argv = (ctypes.c_void_p * max(1, len(holders)))()
        for k, h in enumerate(holders):
            argv[k] = ctypes.cast(ctypes.pointer(h), ctypes.c_void_p)
        lp = LaunchParams((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared, schedule, seed,
                          stack_pool(lib.stack_layout), int(check_races))
        with _LAUNCH_LOCK:
            # The race detector watches the buffers the kernel may write: a tensor passed only
            # as `const T*` is read by every thread, which is never a race.
            watched = [g for g in groups if any(not const for _, _, const in g["members"])]
            if check_races:  # the shadows of the argument buffers
                n = len(watched)
                lo = (ctypes.c_ulonglong * max(1, n))(*[g["buf"].start for g in watched])
                ln = (ctypes.c_ulonglong * max(1, n))(*[g["hi"] - g["lo"] for g in watched])
                if lib.lib.emu_race_begin(n, lo, ln) != 0:
                    raise MemoryError("cannot map the race detector's shadow memory")
            rc = -1
            try:
                if profiler is not None:
                    profiler.begin(lib, groups)
                if capture:
                    with CaptureStdout():
                        rc = lib.lib.emu_run(ctypes.byref(lp), argv)
                else:
                    rc = lib.lib.emu_run(ctypes.byref(lp), argv)
            finally:
                if check_races:
                    lib.lib.emu_race_end()
                if profiler is not None:  # the counters are read (after a success) and freed
                    profiler.end(lib, collect=rc == 0)
                python_handles_interrupts()
            fault = lib.lib.emu_fault().contents if rc else None
            if rc == 8:
                raise _race_fault(lib, kname, params, watched)
            if rc:
                _raise_fault(kname, params, rc, fault, groups)
        for g in groups:
            damage = g["buf"].canary_damage()
            if damage:
                names = " / ".join(f"`{params[k].name}`" for k, _, _ in g["members"])
                raise KernelFault(f"{kname} wrote {'before the first' if damage == 'before' else 'past the last'} "
                                  f"element of {names} (the kernel changed bytes just "
                                  f"{'before its start' if damage == 'before' else 'after its end'}). "
                                  "Check the index bounds: `if (i < n)`.")
            if g["hi"] > g["lo"] and any(not const for _, _, const in g["members"]):
                ctypes.memmove(g["lo"], g["buf"].start, g["hi"] - g["lo"])
    finally:
        for b in buffers:
            b.free()


def _retarget_tensor_maps(groups) -> None:
    """A TMA tensor map (runtime.tma) holds its tensor's address. When that tensor is also an
    argument of the launch, the kernel works on the argument's guarded copy: the map's copy is
    pointed at it, so that what a TMA store writes is copied back with the kernel's other
    stores (and a TMA load sees them), as on a GPU, where both are one memory."""
    for g in groups:
        for k, t, const in g["members"]:
            if t.dtype != torch.uint8 or t.numel() != 128:
                continue
            at = g["buf"].start + (t.data_ptr() - g["lo"])
            base = emulated_map_base(at)
            if base is None:
                continue
            for h in groups:
                if h["lo"] <= base < h["hi"]:
                    ctypes.c_uint64.from_address(at + EMULATOR_BASE_OFFSET).value = h["buf"].start + base - h["lo"]
                    break


def _race_fault(lib, kname, params, groups) -> KernelFault:
    info = lib.lib.emu_race_info().contents
    where = None
    if info.space == 1 and 0 <= info.region < len(groups):
        g = groups[info.region]
        addr = g["lo"] + info.offset  # as an address of the original tensors
        k, t, _ = next((m for m in g["members"]
                        if m[1].data_ptr() <= addr < m[1].data_ptr() + m[1].numel() * m[1].element_size()),
                       g["members"][0])
        where = f"{params[k].name}[{(addr - t.data_ptr()) // t.element_size()}]"
    return _racecheck.report(kname, info, lib, where or "a tensor argument")


def _raise_fault(kname, params, rc, f, groups):
    thread, block = _fmt3(f.thread), _fmt3(f.block)
    msg = f.msg.decode("utf-8", errors="replace")
    if rc == 1 and ("mbarrier" in msg or "wgmma" in msg):  # Hopper's waits: the report names the cause
        raise KernelFault(f"{kname}: {msg}")
    if rc == 1:
        raise KernelFault(f"{kname}: {msg}\nEvery thread of a block must reach the same __syncthreads() "
                          "(and every lane named in a warp collective's mask must reach it): do not put it "
                          "inside a branch that only some threads take, and do not `return` before it.")
    if rc == 3:
        raise KeyboardInterrupt(f"{kname} interrupted in thread {thread} of block {block}")
    if rc == 4:
        raise ValueError(f"{kname}: {msg}")
    if rc == 5:
        raise KernelFault(f"{kname}: {msg} (thread {thread} of block {block})")
    if rc == 7:
        raise KernelFault(f"{kname}: {msg}")
    if rc == 6:
        raise KernelFault(f"{kname}: thread {thread} of block {block} overflowed its stack ({msg}): "
                          "local arrays too large, or unbounded recursion")
    signame = SIGNALS.get(f.sig, f"signal {f.sig}")
    addr = int(f.addr)
    who = f"thread {thread} of block {block}"
    verb = {1: "wrote", 0: "read"}.get(f.is_write, "accessed")
    if f.sig in (11, 7, 10):
        for g in groups:
            where = g["buf"].where(addr)
            if where in ("before", "after"):
                members = g["members"]
                k, t, _ = members[0]
                if where == "after":
                    k, t, _ = max(members, key=lambda m: m[1].data_ptr() + m[1].numel() * m[1].element_size())
                else:
                    k, t, _ = min(members, key=lambda m: m[1].data_ptr())
                p = params[k]
                esz = t.element_size()
                idx = (addr - (g["buf"].start + t.data_ptr() - g["lo"])) // esz
                n = t.numel()
                raise KernelFault(
                    f"{kname}: {who} {verb} `{p.name}[{idx}]`, "
                    f"{'before the start' if where == 'before' else 'past the end'} of argument `{p.name}` "
                    f"({n} element{'s' if n != 1 else ''}, valid indices "
                    f"{'0..' + str(n - 1) if n else 'none'}). Guard the access with `if (i < n)`.")
        if addr < 65536:
            raise KernelFault(f"{kname}: {who} {verb} address 0x{addr:x}: a null pointer (an argument passed as "
                              "None, or a pointer never set)")
        raise KernelFault(f"{kname}: {who} {verb} address 0x{addr:x}, which is not inside any tensor argument "
                          f"({signame}): a wild pointer or an index far out of range")
    if f.sig == 8:
        raise KernelFault(f"{kname}: {who} raised an arithmetic error ({signame}): integer division or "
                          "modulo by zero")
    if f.sig == 6:
        raise KernelFault(f"{kname}: {who} called abort() or failed an assert ({signame})")
    raise KernelFault(f"{kname}: {who} crashed ({signame}): illegal instruction (a non-void function "
                      "that does not return a value?)")
