"""What every launcher of the course needs, written once (as Liger Kernel keeps its
``calculate_settings`` in ``ops/utils.py``): the grid arithmetic, the elementwise input rule,
the source reader and the version index.

    cdiv(a, b)                                   blocks of ``b`` threads that cover ``a`` elements
    sm_count()                                   streaming multiprocessors of the GPU (4 in simulation)
    capped_grid(n, block_size[, blocks_per_sm])  the grid of a grid-stride loop
    whole_warps(threads[, most])                 a block of whole warps, at most 1024 threads
    inputs_and_output(x[, y, ...], op=...)       checked inputs and a new output of their shape
    cuda_source(name, path)                      one kernel or helper of a ``.cu`` file, with its comment block
    version_index(index, v1=launcher, ...)       a topic's ``VERSIONS``, each description read from
                                                 its version index (the ``.cu`` header or the module docstring)

The CUDA C++, Numba and Triton modules and the topics' frames (``kernels/frames/``) import them
from here; ``kernels/cuda/<topic>.py`` re-exports ``cdiv`` and ``sm_count`` so a lesson can write
``red_cuda.cdiv(n, 256)``.
"""
from __future__ import annotations

import ast
import functools
import re
import sys
from collections import OrderedDict
from pathlib import Path

import torch

import runtime
from runtime.inputs import check_input, check_same_shape

#: The stand-in for the number of SMs in simulation: the emulator and the simulators run one
#: block after another, so a small persistent grid keeps a grid-stride loop honest (several
#: blocks, each looping) without simulating thousands of threads.
SIM_SM_COUNT = 4
#: How the shape error of an elementwise launcher ends.
ONE_SHAPE = "the kernels take tensors of one shape (no broadcasting)"


def cuda_kernels(source: Path):
    """``kernel(name)`` for a CUDA C++ module: the kernel ``name`` of the ``.cu`` file ``source``,
    compiled on first use and kept (``kernel("relu_kernel")[grid, block](...)``)."""

    @functools.lru_cache(maxsize=None)
    def kernel(name: str):
        return runtime.cuda_kernel(source, name)

    kernel.__doc__ = f"A kernel of {Path(source).name}, compiled once: kernel(name)[grid, block](...)."
    return kernel


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of ``b`` cover ``a`` elements (``cdiv(1000, 256) == 4``)."""
    return (a + b - 1) // b


def sm_count() -> int:
    """Streaming multiprocessors of the GPU (``SIM_SM_COUNT`` in simulation)."""
    if runtime.SIMULATE:
        return SIM_SM_COUNT
    return torch.cuda.get_device_properties(runtime.DEVICE).multi_processor_count


def whole_warps(threads: int, most: int = 1024) -> int:
    """Threads per block: ``threads`` rounded up to whole warps of 32, at least one warp and at
    most ``most`` (``whole_warps(100) == 128``)."""
    return min(most, max(32, cdiv(threads, 32) * 32))


def capped_grid(n: int, block_size: int, blocks_per_sm: int | None = None) -> int:
    """Blocks of ``block_size`` threads for a grid-stride loop over ``n`` elements: enough to
    cover them (at least one), but at most ``blocks_per_sm`` on every SM (``None``: one full
    wave, as many as an SM holds at once); each thread loops over the rest. In simulation
    ``SIM_SM_COUNT`` blocks at most."""
    if runtime.SIMULATE:
        cap = SIM_SM_COUNT
    else:
        props = torch.cuda.get_device_properties(runtime.DEVICE)
        if blocks_per_sm is None:
            blocks_per_sm = max(getattr(props, "max_threads_per_multi_processor", 2048) // block_size, 1)
        cap = props.multi_processor_count * blocks_per_sm
    return max(1, min(cdiv(n, block_size), cap))


def inputs_and_output(*tensors, op: str, names=("x", "y"), hint: str = ONE_SHAPE, max_numel: int | None = None):
    """The input rules of an elementwise launcher, in every language, and its output:
    ``(*tensors, out)``, each tensor a contiguous float32 tensor on the course's device
    (``runtime.inputs.check_input``: a clear error otherwise), all of one shape (no
    broadcasting; ``hint`` ends the message), and ``out`` a new tensor of that shape.

        x, y = inputs_and_output(x, op="relu")
        if x.numel():   # an empty grid is not a launch
            kernel[cdiv(x.numel(), 256), 256](x, y, x.numel())
        return y
    """
    if len(tensors) > len(names):
        raise TypeError(f"inputs_and_output: {len(tensors)} tensors but only the names {names}")
    checked = [check_input(t, name, op=op, max_numel=max_numel) for t, name in zip(tensors, names)]
    for t, name in zip(checked[1:], names[1:]):
        check_same_shape(checked[0], t, (names[0], name), op=op, hint=hint)
    return (*checked, torch.empty_like(checked[0]))


def cuda_source(name: str, path) -> str:
    """The text of one kernel or helper of a .cu file: its comment block and its body.

    ``print(cuda_source("sum_warp_kernel", path))`` shows a learner exactly the code that runs.
    A name the file does not define is looked up in the course headers it includes.
    """
    path = Path(path)
    lines = path.read_text().split("\n")
    start = next((i for i, ln in enumerate(lines)
                  if re.search(rf"\b{re.escape(name)}\s*\(", ln) and ("__global__" in ln or "__device__" in ln)),
                 None)
    if start is None:
        # A helper of a course header the file includes (block_sum of reduce.h, say).
        for header in re.findall(r'^#include "(\w+\.h)"', "\n".join(lines), re.M):
            if (path.parent / header).is_file():
                try:
                    return cuda_source(name, path.parent / header)
                except KeyError:
                    pass
        raise KeyError(f"no __global__ or __device__ function {name!r} in {path}")
    first = start
    if first > 0 and lines[first - 1].lstrip().startswith("template"):
        first -= 1
    while first > 0 and lines[first - 1].lstrip().startswith("//") and lines[first - 1].strip("/ -"):
        first -= 1
    depth, end, opened = 0, start, False
    for end in range(start, len(lines)):
        depth += lines[end].count("{") - lines[end].count("}")
        opened = opened or "{" in lines[end]
        if opened and depth == 0:
            break
    return "\n".join(lines[first:end + 1])


# ---------------------------------------------------------------------------------------
# The version index: one list of a topic's versions per language, written once, as the
# header comment of llm.c's dev/cuda files is. An entry is one line,
#
#     <name>  <one-line description>  [<what implements it>]
#
# the fields apart by two or more spaces; lines indented deeper below it give details. The
# index is the header comment of kernels/cuda/<topic>.cu (CUDA C++) or the module docstring
# (Numba, Triton), and VERSIONS takes its descriptions from there.
_ENTRY = re.compile(r"^[ \t]+(?P<name>\w+) {2,}(?P<rest>\S.*?)[ \t]*$", re.M)


def cuda_header(path) -> str:
    """The first comment block of a ``.cu`` file, without the ``//``: its version index."""
    lines = []
    for line in Path(path).read_text().splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:])
    return "\n".join(lines)


