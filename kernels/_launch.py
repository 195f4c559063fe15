"""What every launcher of the course needs, written once (as Liger Kernel keeps its
``calculate_settings`` in ``ops/utils.py``): the grid arithmetic and the source reader.

    cdiv(a, b)            blocks of ``b`` threads that cover ``a`` elements
    sm_count()            streaming multiprocessors of the GPU (4 in simulation)
    cuda_source(name, path)  one kernel or helper of a ``.cu`` file, with its comment block

The CUDA C++, Numba and Triton modules import them from here; ``kernels/cuda/<topic>.py``
re-exports ``cdiv`` and ``sm_count`` so a lesson can write ``red_cuda.cdiv(n, 256)``.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

import utils

#: The stand-in for the number of SMs in simulation: the emulator and the simulators run one
#: block after another, so a small persistent grid keeps a grid-stride loop honest (several
#: blocks, each looping) without simulating thousands of threads.
SIM_SM_COUNT = 4


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of ``b`` cover ``a`` elements (``cdiv(1000, 256) == 4``)."""
    return (a + b - 1) // b


def sm_count() -> int:
    """Streaming multiprocessors of the GPU (``SIM_SM_COUNT`` in simulation)."""
    if utils.SIMULATE:
        return SIM_SM_COUNT
    return torch.cuda.get_device_properties(utils.DEVICE).multi_processor_count


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
