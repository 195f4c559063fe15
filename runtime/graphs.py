"""CUDA Graphs in both modes (lesson 13): ``CUDAGraph`` and ``graph``, torch's own on a GPU, and in
simulation a model of what a capture records and a replay runs again.

    g = runtime.CUDAGraph()
    with runtime.graph(g):            # capture: the launches are recorded, not run
        y = launcher(static_x)
    static_x.copy_(new_x)             # new data goes into the memory the capture saw
    g.replay()                        # every recorded launch again, on the same memory: y holds the result

On a GPU these are ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph`` themselves (the latter with
Python's cyclic garbage collector paused while it captures: see ``gpu_graph``). In simulation a
capture keeps a tape, in order, of what a GPU's capture would record and replays it:

* each launch of a course kernel (CUDA C++, Numba, Triton) made on torch's stream, with its
  arguments, is recorded and *not run*, as on a capturing stream; a replay launches it again
  with the same arguments, so it reads and writes the same tensors;
* a torch operator runs (its result must exist for the code after it) and is recorded; a replay
  runs it again on the same inputs and copies what it returns into the tensors the capture
  returned (an allocation is not repeated: the graph keeps its memory, as its private pool does);
* a Numba launch on Numba's own default stream (``kernel[grid, block](...)`` without
  ``utils.numba_stream()``, and not through ``utils.numba_launch``) runs at once and is not
  recorded: on a GPU it is not on the capturing stream, so the replay skips it;
* a host synchronisation (``.item()``, ``bool(t)``, ``float(t)``, ``print(t)``, ``torch.equal``)
  raises ``CaptureError``, as the GPU's "operation not permitted when stream is capturing" does;
  so does ``utils.to_numba``, which synchronises torch's stream for Numba; a copy to the host
  (``.cpu()``, ``.tolist()``, ``.numpy()``) raises it in torch's words on a GPU ("Cannot copy
  between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned");
* a capture that recorded nothing warns, as torch does ("The CUDA Graph is empty").

What simulation does not model: memory freed during a capture and reused by it, a capture's
random numbers (a replay draws new ones, as torch's graph-safe generator does), and work on
other streams joined into the capture.
"""
from __future__ import annotations

import contextlib
import gc
import warnings

import torch

from .backends import launches as _launches
from .config import SIMULATE

__all__ = ["CUDAGraph", "graph", "capturing", "CaptureError", "capture"]

#: torch's words on a GPU, which the simulated error repeats.
NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
EMPTY_WARNING = ("The CUDA Graph is empty. This usually means that the graph was attempted to be captured on "
                 "wrong device or stream.")
#: Tensor methods that copy a device value to the host (the host waits for the GPU).
_HOST_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
               "__repr__", "__str__", "__format__", "__array__"}
#: Aten operators whose result is a host value.
_HOST_OPS = {"_local_scalar_dense", "item", "equal", "is_nonzero"}
#: Allocations: a replay does not make them again (the graph keeps the memory it captured).
_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class CaptureError(RuntimeError):
    """What a capture cannot contain, in simulation: the GPU's error, and the call that caused it."""


def _spelling(name: str) -> str:
    return {"__bool__": "bool(tensor) (an `if` on a tensor)", "__int__": "int(tensor)",
            "__float__": "float(tensor)", "__index__": "a tensor used as an index or size",
            "__repr__": "print(tensor)", "__str__": "print(tensor)", "__format__": "an f-string of a tensor",
            "__array__": "numpy.asarray(tensor)"}.get(name, f"Tensor.{name}()")


#: torch's words for a copy to the host inside a capture (``.cpu()``, ``.tolist()``: a pageable copy).
COPY_REFUSED = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
                "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.")
#: The Tensor methods that copy the whole tensor to the host, which torch refuses in those words.
_COPIES = {"tolist", "numpy", "cpu", "__array__"}


def host_copy_error(what: str) -> CaptureError:
    return CaptureError(f"{COPY_REFUSED} (simulated: {what} copies the tensor to the host, a host synchronisation "
                        "inside a CUDA Graph capture)")


