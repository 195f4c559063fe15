"""Build a ``setup.py`` PyTorch extension with or without a GPU, from the same sources.

Use it exactly like torch's own classes::

    # setup.py
    import sys; sys.path.insert(0, "../..")     # the course root, so that `utils` imports
    from setuptools import setup
    from utils.extension import CUDAExtension, BuildExtension

    setup(name="myrelu",
          ext_modules=[CUDAExtension("myrelu", ["relu.cpp", "relu_kernel.cu"])],
          cmdclass={"build_ext": BuildExtension})

and build with ``python setup.py build_ext --inplace`` (or ``pip install .``).

* With a GPU: these ARE ``torch.utils.cpp_extension.CUDAExtension`` and ``BuildExtension``
  (nvcc compiles the ``.cu`` files), plus the course's include directory, so
  ``#include "common.h"`` works.
* Without one: the extension is built as a C++ extension against the course's CUDA
  emulator. Each ``.cu`` file is translated into a ``.cpp`` file inside the build
  directory (``<<<...>>>`` launches, ``extern __shared__``, CUDA-only headers; see
  ``runtime/backends/cuda/``); nothing is copied into the project. Host code written for CUDA tensors
  (``x.is_cuda()``, ``torch::kCUDA``) is adapted the same way, so the module takes the CPU
  tensors the course uses in simulation. Compiler messages point at the original files.

``CppExtension`` is re-exported for host-only extensions.

Two builds of one project folder at the same time (a notebook and a test share
``.cache/extensions/relu``) take turns, and ``--inplace`` replaces the library in one step:
a process that already imported the old one keeps it intact instead of crashing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from torch.utils import cpp_extension as _ce

from runtime import config, paths
from runtime.backends.cuda import _toolchain as _tc
from runtime.backends.cuda._source import adapt_for_emulator, adapt_torch_host_code

__all__ = ["CUDAExtension", "BuildExtension", "CppExtension", "EMULATED"]

#: True when extensions are built against the CPU emulator.
EMULATED = config.SIMULATE
CppExtension = _ce.CppExtension
_EMU_DIR = _tc.EMU_DIR


def _cxx_flags(extra) -> list[str]:
    if extra is None:
        return []
    if isinstance(extra, dict):
        return list(extra.get("cxx", []))
    return list(extra)


def CUDAExtension(name: str, sources, *args, **kwargs):
    """torch's ``CUDAExtension`` on a GPU; an emulated C++ extension on a CPU."""
    include_dirs = list(kwargs.pop("include_dirs", []) or []) + [str(paths.CUDA_INCLUDE_DIR)]
    if not EMULATED:
        return _ce.CUDAExtension(name, sources, *args, include_dirs=include_dirs, **kwargs)
    extra = kwargs.pop("extra_compile_args", None)
    kwargs.pop("dlink", None)
    kwargs.pop("dlink_libraries", None)
    ext = _ce.CppExtension(name, [str(s) for s in sources], *args,
                           include_dirs=include_dirs + [str(_EMU_DIR)],
                           extra_compile_args={"cxx": _cxx_flags(extra) + _tc.extension_flags()}, **kwargs)
    ext.course_emulated = True
    return ext


def translate_source(src: Path, out_dir: Path) -> Path:
    """The source to compile in emulation: ``.cu`` files always get a translated copy in
    ``out_dir``; other files only when their host code needs adapting."""
    text = src.read_text()
    _tc.check_torch_cuda_includes(text, str(src))
    if src.suffix == ".cu":  # nvcc compiles its kernels on a GPU (a .cuh only within a .cu)
        _tc.nvrtc_check_device_code(text, str(src))
    if src.suffix in (".cu", ".cuh"):
        new = ('#include "cuda_emu.h"\n'
               f'#line 1 "{src}"\n' + adapt_torch_host_code(adapt_for_emulator(text)))
        out = out_dir / (src.name + ".cpp")
    else:
        adapted = adapt_torch_host_code(text)
        if adapted == text:
            return src
        new = f'#line 1 "{src}"\n' + adapted
        out = out_dir / src.name
    if not out.exists() or out.read_text() != new:  # unchanged files keep ninja's incremental build
        _tc.write_atomic(out, new.encode())
    return out


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One build at a time in ``folder`` (where fcntl exists: Linux and macOS)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".course-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class BuildExtension(_ce.BuildExtension):
    """torch's ``BuildExtension``; in emulation it first translates each ``.cu`` source."""

    def run(self):
        with _build_lock(Path(self.build_temp).resolve().parent):
            super().run()

    def copy_file(self, infile, outfile, *args, **kwargs):
        """The ``--inplace`` copy of a library, made atomic: written beside the old one, then
        renamed over it. Writing over a library in place would change the pages of a process
        that has it loaded (a notebook's kernel that imported it), which then crashes."""
        if self.dry_run or not str(infile).endswith((".so", ".pyd", ".dylib")):
            return super().copy_file(infile, outfile, *args, **kwargs)
        out = Path(outfile)
        if out.is_dir():
            out = out / Path(infile).name
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copy2(infile, tmp)
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(out), True

    def build_extensions(self):
        if EMULATED:
            for ext in self.extensions:
                if not getattr(ext, "course_emulated", False):
                    continue
                out_dir = Path(self.build_temp).resolve() / "course-emulated" / ext.name
                srcs, dirs = [], []
                for s in ext.sources:
                    p = Path(s).resolve()
                    srcs.append(str(translate_source(p, out_dir)))
                    dirs.append(str(p.parent))  # "local.h" includes of the original files
                ext.sources = srcs
                ext.include_dirs = list(dict.fromkeys(list(ext.include_dirs) + dirs))
        super().build_extensions()


def write_cmake_settings(out_dir: Path, sources) -> Path:
    """For build systems other than setuptools (CMake): translate ``sources`` as
    ``BuildExtension`` does and write ``out_dir/course_emulator.cmake``, which sets
    ``COURSE_EMULATED_SOURCES``, ``COURSE_EMULATOR_INCLUDE_DIRS`` and
    ``COURSE_EMULATOR_FLAGS``. One place for the emulator's flags, whichever tool builds."""
    out_dir = Path(out_dir).resolve()
    srcs = [Path(s).resolve() for s in sources]
    translated = [translate_source(p, out_dir) for p in srcs]
    dirs = [str(paths.CUDA_INCLUDE_DIR), str(_EMU_DIR)] + [str(p.parent) for p in srcs]

    def cmake_list(items) -> str:
        return '"' + ";".join(str(i).replace("\\", "/") for i in dict.fromkeys(items)) + '"'

    settings = out_dir / "course_emulator.cmake"
    settings.write_text(
        "# written by `python -m utils.extension cmake`: the CUDA sources translated for the\n"
        "# course's CPU emulator, and how to compile them\n"
        f"set(COURSE_EMULATED_SOURCES {cmake_list(translated)})\n"
        f"set(COURSE_EMULATOR_INCLUDE_DIRS {cmake_list(dirs)})\n"
        f"set(COURSE_EMULATOR_FLAGS {cmake_list(_tc.extension_flags())})\n")
    return settings


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 4 or sys.argv[1] != "cmake":
        sys.exit("usage: python -m utils.extension cmake OUT_DIR SOURCE...")
    print(write_cmake_settings(Path(sys.argv[2]), sys.argv[3:]))
