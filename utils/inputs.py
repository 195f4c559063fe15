"""The input rules every launcher of the course follows, in one place.

A launcher takes float32 torch tensors on ``utils.DEVICE``. Anything else gets a clear
``TypeError``/``ValueError`` that says how to fix it; a non-contiguous tensor is made
contiguous (a copy), because kernels index raw memory as a flat array.
"""
from __future__ import annotations

import torch

from .config import DEVICE

__all__ = ["check_input", "INT32_MAX"]

#: Kernels that index with a 32-bit ``int`` cannot address more elements than this.
INT32_MAX = 2**31 - 1


def check_input(x, name: str = "x", *, ndim: int | None = None, max_numel: int | None = None,
                op: str | None = None) -> torch.Tensor:
    """``x`` as a contiguous float32 tensor on the course's device, or a clear error.

    ``name`` is the argument's name in messages, ``op`` the launcher's name, ``ndim`` the
    number of dimensions the kernel needs, ``max_numel`` the most elements its index type
    can address (for example ``INT32_MAX``).
    """
    who = f"{op}: " if op else ""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{who}{name} must be float32, got {x.dtype}: convert it with {name}.float()")
    if x.device.type != DEVICE.type:
        raise ValueError(f"{who}{name} is on {x.device}, but the kernels run on {DEVICE}: "
                         f"move it with {name}.to(utils.DEVICE)")
    if ndim is not None and x.dim() != ndim:
        hint = f": reshape it with {name}.reshape(-1, {name}.shape[-1])" if ndim == 2 else ""
        raise ValueError(f"{who}{name} must be {ndim}-D, got shape {tuple(x.shape)}{hint}")
    if max_numel is not None and x.numel() > max_numel:
        raise ValueError(f"{who}{name} has {x.numel()} elements, more than the kernel's index "
                         f"type can address ({max_numel}): split the tensor")
    return x.contiguous()