def host_sync_error(what: str, why: str = "copies a value to the host, which waits for the GPU") -> CaptureError:
    """The error of a host synchronisation inside a capture: ``what`` was called, ``why`` it waits."""
    return CaptureError(f"{NOT_PERMITTED} (simulated): {what} {why}: a host synchronisation inside a CUDA Graph "
                        "capture")


class _Tape:
    """What one simulated capture recorded, in order: ``("launch", name, thunk)`` and
    ``("op", name, (func, args, kwargs, out))``."""

    def __init__(self):
        self.entries: list = []

    def launch(self, backend: str, name: str, thunk) -> None:
        self.entries.append(("launch", f"{backend}:{name}", thunk))

    def op(self, func, args, kwargs, out) -> None:
        self.entries.append(("op", func.overloadpacket.__name__, (func, args, kwargs, out)))

    @property
    def kernels(self) -> list[str]:
        return [name for kind, name, _ in self.entries if kind == "launch"]


def _tensors(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _replay_op(func, args, kwargs, captured) -> None:
    if func.overloadpacket.__name__ in _ALLOCATIONS:
        return
    new = func(*args, **kwargs)
    for c, n in zip(_tensors(captured), _tensors(new)):
        if c is not n and not _same_memory(c, n):
            c.copy_(n)


def _modes(tape: _Tape):
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostReads(TorchFunctionMode):
        """Refuses the Tensor methods that read a value on the host."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in _HOST_READS and not _launches._STATE.inside and not _launches._STATE.tracking:
                raise (host_copy_error if name in _COPIES else host_sync_error)(_spelling(name))
            if name == "to" and not _launches._STATE.inside:
                dev = kwargs.get("device") if kwargs else None
                dev = dev if dev is not None else next((a for a in args[1:] if isinstance(a, (str, torch.device))),
                                                       None)
                if dev is not None and torch.device(dev).type == "cpu" and torch.device(dev) != args[0].device:
                    raise host_copy_error("Tensor.to('cpu')")
            return func(*args, **(kwargs or {}))

    class Ops(TorchDispatchMode):
        """Runs and records every torch operator outside a launch; refuses host values."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _launches._STATE.inside or _launches._STATE.tracking:
                return func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if name in _HOST_OPS:
                raise host_sync_error({"equal": "torch.equal"}.get(name, "Tensor.item()"))
            out = func(*args, **kwargs)
            tape.op(func, args, kwargs, out)
            return out

    return HostReads(), _launches.without_dynamo_import(Ops)()


class SimulatedGraph:
    """``torch.cuda.CUDAGraph`` in simulation: ``capture_begin``, ``capture_end``, ``replay``,
    ``reset``; ``kernels``, the names of the launches it recorded (simulation only)."""

    def __init__(self, keep_graph: bool = False):
        self._tape: _Tape | None = None
        self._capturing: _Tape | None = None
        self._modes: list = []

    # -- capture ----------------------------------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self._capturing is not None:
            raise RuntimeError("this CUDAGraph is capturing already")
        if self._tape is not None:
            raise RuntimeError("this CUDAGraph holds a capture already: reset() it, or make a new one")
        tape = self._capturing = _Tape()
        _launches._CAPTURES.append(tape)
        self._modes = list(_modes(tape))
        for m in self._modes:
            m.__enter__()

    def _stop(self, exc_info=(None, None, None)) -> _Tape:
        tape, self._capturing = self._capturing, None
        for m in reversed(self._modes):
            m.__exit__(*exc_info)
        self._modes = []
        if tape in _launches._CAPTURES:
            _launches._CAPTURES.remove(tape)
        return tape

    def capture_end(self) -> None:
        if self._capturing is None:
            raise RuntimeError("capture_end() without capture_begin()")
        tape = self._stop()
        if not tape.entries:
            warnings.warn(EMPTY_WARNING, UserWarning, stacklevel=2)
        self._tape = tape

    def _abandon(self, exc_info) -> None:
        if self._capturing is not None:
            self._stop(exc_info)

    # -- replay -----------------------------------------------------------------------------
    def replay(self) -> None:
        if _launches._CAPTURES:
            raise CaptureError(f"{NOT_PERMITTED} (simulated): a graph's replay inside another capture")
        if self._tape is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        for kind, _name, item in self._tape.entries:
            if kind == "launch":
                item()
            else:
                _replay_op(*item)

    def reset(self) -> None:
        if self._capturing is not None:
            raise RuntimeError("reset() while capturing")
        self._tape = None

    def pool(self):
        return None

    @property
    def kernels(self) -> list[str]:
        """The launches the capture recorded, as ``"backend:kernel"`` (simulation only)."""
        return [] if self._tape is None else self._tape.kernels


class simulated_graph(contextlib.ContextDecorator):
    """``torch.cuda.graph`` in simulation: ``with graph(g): ...`` captures the block into ``g``.
    ``pool``, ``stream`` and ``capture_error_mode`` are accepted as torch accepts them (a
    simulation has one stream and no pools)."""

    def __init__(self, cuda_graph: SimulatedGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        if not isinstance(cuda_graph, SimulatedGraph):
            raise TypeError(f"graph() takes a CUDAGraph (utils.CUDAGraph()), got {type(cuda_graph).__name__}")
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        self.cuda_graph.capture_begin(capture_error_mode=self.capture_error_mode)
        return self

    def __exit__(self, *exc_info):
        if exc_info[0] is not None:
            self.cuda_graph._abandon(exc_info)
            return False
        self.cuda_graph.capture_end()
        return False


def capturing() -> bool:
    """Whether a CUDA Graph capture is under way on this thread's current stream."""
    if SIMULATE:
        return bool(_launches._CAPTURES)
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class gpu_graph(torch.cuda.graph):
    """``torch.cuda.graph`` with Python's cyclic garbage collector paused during the capture. A
    ``CUDAGraph`` left in a reference cycle (a failed capture's graph, held by its exception's
    traceback) is otherwise destroyed whenever the collector runs, and destroying a graph inside
    a capture is not permitted: it breaks that capture ("operation failed due to a previous error
    during capture", on an H200 after a host read in an earlier capture of the same process)."""

    def __enter__(self):
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return super().__enter__()
        except BaseException:
            self._restore_gc()
            raise

    def __exit__(self, *exc_info):
        try:
            return super().__exit__(*exc_info)
        finally:
            self._restore_gc()

    def _restore_gc(self):
        if self._gc_was_enabled:
            gc.enable()


if SIMULATE:
    CUDAGraph, graph = SimulatedGraph, simulated_graph
else:
    CUDAGraph, graph = torch.cuda.CUDAGraph, gpu_graph


def capture(cuda_graph, fn, *args, **kwargs):
    """``(what fn returned, None)`` after capturing ``fn(*args, **kwargs)`` into ``cuda_graph``, or
    ``(None, the exception)`` when the capture failed: the one the captured code raised, where it
    raised one (on a GPU the capture's end then fails too, "operation failed due to a previous
    error during capture"). After a failure the GPU is left as it was
    before: torch's current stream put back (a capture that raised leaves its own current), and
    torch's CUDA generator taken out of the capture mode a failed capture leaves it in (until a
    capture succeeds, ``torch.randn`` on the GPU raises). The graders capture through this."""
    if SIMULATE:
        try:
            with graph(cuda_graph):
                out = fn(*args, **kwargs)
            return out, None
        except Exception as e:
            return None, e
    prev = torch.cuda.current_stream()
    first = []  # what the captured code raised: the end of the capture then raises again, of that
    try:
        with gpu_graph(cuda_graph):
            try:
                out = fn(*args, **kwargs)
            except Exception as e:
                first.append(e)
                raise
        return out, None
    except Exception as e:
        torch.cuda.set_stream(prev)
        recover_after_failed_capture()
        return None, first[0] if first else e
    finally:
        torch.cuda.set_stream(prev)


def recover_after_failed_capture() -> None:
    """One small capture that succeeds (on a GPU): it takes torch's default CUDA generator out of
    the capture mode that a failed capture leaves it in (a capture's end puts it back)."""
    if SIMULATE:
        return
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    t = torch.zeros(1, device="cuda")
    with gpu_graph(torch.cuda.CUDAGraph(), stream=torch.cuda.Stream()):
        t.add_(1)
    torch.cuda.synchronize()
