"""One way to show a kernel, in any of the course's three languages.

    utils.show(kernel)                 # its source: the code that runs
    utils.show(kernel, "ptx")          # the PTX the compiler makes of it
    utils.show(kernel, "sass")         # the machine code (SASS) of this GPU, or of an H100
    utils.show(path_or_text, name="relu_kernel")   # one kernel of a .cu file or source string

``kernel`` may be:

* a CUDA C++ kernel (``utils.cuda_kernel(...)``), or CUDA C++ source (text or a ``.cu`` path)
  with ``name=``: the kernel's text with the comment above it; PTX and SASS come from NVRTC
  and ``nvdisasm`` (NVIDIA's pip wheels), so they work without a GPU too;
* a Numba kernel (``@cuda.jit``): its Python source; PTX and SASS of the signatures it was
  compiled for, which needs a GPU (the simulator compiles nothing);
* a Triton kernel (``@triton.jit``): its Python source; PTX, SASS and Triton's own stages
  (``"ttir"``, ``"ttgir"``, ``"llir"``) of the variants it was compiled for, which needs a GPU
  (the interpreter compiles nothing);
* any Python function or class (a launcher, an ``autograd.Function``): its source.

``show`` prints and returns nothing; ``kernel_text(kernel, what)`` returns the same text.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

__all__ = ["show", "kernel_text", "cuda_function_source"]

_WHATS = ("source", "ptx", "sass", "ttir", "ttgir", "llir")


def cuda_function_source(text: str, name: str) -> str:
    """The text of the ``__global__`` or ``__device__`` function ``name`` in CUDA C++ ``text``:
    the comment block right above it (and a ``template`` line), then its definition. Braces in
    comments and strings do not count; a declaration without a body is passed over."""
    from runtime.backends.cuda._source import _closing, strip_comments
    base = name.split("<")[0].strip()
    code = strip_comments(text)                   # same offsets as text, comments blanked
    for m in re.finditer(rf"\b{re.escape(base)}\s*(?:<[^;{{}}()]*>\s*)?\(", code):
        decl = max(code.rfind(c, 0, m.start()) for c in ";{}") + 1
        quals = [code.find(q, decl, m.start()) for q in ("template", "__global__", "__device__")]
        if quals[1] < 0 and quals[2] < 0:
            continue                              # a call, or a host function
        close = _closing(code, m.end() - 1, "(", ")")
        brace = code.find("{", close)
        if close < 0 or brace < 0 or ";" in code[close:brace]:
            continue                              # a declaration: the definition comes later
        end = _closing(code, brace, "{", "}")
        lines = text.split("\n")
        first = text.count("\n", 0, min(q for q in quals if q >= 0))
        while first > 0 and lines[first - 1].lstrip().startswith("//") and lines[first - 1].strip("/ -"):
            first -= 1
        return "\n".join(lines[first:text.count("\n", 0, end) + 1])
    raise KeyError(f"no __global__ or __device__ function {base!r} in this source")


def _ptx_entry(ptx: str, name: str) -> str:
    """The PTX of one kernel: from its ``.entry`` line to the next one (names are mangled)."""
    base = name.split("<")[0].strip()
    parts = ptx.split(".entry")
    for p in parts[1:]:
        if base in p.split("(")[0]:
            return ".entry" + p.rstrip()
    return ptx


def _kind(obj) -> str:
    from runtime.backends.cuda import CudaKernel
    if isinstance(obj, CudaKernel):
        return "cuda"
    mod = type(obj).__module__ or ""
    if mod.startswith("triton"):
        return "triton"
    if mod.startswith("numba"):
        return "numba"
    return "python"


def _python_source(obj) -> str:
    fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    try:
        return inspect.getsource(fn)
    except (TypeError, OSError) as e:
        raise TypeError(f"show: cannot find the source of {obj!r} ({e}); pass a kernel, a function or "
                        "a class defined in a file or a notebook cell") from None


def _cuda_text(source, name: str, what: str, arch) -> str:
    from runtime.backends.cuda import cuda_ptx, cuda_sass
    from runtime.backends.cuda._source import read_source
    if what == "source":
        text, _, _ = read_source(source, name)
        return cuda_function_source(text, name)
    if what == "ptx":
        return _ptx_entry(cuda_ptx(source, name, arch), name)
    if what == "sass":
        return cuda_sass(source, name, arch)
    raise ValueError(f"show: a CUDA C++ kernel has its source, 'ptx' and 'sass', not {what!r}")


def _needs_gpu(lang: str) -> str:
    if lang == "numba":
        return ("Numba's simulator compiles nothing, so there is no PTX or SASS here; on a GPU, "
                "launch the kernel once and show it again")
    return ("Triton's interpreter compiles nothing, so there is no PTX or SASS here; on a GPU, "
            "launch the kernel once and show it again")


def _numba_text(kernel, what: str) -> str:
    from runtime.config import SIMULATE
    if what not in ("ptx", "sass"):
        raise ValueError(f"show: a Numba kernel has its source, 'ptx' and 'sass', not {what!r}")
    if SIMULATE or not hasattr(kernel, "inspect_asm"):
        raise RuntimeError(f"show(kernel, {what!r}): {_needs_gpu('numba')}")
    texts = kernel.inspect_asm() if what == "ptx" else kernel.inspect_sass()
    if not texts:
        raise RuntimeError(f"show(kernel, {what!r}): Numba compiles a kernel at its first launch, for the "
                           "types it is given: launch it once, then show it")
    return "\n".join(f"// signature {sig}\n{text}" for sig, text in texts.items())


def _triton_text(kernel, what: str) -> str:
    from runtime.config import SIMULATE
    if SIMULATE or not hasattr(kernel, "device_caches"):
        raise RuntimeError(f"show(kernel, {what!r}): {_needs_gpu('triton')}")
    compiled = [k for cache in kernel.device_caches.values() for k in cache[0].values()]
    if not compiled:
        raise RuntimeError(f"show(kernel, {what!r}): Triton compiles a kernel at its first launch, for the "
                           "types and constants it is given: launch it once, then show it")
    k = compiled[-1]
    if what == "sass":
        from runtime.backends.cuda import _toolchain
        return _toolchain.sass(k.asm["cubin"], k.metadata.name)
    if what not in k.asm:
        raise ValueError(f"show: a compiled Triton kernel has {sorted(k.asm)}, not {what!r}")
    return k.asm[what]


def kernel_text(kernel, what: str = "source", *, name: str | None = None, arch: str | None = None) -> str:
    """What ``show`` prints, as a string (see the module's documentation)."""
    if not isinstance(what, str) or what.lower() not in _WHATS:
        raise ValueError(f"show: what must be one of {', '.join(map(repr, _WHATS))}, got {what!r}")
    what = what.lower()
    if isinstance(kernel, (str, Path)):
        if not name:
            raise TypeError("show: with CUDA C++ source (text or a .cu path), name the kernel: "
                            "utils.show(source, name='relu_kernel')")
        return _cuda_text(kernel, name, what, arch)
    lang = _kind(kernel)
    if lang == "cuda":
        return _cuda_text(kernel.text, kernel.name, what, arch)
    if what == "source":
        return _python_source(kernel)
    if lang == "numba":
        return _numba_text(kernel, what)
    if lang == "triton":
        return _triton_text(kernel, what)
    raise TypeError(f"show: {what!r} is shown for a kernel (CUDA C++, Numba or Triton), and "
                    f"{getattr(kernel, '__name__', type(kernel).__name__)} is a Python "
                    f"{'function' if callable(kernel) else type(kernel).__name__}: show its source, "
                    "or pass the kernel it launches")


def show(kernel, what: str = "source", *, name: str | None = None, arch: str | None = None) -> None:
    """Print a kernel's source (the default), or its ``"ptx"`` or ``"sass"``.

    ``kernel``: a CUDA C++ kernel (``utils.cuda_kernel``), CUDA C++ source with ``name=``, a
    Numba or a Triton kernel, or any Python function or class. ``arch``: the GPU that CUDA C++
    PTX and SASS are compiled for (default: this machine's, else ``"sm_90"``, an H100).
    """
    print(kernel_text(kernel, what, name=name, arch=arch).rstrip("\n"))
