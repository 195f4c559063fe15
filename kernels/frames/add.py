"""Addition's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules of
``add_2d``, the grid limit of a 2-D grid and the PyTorch reference. (``add`` itself takes the
elementwise rule of every language, ``inputs_and_output`` of ``kernels/_launch.py``.)

    add_2d_input(x, y)               x, y float32 matrices of one shape (strided views too) and a new out
    check_grid_rows(rows, blocks_y)  a clear error past CUDA's limit on gridDim.y
    add_ref(x, y)                    x + y
"""
from __future__ import annotations

import torch

import runtime
from runtime.inputs import check_same_shape, check_tensor

#: How a shape error ends: the kernels take x and y of one shape, they do not broadcast.
NO_BROADCAST = "these kernels add tensors of the same shape (no broadcasting)"
MAX_GRID_Y = runtime.config.MAX_GRID[1]  # CUDA's limit on gridDim.y (and z); gridDim.x may reach 2^31 - 1


def add_2d_input(x, y) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input rules of every add_2d, in all three languages: x and y float32 matrices of
    one shape on the course's device (a clear error otherwise), returned as they are (strided
    views too), and a new output of their shape."""
    check_tensor(x, "x", op="add_2d")
    check_tensor(y, "y", op="add_2d")
    check_same_shape(x, y, op="add_2d", hint=NO_BROADCAST)
    if x.dim() != 2:
        raise ValueError(f"add_2d adds matrices: expected 2-D tensors, got shape {tuple(x.shape)}")
    return x, y, torch.empty(x.shape, dtype=x.dtype, device=x.device)


def check_grid_rows(rows: int, blocks_y: int) -> None:
    """A clear error when a 2-D grid needs more blocks along y than CUDA allows."""
    if blocks_y > MAX_GRID_Y:
        raise ValueError(f"{rows} rows need {blocks_y} blocks along y, more than CUDA's "
                         f"{MAX_GRID_Y}: use add() on the flattened tensors instead")


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y
