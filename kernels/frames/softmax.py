"""Softmax's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules, what
a launcher does around its kernels, v2's limit and the PyTorch reference.

    softmax_input(x)              x checked (2-D float32, int32-indexable) and a new y
    softmax_frame(x, launch)      check, make y, ``launch(x, y, rows, cols)`` unless x is empty
    check_fused_cols(cols, items) a row must fit in one block's registers (v2)
    softmax_ref(x)                torch.softmax over the last dim
"""
from __future__ import annotations

import torch

from runtime.inputs import INT32_MAX, check_input  # the shared input rules

#: Threads a block may have (CUDA's limit, the same for Numba's blocks).
MAX_THREADS = 1024


def softmax_input(x) -> tuple[torch.Tensor, torch.Tensor]:
    """The input rules of every softmax launcher, in all three languages: x as a contiguous
    2-D float32 tensor that int32 indexes reach (or a clear error), and a new y of its shape."""
    x = check_input(x, ndim=2, max_numel=INT32_MAX, op="softmax")
    return x, torch.empty_like(x)


def softmax_frame(x, launch) -> torch.Tensor:
    """What every softmax launcher does around its kernels, in all three languages: check x
    (``softmax_input``), make y, call ``launch(x, y, rows, cols)`` unless x is empty, and
    return y."""
    x, y = softmax_input(x)
    if x.numel():
        launch(x, y, *x.shape)
    return y


def check_fused_cols(cols: int, items: int, threads: int = MAX_THREADS) -> None:
    """v2's limit, in CUDA C++ and Numba: a row must fit in one block's registers, ``items``
    per thread x ``threads`` threads (a clear error otherwise)."""
    if cols > items * threads:
        raise ValueError(f"rows of {cols} columns do not fit in one block's registers (at most "
                         f"{items * threads} = {items} per thread x {threads} threads): "
                         "use the online softmax (v3) for long rows")


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)
