"""CuTe on the host: small C++ programs that use CuTe's headers, compiled by g++ and run, with
no GPU and no CUDA toolkit (lesson 12; ``runtime/cute_layouts.py`` is what a notebook calls).

    print(cute.cute_run("print_layout(make_layout(make_shape(4, 8), make_stride(8, 1)));"))
    cute.cute_include_dirs()      # [.../cutlass_library/source/include, .../nvidia/cu13/include/cccl, ...]

CuTe (CUTLASS's layout algebra, ``cute/layout.hpp``) is header-only C++ that a host compiler
compiles. Its headers come with NVIDIA's ``nvidia-cutlass`` wheel (``cutlass_library/source/include``);
CuTe includes CCCL's ``<cuda/std/...>`` and ``cuda_runtime_api.h``, which come with the
``nvidia/cu13`` wheels of ``requirements.txt``, found as the rest of the course finds them
(``_toolchain.include_dirs``: the wheels, a system toolkit only where the course may use one).

A program is compiled once: its binary is cached in ``.cache/cute/``, keyed by the source, the
flags, the compiler and the headers, and written through a temporary file (parallel notebooks
never run half a binary); so is g++'s refusal of a program (its messages, ``<key>.refused``), and
CuTe's headers, precompiled once (``precompiled_header``: a small program then compiles in half
a second, not two and a half). ``$COURSE_CUTE_CACHE`` puts the cache elsewhere (a test of a cold cache). A
program may name the learner's expressions by ``#line`` labels: g++'s messages then point into
the expression, and a refusal raises ``CuteError`` that names it and gives g++'s first error,
not its template backtrace.

``gpu_library(path)`` builds a CUDA C++ file that uses CUTLASS (its SM90 GEMM,
``kernels/cuda/hopper_cutlass.cu``) into a shared library with nvcc, for a Hopper GPU: CUTLASS's
host code encodes the tensor maps and its device code is inline PTX, which only nvcc compiles
and only the GPU runs (the course's emulator runs ``hopper.h``'s functions, not CUTLASS's PTX).
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import paths
from .backends.cuda import _toolchain
from .backends.cuda._source import CudaCompileError

__all__ = ["CuteError", "CuteUnavailable", "cute_include_dirs", "cute_run", "gpu_library"]

#: g++'s flags. -Og: the programs run for milliseconds, and g++ compiles CuTe's many small
#: functions faster when it inlines them than at -O0, where it emits every one (a quarter less
#: time); -w: the CUDA headers' deprecation warnings are noise here; g++ stops after a few errors.
FLAGS = ["-std=c++17", "-Og", "-w", "-fmax-errors=3", "-fno-diagnostics-color"]
#: Where the binaries are kept, under ``paths.CACHE_DIR`` (``cache_dir``).
CACHE_FOLDER = "cute"
#: The environment variable that puts the cache elsewhere (a test of a cold cache).
CACHE_ENV = "COURSE_CUTE_CACHE"
#: The headers of each kind of program: the layout algebra, swizzles and tensors
#: (``make_identity_tensor``, ``local_partition``, ``print_layout``), or those and the MMA atoms,
#: which take about twice as long to parse (``mma_atom.hpp`` includes every architecture's, SM90's
#: GMMA too, and ``copy_atom.hpp`` the copy atoms, TMA's too).
HEADERS = {
    "layout": ["cute/layout.hpp", "cute/swizzle_layout.hpp", "cute/pointer_flagged.hpp", "cute/tensor_impl.hpp",
               "cute/util/print_tensor.hpp"],
    "mma": ["cute/tensor.hpp", "cute/atom/mma_atom.hpp", "cute/atom/copy_atom.hpp"],
}
TIERS = tuple(HEADERS)
#: Names in C++ that need the MMA atoms' headers.
_NEEDS_MMA = re.compile(r"\bSM\d\d_|\bGMMA\b|\bMMA_Atom\b|\bTiled(MMA|Copy)\b|\bmake_tiled_(mma|copy)\b|"
                        r"\bCopy_Atom\b|\bUniversalCopy\b|\b(copy|gemm|axpby|fill|clear)\s*\(")

INSTALL = ("`pip install nvidia-cutlass==4.2.0` (the course's `./course lab` or `./course test` installs "
           "requirements.txt)")


class CuteError(RuntimeError):
    """CuTe could not evaluate an expression: g++ refused the program, or the program failed."""


class CuteUnavailable(_toolchain.ToolkitMissing):
    """A piece CuTe needs here is not installed: a host C++ compiler, CuTe's headers
    (``nvidia-cutlass``), or the CCCL and CUDA runtime headers (the ``nvidia/cu13`` wheels)."""


# ---------------------------------------------------------------------------------------
# The headers and the compiler
# ---------------------------------------------------------------------------------------
def cute_include_dirs() -> list[Path]:
    """The folders g++ searches, in order: CuTe's (``cutlass_library/source/include``), CCCL's
    (``<cuda/std/...>``), the CUDA runtime's. ``CuteUnavailable`` says what to install."""
    spec = importlib.util.find_spec("cutlass_library")  # found, not imported: its Python part is not needed
    cute = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if Path(loc, "source", "include", "cute", "layout.hpp").is_file():
            cute = Path(loc, "source", "include")
    if cute is None and not sys.platform.startswith("linux"):
        raise CuteUnavailable("CuTe's headers and the CCCL headers they include come in NVIDIA's wheels for Linux "
                              "(x86-64, arm64), which the course installs there: run this part on a Linux machine or "
                              "a free cloud notebook.")
    if cute is None:
        raise CuteUnavailable("CuTe's headers are not installed (they come in NVIDIA's `nvidia-cutlass` wheel, "
                              f"as cutlass_library/source/include): {INSTALL}.")
    cuda = [Path(d) for d in _toolchain.include_dirs()]
    std = [d for d in cuda if (d / "cuda" / "std").is_dir()]
    rt = [d for d in cuda if (d / "cuda_runtime_api.h").is_file()]
    if not std or not rt:
        raise CuteUnavailable("CuTe includes <cuda/std/...> (CCCL) and cuda_runtime_api.h, and this machine has "
                              f"neither as wheels nor as a toolkit the course may use. {_toolchain.INSTALL_HINT}")
    return [cute] + std + [d for d in rt if d not in std]


