"""torch tensors <-> arrays a Numba CUDA kernel accepts, in both modes, without copies.

On a GPU, ``numba.cuda.as_cuda_array`` wraps the tensor's device memory through the CUDA
array interface. In simulation the tensor lives on the CPU and the simulator takes a NumPy
view of the same memory, so a kernel's writes land in the torch tensor either way.
"""
from __future__ import annotations

import torch

from .config import DEVICE, SIMULATE

__all__ = ["to_numba", "from_numba"]


def to_numba(t: torch.Tensor):
    """A Numba view of ``t`` (same memory): pass it to a ``@cuda.jit`` kernel."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_numba expects a torch.Tensor, got {type(t).__name__}")
    if t.device.type != DEVICE.type:
        raise ValueError(f"tensor is on {t.device}, but the course runs on {DEVICE}: move it with .to(utils.DEVICE)")
    t = t.detach()
    if SIMULATE:
        return t.numpy()
    from numba import cuda
    return cuda.as_cuda_array(t)


def from_numba(a) -> torch.Tensor:
    """A torch tensor sharing memory with a Numba device array (or a NumPy array in simulation)."""
    if SIMULATE:
        return torch.from_numpy(a.copy_to_host() if hasattr(a, "copy_to_host") else a)
    return torch.as_tensor(a, device=DEVICE)
