"""The learner's environment in one table: ``utils.report()`` (lesson 00 shows it).

It says how the course runs here (GPU or simulation, and why), which versions of the
Python packages it found, which GPU (if any), whether the CUDA C++ tool chain is there
(nvcc, g++, ninja) and where compiled kernels are cached. Nothing here changes state, and
nothing fails: a missing piece is reported as missing.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from runtime.config import DEVICE, MODE, REASON, SIMULATE
from runtime.paths import CACHE_DIR

__all__ = ["report", "environment"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _first_line(cmd: list[str], pick=None) -> str | None:
    """The first (or the picked) line a tool prints, or None if it is missing or fails."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if not lines:
        return None
    if pick:
        for ln in lines:
            if pick in ln:
                return ln
    return lines[0]


def _nvcc() -> str:
    # nvcc is often installed but not on PATH: look where CUDA installs it too
    candidates = [shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and Path(c).exists():
            line = _first_line([c, "--version"], pick="release")
            return f"{c} ({line})" if line else c
    return "not found (CUDA C++ kernels still run in simulation; on a GPU, install the CUDA toolkit)"


def _gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"{i}: {p.name}, compute capability {p.major}.{p.minor}, "
                   f"{p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
    return out


def _caches() -> dict[str, str]:
    try:
        from torch.utils.cpp_extension import get_default_build_root
        torch_ext = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    except Exception:
        torch_ext = os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    triton = os.environ.get("TRITON_CACHE_DIR", str(Path.home() / ".triton" / "cache"))
    numba = os.environ.get("NUMBA_CACHE_DIR", "next to each source file (__pycache__), when cache=True")
    return {
        # utils.cuda_kernel keeps NVRTC builds (GPU) and emulator builds (CPU) apart
        "course (CUDA C++ kernels)": str(CACHE_DIR / ("cuda-emu" if SIMULATE else "cuda-nvrtc")),
        "torch extensions (load_inline)": torch_ext,
        "triton": triton + ("  (not used: the interpreter compiles nothing)" if SIMULATE else ""),
        "numba": numba,
    }


def environment() -> dict:
    """Everything ``report()`` prints, as a dict (for tests and scripts)."""
    gpp = _first_line(["g++", "--version"])
    ninja = _first_line(["ninja", "--version"])
    if ninja is None:
        # pip installs ninja next to the interpreter; a kernel started without activating
        # the environment does not have that folder on PATH, and load_inline then fails
        local = Path(sys.executable).parent / "ninja"
        if local.exists():
            ninja = (f"{local} exists but is not on PATH: load_inline will not find it; "
                     f"start Jupyter from the activated environment (./course lab does)")
    return {
        "mode": MODE,
        "why": REASON,
        "device": str(DEVICE),
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(terse=True),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})",
        "triton": _version("triton"),
        "numba": _version("numba"),
        "numba-cuda": _version("numba-cuda"),
        "numpy": _version("numpy"),
        "gpus": _gpus(),
        "nvcc": _nvcc(),
        "g++": gpp or "not found (needed to build C++ extensions and the CUDA C++ emulator)",
        "ninja": f"{ninja}" if ninja else (
            "not found (torch's load_inline needs it: pip install ninja)"),
        "caches": _caches(),
    }


def report(file=None) -> None:
    """Print the environment: mode and why, versions, GPU, compilers, caches."""
    env = environment()
    rows = [
        ("mode", f"{env['mode'].upper()}: {env['why']}"),
        ("torch device", env["device"]),
        ("python", env["python"]),
        ("platform", env["platform"]),
        ("torch", env["torch"]),
        ("triton", env["triton"] + ("  (interpreter)" if SIMULATE else "")),
        ("numba", env["numba"]),
        ("numba-cuda", env["numba-cuda"] + ("  (CUDA simulator)" if SIMULATE else "")),
        ("numpy", env["numpy"]),
    ]
    if env["gpus"]:
        rows += [("GPU " + g.split(":", 1)[0], g.split(": ", 1)[1]) for g in env["gpus"]]
    else:
        rows.append(("GPU", "none"))
    rows += [("nvcc", env["nvcc"]), ("g++", env["g++"]), ("ninja", env["ninja"])]
    rows += [(f"cache: {k}", v) for k, v in env["caches"].items()]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), file=file or sys.stdout)
