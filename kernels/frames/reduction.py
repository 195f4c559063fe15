"""The reductions' frame, shared by the CUDA C++, Numba and Triton launchers: the input rules,
what a launcher does around its kernels, the grid of the grid-stride sums and the PyTorch
references.

    sum_input(x), sum_frame(x, launch)            x flat float32, out a 0-d 0; ``launch(x, out, n)``
    row_max_input(x), row_max_frame(x, launch)    x 2-D float32, out -inf per row; ``launch(x, out, rows, cols)``
    num_blocks_grid_stride(n, block, per_thread)  blocks of a grid-stride reduction (one wave)
    sum_ref(x), row_max_ref(x)                    torch.sum, torch.amax over the last dim
"""
from __future__ import annotations

import torch

from kernels._launch import cdiv, sm_count
from runtime.inputs import check_input  # the shared input rules


def sum_input(x) -> tuple[torch.Tensor, torch.Tensor]:
    """The input rules of every sum, in all three languages: x as a flat contiguous float32
    tensor (or a clear error), and the output, a 0-d 0 (the sum of no elements, as torch.sum)."""
    x = check_input(x, op="sum").reshape(-1)
    return x, torch.zeros((), dtype=torch.float32, device=x.device)


def sum_frame(x, launch) -> torch.Tensor:
    """What every sum launcher does around its kernels, in all three languages: check x
    (``sum_input``), make out (0), call ``launch(x, out, n)`` unless x is empty, and return out."""
    x, out = sum_input(x)
    if x.numel():
        launch(x, out, x.numel())
    return out


def num_blocks_grid_stride(n: int, block: int = 256, per_thread: int = 16) -> int:
    """How many blocks a grid-stride reduction launches.

    Four blocks of 256 threads per SM: 1024 threads, each with four 16-byte loads in
    flight, keep about 64 KB per SM on its way from memory, enough to cover its latency.
    All of them are resident at once (one wave), so no SM runs a lonely last block while
    the others idle. Fewer blocks when the data is small (``per_thread`` elements each at
    least). More blocks would only add partial sums to the second pass.
    """
    return max(1, min(cdiv(n, block * per_thread), sm_count() * 4))


def row_max_input(x) -> tuple[torch.Tensor, torch.Tensor]:
    """The input rules of every row_max, in all three languages: x as a contiguous 2-D float32
    tensor (or a clear error), and the output, one -inf per row (the max of no columns)."""
    x = check_input(x, op="row_max")
    if x.dim() != 2:
        raise ValueError(f"row_max expects a 2-D tensor, got shape {tuple(x.shape)}")
    return x, torch.full((x.shape[0],), float("-inf"), dtype=torch.float32, device=x.device)


def row_max_frame(x, launch) -> torch.Tensor:
    """What every row_max launcher does around its kernel, in all three languages: check x
    (``row_max_input``), make out (-inf), call ``launch(x, out, rows, cols)`` unless x is
    empty, and return out."""
    x, out = row_max_input(x)
    if x.numel():
        launch(x, out, *x.shape)
    return out


def sum_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(x)


def row_max_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.amax(x, dim=-1)