def compiler() -> str:
    """The host C++ compiler (``_toolchain.host_compiler``), or ``CuteUnavailable``."""
    try:
        return _toolchain.host_compiler()
    except CudaCompileError:
        raise CuteUnavailable("CuTe is compiled here by a host C++ compiler (g++ or clang++), and none was found. "
                              "Install one (Debian/Ubuntu: `sudo apt install g++`; macOS: "
                              "`xcode-select --install`).") from None


def _headers_stamp(dirs: list[Path]) -> str:
    """What identifies the headers: the wheel's version, and a few files of each folder with
    their times and sizes (a reinstall rewrites them)."""
    try:
        parts = [importlib.metadata.version("nvidia-cutlass")]
    except importlib.metadata.PackageNotFoundError:
        parts = []
    for d in dirs:
        for f in ("cute/layout.hpp", "cutlass/version.h", "cuda/std/version", "cuda_runtime_api.h"):
            p = d / f
            if p.is_file():
                st = p.stat()
                parts.append(f"{p}:{st.st_mtime_ns}:{st.st_size}")
    return "|".join(parts)


def tier_of(code: str) -> str:
    """Which headers C++ code needs: ``"mma"`` or ``"layout"`` (see ``HEADERS``)."""
    return "mma" if _NEEDS_MMA.search(code) else "layout"


def includes(tier: str) -> str:
    """The ``#include`` lines of a program of that tier."""
    return "\n".join(["#include <cstdio>", *[f"#include <{h}>" for h in HEADERS[tier]]])


# ---------------------------------------------------------------------------------------
# Compile, cache, run
# ---------------------------------------------------------------------------------------
def binary_path(source: str) -> Path:
    """Where the binary of ``source`` is cached (whether or not it is there yet)."""
    cxx = compiler()
    dirs = cute_include_dirs()
    key = _toolchain.cache_key("cute", source, " ".join(FLAGS), _toolchain.compiler_version(cxx),
                               _headers_stamp(dirs))
    return cache_dir() / key


def cache_dir() -> Path:
    """The folder of the cache: ``.cache/cute/``, or ``$COURSE_CUTE_CACHE`` where it is set."""
    return Path(os.environ.get(CACHE_ENV) or Path(paths.CACHE_DIR) / CACHE_FOLDER)


