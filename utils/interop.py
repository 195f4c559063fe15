"""torch tensors <-> arrays a Numba CUDA kernel accepts, in both modes, without copies.

    out = torch.empty_like(x)
    my_kernel[blocks, threads](utils.to_numba(x), utils.to_numba(out))
    # out now holds the kernel's result: the kernel wrote into its memory

On a GPU, ``numba.cuda.as_cuda_array`` wraps the tensor's device memory through the CUDA
array interface. In simulation the tensor lives on the CPU and the simulator gets a
device-array stand-in over a NumPy view of the same memory. Either way a kernel reads and
writes the tensor itself: no copy in, no copy out, strided views included (the kernel
sees the view's strides, as ``x.stride()`` says).

Streams (GPU only). A Numba launch without a stream goes to the legacy default stream,
which is also torch's default stream, so a kernel launched after torch produced its
input runs after it, and torch work issued after the launch runs after the kernel. If
the code runs under ``torch.cuda.stream(s)`` that ordering is gone: ``to_numba`` then
waits for torch's stream before handing the array over, and the launch should go on
torch's stream too: ``kernel[blocks, threads, utils.numba_stream()](...)``.
"""
from __future__ import annotations

import torch

from .config import DEVICE, SIMULATE

__all__ = ["to_numba", "from_numba", "numba_stream"]

# dtypes a Numba kernel can take (NumPy has no bfloat16; Numba has no complex32).
_SUPPORTED = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
              torch.complex128}


def to_numba(t: torch.Tensor):
    """A Numba device-array view of ``t`` (same memory): pass it to a ``@cuda.jit`` kernel."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_numba expects a torch.Tensor, got {type(t).__name__}")
    if t.device.type != DEVICE.type:
        raise ValueError(f"tensor is on {t.device}, but the course runs on {DEVICE}: "
                         "move it with .to(utils.DEVICE)")
    if t.dtype not in _SUPPORTED:
        raise TypeError(f"Numba kernels cannot take {t.dtype} tensors: convert with "
                        ".float() (or pass float32 and convert inside the launcher)")
    t = t.detach()  # a kernel's writes bypass autograd anyway
    if SIMULATE:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        # The simulator would copy a plain NumPy argument in and out (and refuses a
        # non-contiguous one); wrapped like this, it runs on the tensor's own memory.
        return FakeCUDAArray(t.numpy())
    from numba import cuda
    # On torch's default stream the launch is ordered after torch's work by the stream
    # itself; skip the host-side wait that `sync=True` costs on every call.
    on_default = torch.cuda.current_stream(t.device).cuda_stream == 0
    return cuda.as_cuda_array(t, sync=not on_default)


def from_numba(a) -> torch.Tensor:
    """A torch tensor on ``utils.DEVICE`` sharing memory with a Numba device array.

    Takes what ``to_numba`` or ``numba.cuda.device_array`` returns (in simulation, also a
    NumPy array).
    """
    if SIMULATE:
        import numpy as np
        arr = getattr(a, "_ary", a)  # the simulator's device array wraps a NumPy array
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"from_numba expects a Numba device array, got {type(a).__name__}")
        if any(s < 0 for s in arr.strides):
            raise ValueError("torch cannot view an array with negative strides: "
                             "copy it first (np.ascontiguousarray) or avoid [::-1] views")
        return torch.from_numpy(arr)
    if not hasattr(a, "__cuda_array_interface__"):
        raise TypeError(f"from_numba expects a Numba device array, got {type(a).__name__}: "
                        "copy host data with torch.as_tensor(a, device=utils.DEVICE)")
    return torch.as_tensor(a, device=DEVICE)


def numba_stream():
    """The stream argument that puts a Numba launch on torch's current stream.

    ``kernel[blocks, threads, utils.numba_stream()](...)``. In simulation there are no
    streams and this is 0, the default.
    """
    if SIMULATE:
        return 0
    from numba import cuda
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
