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

__all__ = ["to_numba", "from_numba", "numba_stream", "NumbaLauncher", "numba_launch"]

# dtypes a Numba kernel can take (NumPy has no bfloat16; Numba has no complex32).
_SUPPORTED = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
              torch.complex128}


def to_numba(t: torch.Tensor):
    """A Numba device-array view of ``t`` (same memory): pass it to a ``@cuda.jit`` kernel.

    On a GPU it waits for torch's current stream (off the default stream), so that a Numba
    launch on Numba's own stream sees torch's results: a host synchronisation, which a CUDA
    Graph's capture cannot contain. Inside a capture it raises; launch with ``numba_launch``,
    which passes tensors as they are and launches on torch's stream."""
    from .backends import launches
    if launches._CAPTURES or (not SIMULATE and torch.cuda.is_current_stream_capturing()):
        from .graphs import host_sync_error
        raise host_sync_error("utils.to_numba(tensor)", "waits for torch's stream, for a launch on Numba's own "
                              "stream (utils.numba_launch(kernel, grid, block, *tensors) launches on torch's "
                              "stream and needs no to_numba)")
    return _as_numba(t, sync=True)


def _as_numba(t: torch.Tensor, sync: bool):
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
        with torch._C.DisableTorchFunction():  # a view, not a read on the host (a CUDA Graph's capture allows it)
            return FakeCUDAArray(t.numpy())
    from numba import cuda
    # On torch's default stream the launch is ordered after torch's work by the stream
    # itself; skip the host-side wait that `sync=True` costs on every call.
    on_default = torch.cuda.current_stream(t.device).cuda_stream == 0
    return cuda.as_cuda_array(t, sync=sync and not on_default)


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

    ``kernel[blocks, threads, utils.numba_stream()](...)``. In simulation there is one stream:
    this stands for torch's, which a simulated CUDA Graph captures (Numba's default, 0, it does
    not, as on a GPU).
    """
    if SIMULATE:
        from .backends.numba.simulator import TORCH_STREAM
        return TORCH_STREAM
    from numba import cuda
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)


class NumbaLauncher:
    """Launches a ``@cuda.jit`` kernel with torch tensors, at the cost of the launch alone.

        launch = utils.NumbaLauncher(my_kernel)
        launch(blocks, threads, x, y, np.float32(eps))     # tensors, and scalars as Numba types them

    ``kernel[blocks, threads](to_numba(x), ...)`` pays, on every call, a device-array wrapper per
    tensor (torch's ``__cuda_array_interface__`` read, a Numba ``DeviceNDArray`` built) and
    Numba's typing of every argument: tens of microseconds a tensor, several times the launch.
    What a kernel receives for an array is only its pointer, shape and strides, the fields of
    ``__cuda_array_interface__``: this launcher reads them from the tensor (``data_ptr()``,
    ``shape``, ``stride()``) and hands them to the compiled kernel, which it looks up once per
    kind of arguments (dtype, dims, contiguity). The first call of each kind goes through
    Numba's own launch, which compiles the kernel. Launches go to torch's current stream.

    In simulation, or if numba-cuda's internals differ from those this was written for, every
    call takes Numba's own path (``kernel[...](to_numba(t), ...)``): same result, slower.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled = {}   # kind of arguments -> (cufunc kernel, converters) or None
        self._configs = {}    # (grid, block, shared) -> LaunchConfig
        self._fast = not SIMULATE

    @staticmethod
    def _kind(args):
        return tuple((a.dtype, a.dim(), a.is_contiguous()) if isinstance(a, torch.Tensor) else type(a)
                     for a in args)

    def _slow(self, grid, block, shared, args):
        # on torch's stream: no wait for it is needed (nor allowed, inside a CUDA Graph's capture)
        conv = [_as_numba(a, sync=False) if isinstance(a, torch.Tensor) else a for a in args]
        return self.kernel[grid, block, numba_stream(), shared](*conv)

    def _compile_entry(self, args):
        import ctypes

        from numba.cuda import types as nt
        from numba.cuda.typing.typeof import Purpose, typeof

        argtypes = tuple(typeof(to_numba(a) if isinstance(a, torch.Tensor) else a, Purpose.argument)
                         for a in args)
        compiled = self.kernel.overloads[argtypes]
        if compiled.debug or getattr(compiled, "extensions", None):
            return None
        scalars = {nt.float32: ctypes.c_float, nt.float64: ctypes.c_double, nt.int32: ctypes.c_int32,
                   nt.int64: ctypes.c_int64, nt.uint32: ctypes.c_uint32, nt.uint64: ctypes.c_uint64,
                   nt.boolean: ctypes.c_uint8}
        conv = []
        for ty in argtypes:
            if isinstance(ty, nt.Array):
                conv.append(None)
            elif ty in scalars:
                conv.append(scalars[ty])
            else:
                return None  # a record, a tuple, ...: Numba's own path
        return compiled._codelibrary.get_cufunc().kernel, conv

    def __call__(self, grid, block, *args, shared: int = 0):
        if not self._fast:
            return self._slow(grid, block, shared, args)
        kind = self._kind(args)
        entry = self._compiled.get(kind, False)
        if entry is False:  # first call of this kind: Numba's path compiles, then look it up
            self._slow(grid, block, shared, args)
            try:
                self._compiled[kind] = self._compile_entry(args)
            except Exception:
                self._compiled[kind] = None
            return None
        if entry is None:
            return self._slow(grid, block, shared, args)
        from .backends import launches
        if launches._ACTIVE:  # a recording wants to see this launch
            with launches.launching("numba", getattr(self.kernel, "__name__", "kernel"), args):
                return self._launch(entry, grid, block, shared, args)
        return self._launch(entry, grid, block, shared, args)

    def _launch(self, entry, grid, block, shared, args):
        kernel, conv = entry
        kargs = []
        for a, c in zip(args, conv):
            if c is None:
                size = a.element_size()
                kargs += (0, 0, a.numel(), size, a.data_ptr(), *a.shape, *(s * size for s in a.stride()))
            else:
                kargs.append(c(a))
        key = (grid, block, shared)
        config = self._configs.get(key)
        if config is None:
            from numba.cuda.dispatcher import LaunchConfig
            g = grid if isinstance(grid, tuple) else (grid,)
            b = block if isinstance(block, tuple) else (block,)
            config = self._configs[key] = LaunchConfig(grid=g, block=b, shmem_size=shared)
        _core_launch()(_core_stream(_current_raw_stream()), config, kernel, *kargs)


_LAUNCHERS: dict = {}


def numba_launch(kernel, grid, block, *args, shared: int = 0):
    """``kernel[grid, block](...)`` with torch tensors passed as they are, through one
    ``NumbaLauncher`` kept per kernel: what the course's reference launchers call.

        numba_launch(relu_kernel, blocks, 256, x.view(-1), y.view(-1), n)
    """
    launcher = _LAUNCHERS.get(kernel)
    if launcher is None:
        launcher = _LAUNCHERS[kernel] = NumbaLauncher(kernel)
    return launcher(grid, block, *args, shared=shared)


#: cuda.core's stream object of each raw stream handle torch has given (built once: making one
#: costs several times the launch).
_STREAMS = {}
_LAUNCH = []


def _core_launch():
    if not _LAUNCH:
        from numba.cuda.dispatcher import launch
        _LAUNCH.append(launch)
    return _LAUNCH[0]


def _current_raw_stream() -> int:
    """torch's current stream on the current device, as a raw handle (torch's own fast accessor,
    what torch.compile's generated code calls; ``torch.cuda.current_stream()`` builds an object)."""
    try:
        return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    except AttributeError:
        return int(torch.cuda.current_stream().cuda_stream)


def _core_stream(handle: int):
    s = _STREAMS.get(handle)
    if s is None:
        from numba.cuda.cudadrv.driver import _to_core_stream
        s = _STREAMS[handle] = _to_core_stream(_external(handle) if handle else 0)
    return s


def _external(handle):
    from numba import cuda
    return cuda.external_stream(handle)