def build(source: str, labels: dict[str, tuple[str, str]] | None = None) -> Path:
    """The binary of ``source``, from the cache or compiled now; a refusal raises ``CuteError``
    (found in the cache too, the second time), naming the expression, with g++'s whole log in
    ``.log``. ``labels`` are the source's ``#line`` files (label -> (what it is, the learner's
    text)): g++ runs in a folder that holds each under its label, so its messages quote the line."""
    labels = labels or {}
    binary = binary_path(source)
    if binary.is_file():
        return binary
    refused = binary.with_suffix(".refused")
    if refused.is_file():  # the same source was refused before, by the same compiler and headers
        raise compile_error(refused.read_text(), labels)
    cxx = compiler()
    incs = [f for d in cute_include_dirs() for f in ("-isystem", str(d))]
    # a program of either tier (a source of its own includes what it includes, no more)
    pch = precompiled_header(cxx, incs) if any(includes(t) in source for t in TIERS) else []
    binary.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=binary.name + ".", suffix=".tmp", dir=binary.parent)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="course-cute-") as work:
            for label, (_, text) in labels.items():
                Path(work, label).write_text(text + "\n")
            proc = subprocess.run([cxx, *FLAGS, *pch, *incs, "-x", "c++", "-", "-o", tmp], input=source, cwd=work,
                                  capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            if proc.returncode == 1 and ": error" in proc.stderr and "internal compiler error" not in proc.stderr:
                _toolchain.write_atomic(refused, proc.stderr.encode())  # a refusal, not a crash: kept too
            raise compile_error(proc.stderr, labels)
        os.replace(tmp, binary)  # atomic: nobody runs half a binary
    finally:
        Path(tmp).unlink(missing_ok=True)
    return binary


_PCH: dict[str, list[str]] = {}


def precompiled_header(cxx: str, incs: list[str]) -> list[str]:
    """``-include`` flags that give g++ the layout tier's headers precompiled (a ``.gch``), or
    ``[]``.

    Parsing CuTe's headers is most of compiling a small program (about 2 s for the layout
    tier's; the MMA atoms' take 2 s more), and g++ reads them precompiled in a fraction of a
    second. The MMA tier includes every header of the layout tier (``cute/tensor.hpp`` includes
    them), so one precompiled header serves both: an MMA program reads the rest of its headers
    after it. It is made once per compiler, set of flags and version of the headers, in
    ``pch/<key>/`` of the cache, by the first program that needs it (it costs about 2.5 parses),
    through a temporary file (a parallel build never reads half of one). A program keeps its
    ``#include`` lines (the headers' guards make them no-ops after it), so its binary and the
    messages a learner sees are the same with it as without (only the "In file included from"
    lines of ``.log`` name it); where it cannot be made, or g++ finds it unusable, g++ reads the
    headers as before. Clang names its precompiled headers apart: none there."""
    key = _toolchain.cache_key("cute-pch", includes("layout"), " ".join(FLAGS), " ".join(incs),
                               _toolchain.compiler_version(cxx), _headers_stamp(cute_include_dirs()))
    if key in _PCH:
        return _PCH[key]
    folder = cache_dir() / "pch" / key
    header, gch = folder / "cute_layout.h", folder / "cute_layout.h.gch"
    _PCH[key] = []
    if not gch.is_file():
        if "Free Software Foundation" not in _toolchain.compiler_version(cxx):
            return []
        _toolchain.write_atomic(header, (includes("layout") + "\n").encode())
        fd, tmp = tempfile.mkstemp(prefix=gch.name + ".", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            proc = subprocess.run([cxx, *FLAGS, *incs, "-x", "c++-header", str(header), "-o", tmp],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                return []
            os.replace(tmp, gch)  # atomic: a parallel build never reads half of it
        finally:
            Path(tmp).unlink(missing_ok=True)
    _PCH[key] = ["-include", str(header)]
    return _PCH[key]


def run(source: str, labels: dict[str, tuple[str, str]] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Build ``source`` (``build``) and run it: its exit status, stdout and stderr."""
    return subprocess.run([str(build(source, labels))], capture_output=True, text=True, timeout=timeout)


def cute_run(code: str) -> str:
    """Run C++ statements that use CuTe, and return what they printed::

        print(cute_run("print_layout(make_layout(make_shape(4, 8), make_stride(8, 1)));"))

    The statements are the body of ``main`` after ``using namespace cute;`` (``print``,
    ``print_layout``, ``print_latex``, any CuTe call); the headers follow from what they name
    (``tier_of``). A refusal or a failed run raises ``CuteError``."""
    if not isinstance(code, str) or not code.strip():
        raise TypeError(f"cute_run takes C++ statements as a string, got {code!r}")
    label = "course_code"
    source = "\n".join([includes(tier_of(code)), "using namespace cute;", "int main() {", f'#line 1 "{label}"',
                        code, "}", ""])
    proc = run(source, {label: ("the code", code.strip())})
    if proc.returncode != 0:
        raise CuteError(f"the code failed (exit status {proc.returncode})"
                        + (":\n" + proc.stderr.strip()[-2000:] if proc.stderr.strip() else ""))
    return proc.stdout


# ---------------------------------------------------------------------------------------
# CUTLASS's device code, for a GPU
# ---------------------------------------------------------------------------------------
#: nvcc's flags for a CUTLASS kernel on Hopper: sm_90a (wgmma, setmaxnreg are sm_90a's alone).
NVCC_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "-arch=sm_90a", "--expt-relaxed-constexpr", "-shared",
              "-Xcompiler", "-fPIC", "-w"]
_LIBS: dict[tuple, ctypes.CDLL] = {}


def gpu_library(path: Path) -> ctypes.CDLL:
    """The shared library of the CUDA C++ file ``path`` (which includes CUTLASS's headers), built
    by nvcc for sm_90a and cached in ``.cache/cute/sm90/`` by the source, the flags, nvcc's version
    and the headers (about a minute to build). ``CuteUnavailable`` where nvcc or the headers are
    missing; ``CuteError`` with nvcc's first errors where it refuses the file. Loaded once a
    process (a launcher calls it every time: then it costs a ``stat``)."""
    st = Path(path).stat()
    memo = (str(path), st.st_mtime_ns, st.st_size)
    if memo in _LIBS:
        return _LIBS[memo]
    nvcc = _toolchain.find_tool("nvcc")
    if nvcc is None:
        raise CuteUnavailable(f"{Path(path).name} uses CUTLASS's SM90 kernels, which only nvcc compiles (a CUDA "
                              "toolkit's) and only a Hopper GPU runs; this machine has no nvcc the course may use.")
    dirs = cute_include_dirs()
    util = dirs[0].parent / "tools" / "util" / "include"  # cutlass/util/packed_stride.hpp
    text = Path(path).read_text()
    version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    key = _toolchain.cache_key("cute-sm90", text, " ".join(NVCC_FLAGS), version, _headers_stamp(dirs))
    lib = cache_dir() / "sm90" / f"{Path(path).stem}-{key[:16]}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=lib.name + ".", suffix=".tmp", dir=lib.parent)
        os.close(fd)
        try:
            proc = subprocess.run([str(nvcc), *NVCC_FLAGS, "-I", str(dirs[0]), "-I", str(util), str(path), "-o", tmp],
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                errors = [x for x in proc.stderr.splitlines() if "error" in x][:5]
                shown = errors or proc.stderr.splitlines()[:12]
                raise CuteError(f"nvcc refused {Path(path).name}:\n" + "\n".join(shown))
            os.replace(tmp, lib)  # atomic: nobody loads half a library
        finally:
            Path(tmp).unlink(missing_ok=True)
    _LIBS[memo] = ctypes.CDLL(str(lib))
    return _LIBS[memo]


# ---------------------------------------------------------------------------------------
# g++'s messages, made short
# ---------------------------------------------------------------------------------------
_DIAG = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<kind>(?:fatal )?error|note|warning): "
                   r"(?P<msg>.*)$")
_HERE = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+):\s+required from")


def _short(line: str, dirs: list[str]) -> str:
    for d in dirs:
        line = line.replace(d.rstrip("/") + "/", "")
    return line if len(line) <= 400 else line[:400] + " ..."


def compile_error(log: str, labels: dict[str, tuple[str, str]]) -> CuteError:
    """A ``CuteError`` naming the expression g++ refused: g++'s first error with its quote, the
    place in the expression it comes from (an error inside CuTe's headers is "required from" a
    line of the learner's), then the learner's own further errors, one line each. Its ``.label``
    is the expression's label (None when the error is in none), ``.places`` the (file, line) of
    the first error and of each place it was required from, ``.log`` g++'s whole log."""
    try:
        dirs = [str(d) for d in cute_include_dirs()]
    except CuteUnavailable:
        dirs = []
    lines = log.splitlines()
    label, picked, chain, places = None, [], [], None
    for i, line in enumerate(lines):
        if line.startswith("In file included") or ": In instantiation of" in line or ": In function" in line:
            chain = []
        h = _HERE.match(line)
        if h:
            chain.append(h)
        m = _DIAG.match(line)
        if not m or "error" not in m.group("kind"):
            continue
        in_expr = m.group("file") in labels
        if places is not None:  # a later error: only the learner's own, one line each
            if in_expr and len(picked) < 12 and _short(line, dirs) not in picked:
                picked.append(_short(line, dirs))
            continue
        places = [(c.group("file"), int(c.group("line"))) for c in chain] + [(m.group("file"), int(m.group("line")))]
        here = next((c for c in chain if c.group("file") in labels), None)
        label = m.group("file") if in_expr else (here.group("file") if here else None)
        picked.append(_short(line, dirs))
        picked += [_short(f, dirs) for f in lines[i + 1:i + 3] if f.startswith(" ") and "|" in f]
        if not in_expr and here:
            text = labels[here.group("file")][1].splitlines()
            row, col = int(here.group("line")), int(here.group("col"))
            if 1 <= row <= len(text):
                picked += [f"  required from the expression, line {row}, column {col}:",
                           f"    {text[row - 1]}", "    " + " " * (col - 1) + "^"]
    what, text = labels.get(label, ("the program", ""))
    head = f"CuTe could not compile {what}: `{text}`" if text else f"CuTe could not compile {what}"
    body = "\n".join(picked) if picked else "\n".join(_short(x, dirs) for x in lines[:12])
    for lab in labels:
        body = body.replace(f"{lab}:", "expression:")
    err = CuteError(f"{head}\n{body}")
    err.label, err.places, err.log = label, places or [], log
    return err