def index_entries(index: str) -> dict[str, list[str]]:
    """Every entry line of a version index: ``name -> [description, ...]`` (one, if the
    index is sound; a name written twice has two)."""
    entries: dict[str, list[str]] = {}
    for m in _ENTRY.finditer(index):
        entries.setdefault(m["name"], []).append(re.split(r"\s{2,}", m["rest"])[0])
    return entries


def module_docstring(path) -> str | None:
    """The docstring of the Python file at ``path``, as ``__doc__`` has it (``None`` if there is
    none, or no such file): read from the source, so that ``python -OO`` cannot drop it."""
    if not path or not Path(path).is_file() or Path(path).suffix != ".py":
        return None
    return ast.get_docstring(ast.parse(Path(path).read_text()), clean=False)


def version_index(index, **launchers) -> OrderedDict:
    """A topic's ``VERSIONS`` (``name -> (description, launcher)``, in the order given), each
    description read from the version index, so that it is written in one place:

        VERSIONS = version_index(__doc__, v1=relu_v1, v2=relu_grid_stride)      # Numba, Triton
        VERSIONS = version_index(SOURCE, v1=relu_v1, v2=relu_vec4)              # the .cu header

    ``index`` is the index text, or the path of a ``.cu`` file whose header comment is the
    index. ``None`` (``__doc__`` under ``python -OO``, which drops docstrings) reads the calling
    module's docstring from its source file. A version the index does not list, or lists
    twice, is an error at import.
    """
    where = "the header comment of " + Path(index).name if isinstance(index, Path) else "the module docstring"
    if isinstance(index, Path):
        index = cuda_header(index)
    elif index is None:
        index = module_docstring(sys._getframe(1).f_globals.get("__file__"))
    if not index:
        raise ValueError(f"no version index in {where}")
    entries = index_entries(index)
    versions = OrderedDict()
    for name, launcher in launchers.items():
        found = entries.get(name, [])
        if len(found) != 1:
            raise ValueError(f"{name} is {'not' if not found else 'more than once'} in the version index "
                             f"({where}): write it there once, as `{name}  <one-line description>`")
        versions[name] = (found[0], launcher)
    return versions
