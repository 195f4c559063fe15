"""The grading harness shared by every topic: poisoned and guarded memory, running the
learner's function, comparing with the float64 reference, and the hints common to several
topics. Each topic's own inputs and diagnoses live in ``utils/topics/<topic>.py``.

    utils.check_relu(relu_triton)          # prints one line, or raises GradingError

Each grader takes ``fn``, a launcher that takes contiguous float32 tensors on
``utils.DEVICE`` and returns its result, and on every call:

* draws fresh random inputs (a new seed each call; a failure names it, and
  ``check_xxx(fn, seed=...)`` repeats the same inputs) of awkward sizes from
  ``utils.SIZES.grader_sizes`` / ``grader_shapes``: 1, 7, 1023, 1025, 2^k+1, ...;
* puts every input inside a larger buffer whose extra elements hold NaN, so a read
  past the end turns the result into NaN instead of a plausible number;
* while ``fn`` runs, makes ``torch.empty``, ``torch.empty_like``, ``torch.empty_strided``
  and ``Tensor.new_empty`` hand out tensors filled with a recognisable NaN and
  surrounded by guard elements: afterwards, elements still holding that NaN were
  never written, and changed guard elements were written past an end;
* runs ``fn`` a second time (in simulation, CUDA C++ kernels under the emulator's random
  thread order) and compares: a result that changes between runs is a race;
* checks that the inputs did not change, compares with the topic's float64 reference
  using ``utils.TOLERANCES``, and names the wrong elements as index ranges, with a hint
  about the usual cause;
* rejects right values that torch or the course's reference computed instead of a kernel.

A stub that raises ``NotImplementedError`` is reported as "not solved yet".

All of this happens in one place, the grading loop ``grade``: a grader describes its cases
and its outputs (``Output``: name, reference, tolerance, diagnosis) and the loop runs every
call. ``success``, which prints "correct", refuses a grader whose calls did not go through it.
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import re
import struct
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from runtime.backends import cuda as _cuda
from runtime.backends import launches as _launches
from runtime.backends import stores as _stores
from runtime.backends.launches import record_launches
from runtime.config import DEVICE, SIMULATE, SIZES

from . import check as _check
from . import guard as _guard

# What ``utils`` exports; topic modules import the rest of the harness by name.
__all__ = ["GradingError", "show_rejection", "POISON_BITS", "check_traffic", "check_shared"]


#: Set to 1 (in the environment, or ``os.environ`` in a cell) to see a GradingError's full
#: traceback, grader frames included, instead of the diagnosis alone.
FULL_TRACEBACK_ENV = "COURSE_FULL_TRACEBACK"
_HERE = os.path.dirname(os.path.abspath(__file__))
#: The runtime beneath the kernels (runtime/): the course's code, never the learner's.
_RUNTIME = os.path.join(os.path.dirname(_HERE), "runtime")


class GradingError(AssertionError):
    """A kernel gave a wrong result; the message says where and what usually causes it.

    In Jupyter it shows as its message alone, preceded by the learner's own frames when the
    learner's code raised (the grader's ~70 lines of frames say nothing about the kernel).
    The full traceback stays available: ``COURSE_FULL_TRACEBACK=1`` (in the environment, or
    set with ``os.environ`` in a cell) shows it for every GradingError, and right after one
    ``import sys, traceback; traceback.print_exception(sys.last_value)`` prints it.
    """

    @property
    def _render_traceback_(self):
        # IPython asks hasattr(err, "_render_traceback_"): raising AttributeError here makes
        # it print its usual full traceback.
        if os.environ.get(FULL_TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            raise AttributeError("_render_traceback_")
        return self._short_traceback

    def _short_traceback(self) -> list[str]:
        lines = []
        cause = self.__cause__
        if cause is not None and cause.__traceback__ is not None:
            frames = [f for f in traceback.extract_tb(cause.__traceback__) if _learner_frame(f.filename)]
            if frames:
                lines.append(f"{type(cause).__name__} raised in your code:")
                lines += [ln.rstrip("\n") for ln in traceback.format_list(frames)]
                lines.append("")
        lines.append(f"{type(self).__name__}: {self}")
        return lines


def _learner_frame(filename: str) -> bool:
    """A frame of the learner's code (a notebook cell, kernels/, their own files), not of the
    grader, the emulator or an installed package."""
    path = os.path.abspath(filename)
    return not (path.startswith((_HERE + os.sep, _RUNTIME + os.sep)) or "site-packages" in path
                or os.sep + "lib" + os.sep + "python" in path or filename.startswith("<frozen"))


# --------------------------------------------------------------------------------------
# Poisoned, guarded memory
# --------------------------------------------------------------------------------------
#: float32 bit pattern of the NaN that fresh outputs are filled with ("never written").
POISON_BITS = 0x7FF0DEAD
#: float32 bit pattern of the NaN around the grader's inputs ("read past the end").
INPUT_GUARD_BITS = 0x7FF1BAD0
#: Guard elements before and after each buffer: wider than any sensible block, so an
#: unmasked tail block writes into the guard, never into someone else's memory.
GUARD = 16384

_ORIG = dict(
    empty=torch.empty,
    empty_like=torch.empty_like,
    empty_strided=torch.empty_strided,
    new_empty=torch.Tensor.new_empty,
)


#: The same markers in the other float dtypes: NaNs with a payload of their own, compared bit by
#: bit, so that a NaN the kernel's arithmetic wrote (0/0, inf - inf: the default NaN, payload 0)
#: is never taken for an element it never wrote.
_MARKERS = {
    POISON_BITS: {torch.float16: (torch.int16, 0x7EAD), torch.bfloat16: (torch.int16, 0x7FED),
                  torch.float64: (torch.int64, 0x7FF8DEADDEADDEAD)},
    INPUT_GUARD_BITS: {torch.float16: (torch.int16, 0x7EBA), torch.bfloat16: (torch.int16, 0x7FEB),
                       torch.float64: (torch.int64, 0x7FF9BAD0BAD0BAD0)},
}


def _marker(dtype, bits: int):
    """(integer view dtype, bit pattern) of marker ``bits`` in ``dtype`` (None: not a float
    dtype with a marker)."""
    if dtype == torch.float32:
        return torch.int32, bits
    return _MARKERS.get(bits, {}).get(dtype)


def _poison_fill(t: torch.Tensor, bits: int) -> None:
    """Fill ``t`` with a NaN of the given float32 bit pattern (its own pattern in the other float
    dtypes, see ``_MARKERS``)."""
    if t.numel() == 0:
        return
    marker = _marker(t.dtype, bits)
    if marker is not None:
        t.view(marker[0]).fill_(marker[1])
    elif t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype in (torch.int32, torch.int64, torch.int16):
        t.fill_(0x5A5A)  # a recognisable garbage value: uninitialised counters are a bug
    # bool / uint8: left as they are


def _is_poison(t: torch.Tensor, bits: int) -> torch.Tensor:
    marker = _marker(t.dtype, bits)
    if marker is not None:
        return t.view(marker[0]) == marker[1]
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    if t.dtype in (torch.int32, torch.int64, torch.int16):
        return t == 0x5A5A
    return torch.zeros(t.shape, dtype=torch.bool, device=t.device)


class _Guarded:
    """A tensor that is a view into the middle of a larger, poisoned buffer."""

    def __init__(self, shape, dtype, device, bits, how):
        shape = tuple(int(s) for s in shape)
        self.numel = math.prod(shape)
        self.buf = _ORIG["empty"](self.numel + 2 * GUARD, dtype=dtype, device=device)
        _poison_fill(self.buf, bits)
        self.bits = bits
        self.how = how
        self.view = self.buf[GUARD:GUARD + self.numel].view(shape)

    def written_before(self) -> int:
        return int((~_is_poison(self.buf[:GUARD], self.bits)).sum())

    def written_after(self) -> int:
        return int((~_is_poison(self.buf[GUARD + self.numel:], self.bits)).sum())

    def first_written_after(self) -> int:
        m = ~_is_poison(self.buf[GUARD + self.numel:], self.bits)
        idx = torch.nonzero(m)
        return int(idx[-1]) + 1 if idx.numel() else 0

    def never_written(self) -> torch.Tensor:
        return _is_poison(self.view, self.bits)


_SUPPORTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


class _Allocations:
    """While active, fresh torch tensors are poisoned and guarded; all are remembered."""

    def __init__(self):
        self.records: list[_Guarded] = []

    def _wrap(self, t: torch.Tensor, how: str) -> torch.Tensor:
        if (not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.requires_grad
                or t.device.type == "meta" or t.numel() == 0):
            return t
        if t.dtype in _SUPPORTED and t.is_contiguous():
            g = _Guarded(t.shape, t.dtype, t.device, POISON_BITS, how)
            self.records.append(g)
            return g.view
        _poison_fill(t, POISON_BITS)
        return t

    @contextlib.contextmanager
    def active(self):
        def empty(*args, **kwargs):
            if kwargs.get("out") is not None:
                return _ORIG["empty"](*args, **kwargs)
            return self._wrap(_ORIG["empty"](*args, **kwargs), "torch.empty")

        def empty_like(*args, **kwargs):
            return self._wrap(_ORIG["empty_like"](*args, **kwargs), "torch.empty_like")

        def empty_strided(*args, **kwargs):
            return self._wrap(_ORIG["empty_strided"](*args, **kwargs), "torch.empty_strided")

        def new_empty(self_t, *args, **kwargs):
            return self._wrap(_ORIG["new_empty"](self_t, *args, **kwargs), "Tensor.new_empty")

        torch.empty, torch.empty_like, torch.empty_strided = empty, empty_like, empty_strided
        torch.Tensor.new_empty = new_empty
        try:
            yield self
        finally:
            torch.empty = _ORIG["empty"]
            torch.empty_like = _ORIG["empty_like"]
            torch.empty_strided = _ORIG["empty_strided"]
            torch.Tensor.new_empty = _ORIG["new_empty"]

    def find(self, t) -> _Guarded | None:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return None
        for g in self.records:
            if (g.view.data_ptr() == t.data_ptr() and g.numel == t.numel() and g.view.dtype == t.dtype
                    and t.is_contiguous()):
                return g
        return None


def _poison_allocator(numel: int) -> None:
    """Best effort for outputs allocated in C++ (``torch::empty`` in an extension), which
    the Python-level patches cannot reach: fill a block of the output's size with the
    poison and free it. Allocators (torch's CUDA caching allocator above all) tend to hand
    the same block to the next request of that size, so unwritten elements show the poison."""
    if numel <= 0:
        return
    block = _ORIG["empty"](numel, dtype=torch.float32, device=DEVICE)
    _poison_fill(block, POISON_BITS)
    del block


def guarded_input(values: torch.Tensor, dtype=torch.float32) -> tuple[torch.Tensor, _Guarded]:
    """``values`` copied to ``DEVICE`` as ``dtype`` into the middle of a NaN-guarded buffer."""
    g = _Guarded(values.shape, dtype, DEVICE, INPUT_GUARD_BITS, "input")
    g.view.copy_(values.to(dtype))
    g.orig = values.to(dtype).contiguous()
    return g.view, g


# --------------------------------------------------------------------------------------
# Running fn
# --------------------------------------------------------------------------------------
def _raised_in_kernel(e: BaseException) -> str | None:
    """The message of ``raise NotImplementedError("not solved yet: ...")`` in a Triton kernel that a
    GPU compile refused: its error keeps the statement (``node``), whose lines it may not quote
    whole (a message continued on the next line)."""
    node = getattr(e, "node", None)
    exc = getattr(node, "exc", None)
    if type(node).__name__ != "Raise" or type(exc).__name__ != "Call" or not getattr(exc, "args", None):
        return None
    try:
        import ast
        value = ast.literal_eval(exc.args[0])
    except Exception:
        return None
    return value.strip() if isinstance(value, str) and "not solved yet" in value else None


def stub_message(e: BaseException) -> str | None:
    """The whole "not solved yet: ..." message of a stub that raised anywhere in ``e``'s chain
    (Triton's interpreter and autograd wrap it; a GPU compile error quotes it, apostrophes and
    all), or None: the stub's own error where the chain reaches it, else the quoted line, less
    the quote and parenthesis that close it where an exception's repr quotes it."""
    first, seen = e, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError) and "not solved yet" in str(e):
            return str(e).strip()
        raised = _raised_in_kernel(e)
        if raised:
            return raised
        e = e.__cause__ or e.__context__
    text = f"{first}\n{first.__cause__ or ''}"
    stub = (re.search(r"([\"'])(not solved yet.*?)\1\)*[ \t]*$", text, re.M)
            or re.search(r"()(not solved yet.*?)[ \t]*$", text, re.M))
    return stub.group(2).replace("\\'", "'").replace('\\"', '"') if stub else None


def _fresh_seed() -> int:
    return struct.unpack("<I", os.urandom(4))[0] % 1_000_000


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _fault_hint(msg: str) -> str:
    low = msg.lower()
    if "data race" in low:  # the race reports (emulator and simulators) name both accesses and the fix
        return ("two threads touch the same element without synchronization: the report above says "
                "where and how to fix it.")
    if "third launch parameter" in low:
        return ("extern __shared__ memory is as large as the launch says, in bytes: "
                "k[grid, block, n_elements * 4](...) for n_elements floats.")
    if "__shared__ array" in low:
        return ("a thread wrote outside a __shared__ array: its size is fixed when the kernel is compiled "
                "(BLOCK), so every index into it (threadIdx.x, t + stride) must stay below BLOCK, and the "
                "kernel must be launched with at most BLOCK threads per block.")
    if "off-by-one" in low:  # Triton's interpreter: a masked access whose offsets the mask does not test
        return ("the mask lets through a lane whose offset is out of bounds: load and store at the same "
                "offsets the mask tests (offs, not offs + 1).")
    if any(w in low for w in ("out of bounds", "out-of-bounds", "past the end", "before the start",
                              "out of range", "index")):
        return "a thread read or wrote outside a tensor: is every access guarded by the bounds check (idx < n)?"
    if any(w in low for w in ("syncthreads", "barrier", "diverg", "deadlock")):
        return ("not every thread of the block reached the same __syncthreads(): keep barriers outside "
                "`if (idx < n)` and make every thread run the same number of loop iterations around them.")
    if "segmentation" in low or "crash" in low or "signal" in low:
        return "the kernel crashed: usually a pointer used past the end of its tensor."
    return "read the message above: it names the kernel and what went wrong."


def _exception_hint(e: BaseException, inputs=()) -> str:
    """The hint for an error the learner's function raised (not a kernel fault); ``inputs``:
    what the function was given, whose dtypes the hint names."""
    text = str(e)
    # On a GPU a bad access is found by the hardware, not by a checker: the error names no line,
    # and it leaves the process's CUDA context unusable (every later CUDA call fails too)
    low = text.lower()
    if any(w in low for w in ("illegal memory access", "misaligned address", "unspecified launch failure",
                              "device-side assert", "illegal instruction")):
        return ("the GPU stopped the kernel: a thread read or wrote outside a tensor (or a device assert "
                "failed). Is every access guarded by the bounds check (idx < n, a mask)? After this error "
                "the GPU refuses every later call in this process: restart the notebook's kernel. Run the "
                "check in simulation (COURSE_SIMULATE=1), where the report names the line and the index.")
    # Numba's simulator and its GPU target take arrays, not torch tensors
    if re.search(r"torch\.\w*Tensor|'Tensor'|of type Tensor", text) and (
            "tid=" in text or "numba" in type(e).__module__ or "numba" in text.lower()):
        return ("a Numba kernel was given a torch tensor: pass utils.to_numba(t) for each tensor argument "
                "(kernel[grid, block](utils.to_numba(x), utils.to_numba(y), ...)).")
    # reshape(()) of what should be one value: a reduction stopped after one pass
    left = re.search(r"shape '\[\]' is invalid for input of size (\d+)", text)
    if left and int(left.group(1)) > 1:
        k = int(left.group(1))
        return (f"{k} values were left where one was expected (reshape(()) needs exactly one): one pass of a "
                f"reduction leaves cdiv(n, BLOCK) partial sums, {k} here. Reduce those again, pass after "
                "pass, until one value is left (while values.numel() > 1: ...), or combine the blocks' "
                "partial sums with atomics.")
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in inputs if isinstance(t, torch.Tensor)})
    kinds = " and ".join(dtypes) if dtypes else "float32"
    return f"the inputs are {kinds} tensors on utils.DEVICE; the traceback above shows where it failed."


def _fault_in(e: BaseException, fault_cls):
    """The KernelFault (race reports included) that ``e`` is or wraps: Triton's interpreter
    wraps what a kernel raises in its own error."""
    seen = set()
    while e is not None and fault_cls is not None and id(e) not in seen:
        if isinstance(e, fault_cls):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _is_race(msg: str) -> bool:
    low = msg.lower()
    return "data race" in low or "race on" in low or "hazard" in low


class Case:
    """One input set: its label, input values (CPU), the float64 reference and how to build inputs."""

    def __init__(self, label, values, expected, make=None, extra=None, resize=None, kwargs=None):
        self.label = label
        self.resize = resize            # optional: n -> a Case of the same kind with n elements (probes)
        self.values = values            # tuple of CPU float32 tensors
        self.expected = expected        # CPU float64 tensor
        self.make = make                # optional: () -> (inputs, guards) for special layouts
        self.extra = extra or {}
        self.kwargs = kwargs or {}      # keyword arguments of the call (AdamW's step and hyperparameters)
        self.numel = expected.numel() if expected.dim() else values[0].numel()


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits on the CPU, as integers of its element size (NaN equals the same NaN)."""
    t = t.detach().cpu().contiguous()
    return t.view(_INT_OF_SIZE[t.element_size()]) if t.dtype != torch.bool else t


class _Run:
    def __init__(self, out, inputs, in_guards, allocs, launches=None, case=None, in_loop=False):
        self.case = case  # the Case it ran on (a rejection names it)
        self.out = out
        self.inputs = inputs
        self.in_guards = in_guards
        self.allocs = allocs
        self.launches = launches  # the kernels and torch operators the call ran (utils.record_launches)
        self.stores = None        # who wrote the memory fn returned or was given (``_Stores``)
        self.in_loop = in_loop    # made by the grading loop (``grade``), or by a diagnosis it ran
        self.outputs = {}         # the loop's outputs: name -> the tensor fn returned (or wrote into)
        self.got = {}             # name -> that tensor as float64 on the CPU


class _Stores:
    """Who wrote each element of what one call of ``fn`` returned or was given, taken from a
    ``runtime.backends.stores.StoreTracker`` when the call ended (the tracker's snapshots are
    dropped then): what ``Grader.check_launched`` needs to refuse values written on the host."""

    def __init__(self, tracker, reachable):
        self.broken = tracker.broken
        self.kernel_stored = tracker.kernel_stored
        self.made_inside = set(tracker.made_inside)
        self.status = {}   # (data_ptr, shape, stride, dtype) -> status of each element (uint8, CPU)
        if self.broken is None:
            for t in _stores._tensors(reachable):
                if isinstance(t, torch.Tensor) and t.numel() and t.layout == torch.strided:
                    st = tracker.statuses(t)
                    if st is not None:
                        self.status[self._key(t)] = st
        tracker.release()

    @staticmethod
    def _key(t):
        return t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype

    def verdict(self, outputs) -> str | None:
        """Why the values of ``outputs`` (name -> what fn returned for it) are not the work of the
        kernels the call launched (None: they are, or the tracker cannot tell)."""
        if self.broken is not None:
            return None
        for name, t in outputs.items():
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            what = _the(RESULT) if name == RESULT else name
            st = self.status.get(self._key(t))
            if st is None:
                made = t.layout == torch.strided and t.untyped_storage().data_ptr() in self.made_inside
                if made or self.kernel_stored:
                    continue  # made by a launch, or a copy the tracker could not follow of memory a kernel wrote
                return (f"the kernel you launched stored nothing, anywhere: the values of {what} were written "
                        "outside any kernel (on the host: computed with numpy or Python and copied in). Your "
                        "kernel must compute them and store them itself.")
            kernel, total = int((st == _stores.KERNEL).sum()), st.numel()
            host = int((st == _stores.HOST).sum())
            if not kernel:
                host += int((st == _stores.PRE).sum())  # memory a launch was handed, full before it ran
            if host:
                wrote = "none" if kernel == 0 else f"{kernel} of {total}"
                return (f"the kernel you launched wrote {wrote} of the values of {what}; {host} of its {total} "
                        "values were written outside any kernel (on the host: with numpy or Python, or copied "
                        "from a host buffer). Your kernel must compute every value and store it itself.")
        return None


def kernel_work(fn, *args, what: str | None = None):
    """``(fn(*args), why)``: call ``fn`` as a graded call runs, and say why its result is not the
    work of the kernels it launched (``why`` None: it is). For graders that call a function
    outside the grading loop (lesson 07's ``check_custom_op``)."""
    tracker = _stores.StoreTracker(args)
    with _Allocations().active(), record_launches(stores=tracker) as rec:  # what fn allocates is poisoned
        out = fn(*args)
        _sync()
    tracker.finish()
    why = launch_verdict(rec, (), True, fn) or _Stores(tracker, (out, args)).verdict({what or RESULT: out})
    return out, why


#: Grader name -> the aten operators (beyond allocation, views, fills, copies and casts) a
#: launcher may run, where its exercise says so: the topic spec's ``torch_ops_allowed``.
TORCH_OPS_ALLOWED: dict[str, frozenset] = {}

#: The aten operators of the usual torch answers, as a learner writes them (beyond
#: ``runtime/backends/launches.py``'s table); ``<op>_backward`` is named as the backward of ``<op>``.
_OP_NAMES = {
    "native_layer_norm": "torch.nn.functional.layer_norm",
    "_fused_rms_norm": "torch.nn.functional.rms_norm", "rms_norm": "torch.nn.functional.rms_norm",
    "mean": "torch.mean", "var": "torch.var", "var_mean": "torch.var_mean", "std": "torch.std",
    "rsqrt": "torch.rsqrt", "sqrt": "torch.sqrt", "pow": "** (torch.pow)", "log": "torch.log",
    "logsumexp": "torch.logsumexp", "masked_fill": "Tensor.masked_fill", "baddbmm": "torch.baddbmm",
    "_scaled_dot_product_attention_math": "torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_cudnn_attention": "torch.nn.functional.scaled_dot_product_attention",
    "_efficient_attention_forward": "torch.nn.functional.scaled_dot_product_attention",
    "_flash_attention_forward": "torch.nn.functional.scaled_dot_product_attention",
}


def op_name(op: str) -> str:
    """How a learner wrote an aten operator, and what torch ran: ``"torch.softmax
    (aten._softmax)"``; an autograd backward is named as the backward of its forward
    (``"the backward of torch.nn.functional.layer_norm, run by autograd (aten.native_layer_norm_backward)"``)."""
    if op.endswith("_backward") and op != "_backward":
        base = op[: -len("_backward")]
        friendly = _OP_NAMES.get(base) or _launches.torch_op_name(base).split(" (aten.")[0]
        return f"the backward of {friendly}, run by autograd (aten.{op})"
    if op in _OP_NAMES:
        return f"{_OP_NAMES[op]} (aten.{op})"
    return _launches.torch_op_name(op)


def launch_verdict(launches, allowed=(), need_kernel: bool = True, fn=None) -> str | None:
    """Why a call's right values are not its own kernel's work (None: they are). The course's
    references called from the learner's function (``<topic>_ref64``, recorded by the topic's
    spec) come first, then the torch operators that computed, then a call that launched nothing."""
    if getattr(launches, "stopped", False):  # the recording was taken off: nothing it saw can be trusted
        return launches.verdict(allowed, need_kernel, fn)
    refs = list(getattr(launches, "references", None) or ())
    ops = launches.computing_ops(allowed)
    if refs:
        via = f" (with {', '.join(op_name(o) for o in ops[:2])})" if ops else ""
        return (f"your function returned the right values, but the course's own reference {refs[0]}{via} "
                "computed them: that is what the grader compares with. Launch your kernel, which must compute "
                "the result itself.")
    if ops:
        names = ", ".join(op_name(op) for op in ops[:3]) + (", ..." if len(ops) > 3 else "")
        verb = "computed" if len(ops) == 1 else "computed (part of)"
        return (f"your function returned the right values, but {names} {verb} them: launch your kernel, "
                "which must compute the result itself.")
    return launches.verdict(allowed, need_kernel, fn)


def torch_operator(op) -> str | None:
    """How to name ``op`` if it is torch's own operator or function (``aten.relu.default``,
    ``torch.relu``), not one the learner registered (None: it is not torch's)."""
    qualified = getattr(op, "_qualified_op_name", None) or ""   # "aten::relu" (an OpOverloadPacket)
    ns = getattr(op, "namespace", None) or (qualified.split("::")[0] if "::" in qualified else None)
    if ns is not None and type(op).__name__ in ("OpOverload", "OpOverloadPacket"):
        if ns in _launches._TORCH_NAMESPACES:
            name = getattr(op, "__name__", None) or qualified.split("::")[-1]
            return f"{op_name(name.split('.')[0])}, torch's own operator {ns}.{name}"
        return None
    if type(op).__module__.startswith("torch._library"):   # torch.library.custom_op: the learner's
        return None
    mod = getattr(op, "__module__", None) or ""
    if callable(op) and (mod == "torch" or mod.startswith("torch.")):
        return f"torch's own function {mod}.{getattr(op, '__name__', op)}"
    return None


def refuse_torch_operator(op, grader: str) -> None:
    """A grader of operators (lesson 07's ``check_custom_op``) refuses torch's own: its values,
    fake kernel and gradient are right because torch wrote them."""
    name = torch_operator(op)
    if name:
        raise GradingError(f"{grader}: your operator is {name}: torch computes its values, its fake kernel and its "
                           "gradient, so this check would only test torch. Register your own operator around your "
                           "kernel (torch.library.custom_op(\"mylib::myop\", ...)) and pass that.")


#: Every Grader made, in order, while a graded call (``graded``) runs: it checks their calls.
#: Empty outside graded calls (nothing is kept).
_made: list = []
#: One entry per graded call running now: (the grader, where its Graders start in ``_made``).
_graded_calls: list = []
#: Lists that ``graders_made`` fills with every Grader made while it is active.
_watchers: list = []


def graded(check):
    """``check`` (a topic's grader) made to refuse, whatever it prints when it is done, a call
    whose right values torch or the course's reference computed: after ``check`` returns, every
    call of every ``Grader`` it made must have been the learner's kernels' work
    (``Grader.check_all_launched``). What it printed is shown after that, so "correct" is never
    printed for torch's answer. ``Spec`` wraps every grader in its ``checks`` with this, so a new
    topic's graders get it without asking."""
    if getattr(check, "__course_graded__", False):
        return check

    @functools.wraps(check)
    def grader(*args, **kwargs):
        start = len(_made)
        out = io.StringIO()
        _graded_calls.append((check, start))
        try:
            with contextlib.redirect_stdout(out):
                result = check(*args, **kwargs)
                for g in _made[start:]:
                    g.check_all_launched()
        finally:
            del _made[start:]
            _graded_calls.pop()
            print(out.getvalue(), end="")
        return result
    grader.__course_graded__ = True
    return grader


@contextlib.contextmanager
def graders_made():
    """The list of every ``Grader`` made inside the block, in order: how a test sees which
    Graders a check made and whether their calls went through the grading loop."""
    made: list = []
    _watchers.append(made)
    try:
        yield made
    finally:
        _watchers.remove(made)


#: The grader running now, by name: ``success`` asks it whether every call was the learner's
#: own kernels' work, made by the grading loop, before it prints "correct".
_running: dict = {}


class Grader:
    def __init__(self, name, fn, seed):
        if not callable(fn):
            raise TypeError(f"{name} expects a function (your launcher), got {type(fn).__name__}")
        _guard.verify(name)  # graders, harness and torch as `import utils` found them (utils/guard.py)
        self.name = name
        self.fn = fn
        self.user_seed = seed
        self.seed = _fresh_seed() if seed is None else int(seed)
        self.gen = torch.Generator().manual_seed(self.seed)
        self.case = None
        self.runs: list[_Run] = []   # every call of fn: success() checks that kernels did the work
        self.looped = False          # the grading loop (``grade``) ran on this Grader
        self._loop = None            # the loop running now (its diagnoses may ask for more runs)
        _running[name] = self
        if _graded_calls:
            _made.append(self)
        for made in _watchers:
            made.append(self)

    # -- failure -----------------------------------------------------------------------
    def fail(self, what: str, hint: str | None = None, cause=None, race_report=False):
        where = f" on {self.case.label}" if self.case is not None else ""
        text = f"{self.name} failed{where}:\n{what}"
        if hint:
            text += f"\nHint: {hint}"
        text += f"\n(Inputs came from seed {self.seed}: {self.name}(fn, seed={self.seed}) repeats them.)"
        err = GradingError(text)
        err.race_report = race_report  # a race detector's report: the loop may add a grader's hint
        if cause is not None:
            raise err from cause
        raise err

    # -- one call of fn ------------------------------------------------------------------
    def call(self, case: Case, schedule_seed=None) -> _Run:
        if case.make is not None:
            inputs, in_guards = case.make()
        else:
            pairs = [guarded_input(v) for v in case.values]
            inputs = tuple(p[0] for p in pairs)
            in_guards = [p[1] for p in pairs]
        allocs = _Allocations()
        tracker = _stores.StoreTracker((inputs, case.kwargs))  # before the poison: its snapshots allocate
        _poison_allocator(case.expected.numel())
        # looked up at each call (a test may stand in for the emulator's schedule)
        sched = getattr(_cuda, "emulation_schedule", None) if schedule_seed is not None else None
        ctx = sched("random", seed=schedule_seed) if sched is not None else contextlib.nullcontext()
        fault_cls = getattr(_cuda, "KernelFault", None)
        try:
            with ctx, allocs.active(), record_launches(stores=tracker) as launches:
                out = self.fn(*inputs, **case.kwargs)
                _sync()
                _guard.verify(self.name, out)  # the learner's function may have replaced something
            tracker.finish()
        except NotImplementedError as e:
            msg = str(e) or "the function raises NotImplementedError"
            if "not solved yet" not in msg:
                msg = f"not solved yet: {msg}"
            raise GradingError(msg) from None
        except GradingError:
            raise
        except Exception as e:  # every failure of fn becomes a diagnosis
            # A stub raised inside a kernel reaches us wrapped: Triton's interpreter wraps it in
            # an InterpreterError (caused by the stub's error), a GPU compile turns it into a
            # CompilationError that quotes it. The message is taken whole, to the end of its line,
            # less the quote and parenthesis that close it where an exception's repr quotes it.
            stub = stub_message(e)
            if stub:
                raise GradingError(stub) from None
            fault = _fault_in(e, fault_cls)
            if fault is not None and _is_race(str(fault)):
                # the race detector's report names both accesses and the fix: it is the diagnosis
                self.fail(f"the kernel has a race (on a GPU its result would depend on timing):\n{fault}",
                          cause=fault, race_report=True)
            if fault is not None:
                self.fail(f"the kernel faulted: {fault}", _fault_hint(str(fault)), cause=fault)
            if isinstance(e, IndexError):
                self.fail(f"{type(e).__name__}: {e}", _fault_hint("index out of range"), cause=e)
            self.fail(f"your function raised {type(e).__name__}: {e}", _exception_hint(e, inputs), cause=e)
        run = _Run(out, inputs, in_guards, allocs, launches, case, in_loop=self._loop is not None)
        run.stores = _Stores(tracker, (out, inputs, case.kwargs))
        self.runs.append(run)
        return run

    # -- checks on one run -----------------------------------------------------------------
    def output_tensor(self, run: _Run, shape, *, scalar=False, dtypes=(torch.float32,)) -> torch.Tensor:
        return self.as_output(run.out, shape, scalar=scalar, dtypes=dtypes)

    def as_output(self, out, shape, *, scalar=False, dtypes=(torch.float32,), what="the result") -> torch.Tensor:
        """``out`` (what ``fn`` returned for one output) as a tensor on DEVICE of ``shape`` and one
        of ``dtypes`` (a scalar: one number, float64 allowed too), or a failure that says why not;
        ``what`` names the output in the messages."""
        if out is None:
            self.fail("your function returned None: return the output tensor.")
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]
        if not isinstance(out, torch.Tensor):
            if scalar and isinstance(out, (int, float)):
                out = torch.tensor(float(out), dtype=torch.float64, device=DEVICE)
            elif hasattr(out, "__array__") or hasattr(out, "__cuda_array_interface__") or hasattr(out, "copy_to_host"):
                try:
                    out = torch.as_tensor(out.copy_to_host() if SIMULATE and hasattr(out, "copy_to_host") else out,
                                          device=DEVICE)
                except Exception:
                    self.fail(f"your function returned a {type(out).__name__}: return a torch tensor "
                              "(utils.from_numba turns a Numba array into one).")
            else:
                self.fail(f"your function returned a {type(out).__name__}, not a torch tensor.")
        if out.device.type != DEVICE.type:
            self.fail(f"{what} is on {out.device}, but the course runs on {DEVICE}: "
                      "create the output on the input's device (torch.empty_like(x)).")
        if scalar:
            if out.numel() != 1:
                self.fail(f"{what} has shape {tuple(out.shape)}: it is one number "
                          "(a 0-d tensor or a tensor of shape (1,)).")
            dtypes = dtypes + (torch.float64,)
        else:
            self.check_shape(out, shape, what)
        self.check_dtype(out, dtypes, what)
        return out

    def check_dtype(self, out: torch.Tensor, dtypes, what="the result") -> None:
        """Fail, naming the dtype, unless ``out`` has one of ``dtypes``: a wrong dtype is said
        before anything about the values (which it rounds, or reinterprets)."""
        if out.dtype in dtypes:
            return
        want = " or ".join(str(d) for d in dict.fromkeys(dtypes[:2]))
        hint = ("allocate it with the input's dtype (torch.empty_like(x), with no dtype= argument) and return it "
                "as the kernel wrote it (no .to(), .half(), .double()).")
        if out.dtype.is_floating_point and dtypes[0].is_floating_point:
            bits = [1 + round(-math.log2(torch.finfo(d).eps)) for d in (out.dtype, dtypes[0])]
            if bits[0] < bits[1]:
                hint = (f"every value stored into a {str(out.dtype).replace('torch.', '')} tensor is rounded to "
                        f"{bits[0]} significant bits ({str(dtypes[0]).replace('torch.', '')} keeps {bits[1]}): "
                        + hint)
        self.fail(f"{what} has dtype {out.dtype}, expected {want}.", hint)

    def check_shape(self, out: torch.Tensor, shape, what="the result",
                    reshape="reshape the output to {shape} (out.view(x.shape))") -> None:
        """Fail unless ``out`` has ``shape``; where only the shape is wrong (the number of
        elements is right) the hint says ``reshape``, formatted with the shape."""
        if tuple(out.shape) != tuple(shape):
            hint = None
            if out.numel() == math.prod(shape):
                hint = f"the number of elements is right: {reshape.format(shape=tuple(shape))}."
            self.fail(f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)}.", hint)

    def check_guards(self, run: _Run, out: torch.Tensor, *, out_noun="output"):
        self.check_output_guards(run, [(f"the {out_noun}", out)])

    def check_output_guards(self, run: _Run, outputs, hint: str | None = None):
        """Fail where ``fn`` wrote outside a tensor the harness handed out (an output, or a temporary
        made with ``torch.empty``...): ``outputs`` is ``[(noun, tensor)]``, how the messages name
        each output; ``hint``: the topic's own hint for a write outside (None: the usual ones)."""
        for g in run.allocs.records:
            named = [noun for noun, t in outputs if isinstance(t, torch.Tensor) and g.view.data_ptr() == t.data_ptr()]
            noun = named[0] if named else f"a temporary of shape {tuple(g.view.shape)} made with {g.how}"
            after, before = g.written_after(), g.written_before()
            if after:
                far = g.first_written_after()
                self.fail(f"wrote {after} element{'s' if after > 1 else ''} past the end of {noun} "
                          f"(up to {far} element{'s' if far > 1 else ''} beyond it).",
                          hint or ("is the last block masked (idx < n)? Threads of the tail block past n must "
                                   "not store."))
            if before:
                self.fail(f"wrote {before} element{'s' if before > 1 else ''} before the start of {noun}.",
                          hint or "an index went negative: look for an off-by-one (i - 1) in the store's index.")

    def check_input_guards(self, run: _Run, names):
        for i, g in enumerate(run.in_guards):
            if g.written_after() or g.written_before():
                name = names[i] if i < len(names) else f"input {i}"
                self.fail(f"wrote outside input {name} (past its end or before its start).",
                          "is every store masked, and does it go to the output, not the input?")

    def check_inputs_unchanged(self, run: _Run, names, written=()):
        """Fail where ``fn`` changed an input, bit for bit; ``written``: the names of the inputs
        that ``fn`` writes into by design (an in-place update), which may change."""
        for i, g in enumerate(run.in_guards):
            name = names[i] if i < len(names) else f"input {i}"
            if name in written:
                continue
            now, orig = _bits(g.view), _bits(g.orig)
            if not torch.equal(now, orig):
                changed = int((now != orig).sum())
                self.fail(f"your kernel changed its input {name} ({changed} element{'s' if changed > 1 else ''}).",
                          f"write the result into a new output tensor, not into {name} "
                          f"(for example out = torch.empty_like({name})).")

    @staticmethod
    def unwritten_mask(run: _Run, out: torch.Tensor) -> torch.Tensor | None:
        """True where ``out`` still holds the grader's "never written" NaN (None: cannot tell)."""
        g = run.allocs.find(out)
        if g is not None:
            return g.never_written().detach().cpu().reshape(out.shape)
        marker = _marker(out.dtype, POISON_BITS)
        if marker is not None:
            # not one of ours (made in C++, or by torch.zeros): the poison bit pattern can
            # only be there if the allocator reused a poisoned block and no one wrote it
            return (out.detach().contiguous().view(marker[0]) == marker[1]).cpu()
        return None

    def probe(self, case: Case, *, scalar=False):
        """``(run, out)`` of ``fn`` on an extra input that a diagnosis asks about, or None when
        that run fails (the failure already reported stays the one reported)."""
        saved = self.case
        try:
            run = self.call(case)
            return run, self.output_tensor(run, case.expected.shape, scalar=scalar)
        except GradingError:
            return None
        finally:
            self.case = saved

    def check_launched(self, run: _Run):
        """The right values must come from a kernel: reject a call that launched none, or where a
        torch operator computed what the kernel should (``return torch.softmax(x, -1)``), or that
        returned the course's own reference."""
        if run.launches is None:
            return
        # an empty or one-element input may need no kernel: a K=0 product is torch.zeros, the sum
        # of one element a copy of it (the other cases of the grader still need the kernel)
        need_kernel = all(t.numel() > 1 for t in run.inputs if isinstance(t, torch.Tensor))
        why = launch_verdict(run.launches, TORCH_OPS_ALLOWED.get(self.name, ()), need_kernel, self.fn)
        if not why and need_kernel and run.stores is not None and not _launches.is_extension_function(self.fn):
            why = run.stores.verdict(run.outputs or {RESULT: run.out})
        if why:
            if run.case is not None:
                self.case = run.case
            self.fail(why)

    def check_all_launched(self):
        """``check_launched`` on every call this grader made (``success`` runs it, so that no
        grader of any topic can accept torch's answer or the reference's)."""
        for run in self.runs:
            self.check_launched(run)

    def check_unwritten(self, run: _Run, out: torch.Tensor, hint_fn=None, case=None, *, name=None, text=None):
        """Fail where ``out`` still holds the grader's "never written" NaN. ``hint_fn``: a hint, or
        ``(case, mask, grader) -> hint or None``; ``name``: the output's name, which starts the
        message (None: the grader's only result); ``text``: ``mask -> the message`` instead."""
        mask = self.unwritten_mask(run, out)
        if mask is None:
            return
        if bool(mask.any()):
            one = int(mask.sum()) == 1
            if text is not None:
                what = text(mask)
            else:
                where = _check.describe_positions(mask) if mask.dim() else _the(name or RESULT)
                start = f"{name}: " if name and mask.dim() else ""
                what = (f"{start}{where} {'was' if one else 'were'} never written "
                        f"({'it still holds' if one else 'they still hold'} the grader's NaN marker).")
            hint = hint_fn(case, mask, self) if callable(hint_fn) else hint_fn
            self.fail(what, hint or UNWRITTEN_HINT)

    # -- the grading loop ------------------------------------------------------------------
    def went_through_loop(self) -> bool:
        """The grading loop (``grade``) ran on this Grader, and made every call of ``fn`` it made
        (its diagnoses' extra calls included)."""
        return self.looped and all(run.in_loop for run in self.runs)

    def probe_outputs(self, case: Case):
        """The outputs of ``fn`` on an extra input a diagnosis asks about (name -> float64
        tensor), checked as the running loop checks every call, or None when that run fails
        (the failure already reported stays the one reported)."""
        if self._loop is None:
            raise RuntimeError(f"{self.name}: probe_outputs asks the grading loop (grade), which is not running")
        saved = self.case
        try:
            return self._loop.collect(case)[0].got
        except GradingError:
            return None
        finally:
            self.case = saved


def produced_nan(nan: torch.Tensor, what: str, where: str | None = None) -> str:
    """"your kernel produced NaN at ..., first at ...": NaN that the kernel's arithmetic wrote,
    never the grader's "never written" marker (another NaN, told apart bit by bit)."""
    first = tuple(torch.nonzero(nan)[0].tolist()) if nan.dim() else ()
    where = where or (_check.describe_positions(nan) if nan.dim() else what)
    at = f"{what}[{', '.join(map(str, first))}]" if first else what
    return (f"your kernel produced NaN at {int(nan.sum())} of {nan.numel()} values of {what} ({where}), first at "
            f"{at}. (They were written: the grader's \"never written\" marker is a NaN of its own.)")


def replace_hint(text: str, hint: str) -> str:
    """A GradingError's message with its hint replaced by ``hint`` (or given one)."""
    head, sep, seed = text.partition("\n(Inputs came from")
    head = head.split("\nHint: ")[0]
    return f"{head}\nHint: {hint}{sep}{seed}"


def label_n(n):
    return f"an input of {n} element{'s' if n != 1 else ''}"


def label_shape(shape):
    return f"a {shape[0]}x{shape[1]} input"


def _race_indices(cases) -> set[int]:
    """Which cases are run twice. On a GPU every one (cheap); in simulation one mid-size
    case with several blocks, since simulated threads are slow."""
    if not SIMULATE:
        return set(range(len(cases)))
    best = min(range(len(cases)), key=lambda i: (abs(cases[i].numel - 1024), -cases[i].numel))
    return {best}


def same(a: torch.Tensor, b: torch.Tensor, atol, rtol) -> bool:
    return not bool(_check.mismatch_mask(a, b, atol=atol, rtol=rtol).any())


# --------------------------------------------------------------------------------------
# The grading loop: every grader's calls of the learner's function go through it
# --------------------------------------------------------------------------------------
#: The name of a grader's only output ("the result changes between runs", "the result was never written").
RESULT = "result"
#: The usual causes of a result that changes between two runs on the same input.
RACE_HINT = ("threads read shared memory that other threads write: is a __syncthreads() "
             "(cuda.syncthreads()) missing between writing and reading it? Or several threads "
             "update the same element without an atomic. (Elements that no thread writes also "
             "change between runs: they hold whatever memory held before.)")
#: The usual causes of elements never written, where an output names none of its own.
UNWRITTEN_HINT = ("is the grid large enough (cdiv(n, BLOCK) blocks), and is the last block launched? "
                  "Does every element get a thread?")


def _the(name: str) -> str:
    return name if name.startswith("the ") else f"the {name}"


@dataclass
class Output:
    """One result of a graded call, and how the grading loop (``grade``) checks it.

    ``name`` names it in the messages about its structure, its guards, elements never written
    and races ("dq changes between runs"); a grader of one result calls it ``RESULT``.
    ``what`` names it in the messages about wrong values (default: ``name``; a scalar reads
    "the loss is 0.5, expected 0.25", a tensor "3 of 21 elements of the gradient are wrong"),
    ``noun`` in those about a write past its end (default: "the <name>").

    ``tol`` is ``dict(atol=, rtol=)`` (``utils.check``'s comparison, with its message) or the
    allowed ``|got - expected|``, a number or a tensor of the expected value's shape (None:
    ``utils.TOLERANCES[float32]``). The hooks: ``convert(grader, value, output) -> tensor``
    (default ``Grader.as_output``: a tensor of ``shape`` and one of ``dtypes`` on DEVICE);
    ``unwritten_text(mask) -> message`` and ``unwritten_hint`` (a hint, or ``(case, mask,
    grader) -> hint``) for elements never written; ``nan_hint`` (a hint, or ``(run, nan) ->
    hint``): when given, NaN that the kernel wrote fails first, with ``nan_where(nan)`` saying
    where; ``mismatch(got, expected) -> wrong elements`` and ``describe(got, expected, bad) ->
    message`` replace the comparison's own; ``diagnose(run, got, bad) -> hint`` names the likely
    cause of wrong values (``run.got``: every output of the call, by name).
    """
    name: str
    expected: torch.Tensor | None = None     # float64 on the CPU; None: the grader's ``check`` judges it
    shape: tuple | None = None               # None: the expected value's shape
    scalar: bool = False                     # one number: a 0-d or 1-element tensor, or a Python number
    dtypes: tuple = (torch.float32,)         # the dtypes accepted, the first named in a message
    tol: object = None
    race_tol: object = None                  # the difference allowed between two runs (None: ``tol``)
    what: str | None = None
    noun: str | None = None
    convert: Callable | None = None
    unwritten_text: Callable | None = None
    unwritten_hint: object = None
    nan_hint: object = None
    nan_where: Callable | None = None
    mismatch: Callable | None = None
    describe: Callable | None = None
    diagnose: Callable | None = None
    counted: bool = True                     # its error counts in the "max error" of the verdict

    @property
    def result_shape(self) -> tuple:
        if self.scalar:
            return ()
        return tuple(self.shape if self.shape is not None else self.expected.shape)

    @property
    def subject(self) -> str:
        return _the(RESULT) if self.name == RESULT else self.name

    @staticmethod
    def allowed(tol) -> tuple:
        """``(atol, rtol)`` of ``utils.check.mismatch_mask`` for a tolerance as ``tol`` is given."""
        if tol is None:
            t = _check.tolerance(torch.float32)
            return t["atol"], t["rtol"]
        if isinstance(tol, dict):
            return tol["atol"], tol["rtol"]
        return tol, 0.0

    def wrong(self, got) -> torch.Tensor:
        if self.mismatch is not None:
            return self.mismatch(got, self.expected)
        atol, rtol = self.allowed(self.tol)
        return _check.mismatch_mask(got, self.expected, atol=atol, rtol=rtol)

    def message(self, got, bad) -> str:
        want = self.expected
        if self.describe is not None:
            return self.describe(got, want, bad)
        what = self.what or self.name
        if self.tol is None or isinstance(self.tol, dict):
            atol, rtol = self.allowed(self.tol)
            return _check.describe_mismatch(got, want, mask=bad, what=what, atol=atol, rtol=rtol)
        if got.dim() == 0:
            return f"{what} is {float(got):.7g}, expected {float(want):.7g}."
        # an allowed error per element: the message names the one where the error is furthest over it
        tol_t = torch.as_tensor(self.tol, dtype=torch.float64, device=got.device)
        atol = float(tol_t.min()) if tol_t.numel() else 0.0
        if tol_t.numel() > 1:
            excess = torch.where(bad, (got.double() - want.double()).abs() - tol_t, torch.full_like(tol_t, -1.0))
            excess = torch.nan_to_num(excess, nan=float("inf"))
            atol = float(tol_t.broadcast_to(got.shape).flatten()[int(excess.flatten().argmax())])
        return _check.describe_mismatch(got, want, mask=bad, what=what.removeprefix("the "), atol=atol, rtol=0.0)


def returned(g: Grader, run: _Run, names) -> tuple:
    """What ``fn`` returned, one value per name: the value itself for one name, else the tuple
    of ``names`` (anything else fails, with the tuple it must return)."""
    out = run.out
    if len(names) == 1:
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        g.fail(f"your function returned {type(out).__name__}"
               f"{' of length ' + str(len(out)) if isinstance(out, (tuple, list)) else ''}: "
               f"return the tuple ({', '.join(names)}).")
    return tuple(out)


def mid_size_first(cases) -> list:
    """The order of the cases: a mid-size one first (several blocks and a tail, so that the first
    failure shows a telling pattern), then the others as given."""
    first = min(range(len(cases)), key=lambda i: (abs(cases[i].numel - 1024), -cases[i].numel))
    return [first] + [i for i in range(len(cases)) if i != first]


def largest_first(cases) -> list:
    return sorted(range(len(cases)), key=lambda i: -cases[i].numel)


def in_order(cases) -> list:
    return list(range(len(cases)))


def _race_message(o: Output, got, got2, bad) -> str:
    if bad.dim():
        where = f"{_check.describe_positions(bad)} differ"
        pos = tuple(torch.nonzero(bad)[0].tolist())
    else:
        where, pos = f"{_the(o.name)} differs", ()
    expected = f"; expected {float(o.expected[pos]):.7g}" if o.expected is not None else ""
    return (f"{o.subject} changes between runs: a race? {where} between two runs on the same input "
            f"(first run {float(got[pos]):.7g}, second run {float(got2[pos]):.7g}{expected}).")


class _Loop:
    """The grading loop of ``grade``: its settings, and one case at a time."""

    def __init__(self, g, outputs, inputs, written, unpack, check, explain_error, race_hint, race_report_hint,
                 guard_hint, defer, report_all):
        self.g, self.outputs, self.inputs, self.written = g, outputs, tuple(inputs), tuple(written)
        self.unpack, self.check, self.explain_error = unpack, check, explain_error
        self.race_hint, self.race_report_hint, self.guard_hint = race_hint, race_report_hint, guard_hint
        self.defer, self.report_all = defer, report_all

    # -- one call: run, structure, guards, never written ----------------------------------------
    def call(self, case, schedule_seed=None, explain=False) -> _Run:
        try:
            return self.g.call(case, schedule_seed=schedule_seed)
        except GradingError as e:
            if not explain:
                raise
            hint = None
            if getattr(e, "race_report", False) and self.race_report_hint is not None:
                h = self.race_report_hint
                hint = h(str(e)) if callable(h) else h
            elif self.explain_error is not None:
                hint = self.explain_error(case, str(e))
            if hint is None:
                raise
            raise GradingError(replace_hint(str(e), hint)) from None

    def structure(self, run: _Run, outs) -> list:
        """Each output of ``run`` as a tensor (``run.outputs``) and as float64 on the CPU
        (``run.got``); the outputs ``fn`` returned (an optional one left out at the end is not)."""
        g = self.g
        values = tuple(self.unpack(run) if self.unpack is not None else returned(g, run, [o.name for o in outs]))
        live = outs[:len(values)]
        for o, v in zip(live, values):
            what = o.what or o.subject
            t = o.convert(g, v, o) if o.convert is not None else g.as_output(
                v, o.result_shape, scalar=o.scalar, dtypes=o.dtypes, what=what)
            # the dtype first, whatever the conversion: a wrong dtype is never reported as wrong values
            if isinstance(t, torch.Tensor):
                g.check_dtype(t, o.dtypes + ((torch.float64,) if o.scalar else ()), what)
            run.outputs[o.name] = t
            run.got[o.name] = t.detach().to("cpu", torch.float64).reshape(o.result_shape)
        return live

    def collect(self, case, outs=None, explain=False):
        g = self.g
        outs = list(self.outputs(case)) if outs is None else outs
        run = self.call(case, explain=explain)
        live = self.structure(run, outs)
        g.check_output_guards(run, [(o.noun or _the(o.name), run.outputs[o.name]) for o in live], self.guard_hint)
        g.check_input_guards(run, self.inputs)
        if self.check is not None:
            self.check(run)
        for o in live:
            g.check_unwritten(run, run.outputs[o.name], o.unwritten_hint, case,
                              name=None if o.name == RESULT else o.name, text=o.unwritten_text)
        return run, live

    # -- the checks after it ------------------------------------------------------------------
    def race(self, case, i, run, live):
        """The same case again, in another thread order: a result that changes is a race."""
        g = self.g
        run2 = g.call(case, schedule_seed=g.seed + i)
        self.structure(run2, live)
        for o in live:
            got, got2 = run.got[o.name], run2.got[o.name]
            atol, rtol = o.allowed(o.race_tol if o.race_tol is not None else o.tol)
            bad = _check.mismatch_mask(got, got2, atol=atol, rtol=rtol)
            if bool(bad.any()):
                g.fail(_race_message(o, got, got2, bad), self.race_hint)

    def nans(self, run, live):
        for o in live:
            if o.nan_hint is None:
                continue
            nan = torch.isnan(run.got[o.name])
            if o.expected is not None:
                nan &= ~torch.isnan(o.expected)
            if bool(nan.any()):
                hint = o.nan_hint(run, nan) if callable(o.nan_hint) else o.nan_hint
                self.g.fail(produced_nan(nan, o.name, o.nan_where(nan) if o.nan_where else None), hint)

    def values(self, run, live):
        """Fail on the first output with wrong values (with ``report_all``: on all of them at
        once); a failure the grader's ``defer`` puts off is returned instead."""
        wrong = []
        for o in live:
            if o.expected is None:
                continue
            got = run.got[o.name]
            bad = o.wrong(got)
            if not bool(bad.any()):
                continue
            msg = o.message(got, bad)
            if self.report_all is not None:
                wrong.append((o.name, msg))
                continue
            hint = o.diagnose(run, got, bad) if o.diagnose is not None else None
            if self.defer is not None and self.defer(run, o, msg, hint):
                return run.case, msg, hint
            self.g.fail(msg, hint)
        if wrong:
            names = [n for n, _ in wrong]
            right = [o.name for o in live if o.expected is not None and o.name not in names]
            self.g.fail(wrong[0][1] + f"\n(wrong: {', '.join(names)}; right: {', '.join(right) or 'none'}.)",
                        self.report_all(run, names))
        return None

    def run(self, cases, order, races) -> float:
        g = self.g
        g.looped = True
        g._loop = self
        try:
            worst, deferred = 0.0, None
            race = set(races(cases))
            for i in order(cases):
                case = cases[i]
                g.case = case
                run, live = self.collect(case, explain=True)
                if i in race:
                    self.race(case, i, run, live)
                g.check_inputs_unchanged(run, self.inputs, self.written)
                self.nans(run, live)
                put_off = self.values(run, live)
                if put_off is not None:
                    deferred = deferred or put_off
                    continue
                g.check_launched(run)
                for o in live:
                    if o.counted and o.expected is not None:
                        worst = max(worst, _check.max_abs_err(run.got[o.name], o.expected))
            if deferred is not None:
                g.case = deferred[0]
                g.fail(deferred[1], deferred[2])
            return worst
        finally:
            g._loop = None


def grade(g: Grader, cases, outputs, *, inputs, written=(), unpack=None, order=mid_size_first, races=None,
          check=None, explain_error=None, race_hint=RACE_HINT, race_report_hint=None, guard_hint=None,
          defer=None, report_all=None) -> float:
    """The grading loop: every grader runs its calls of the learner's function through it, and
    ``success`` refuses a grader whose calls did not. Returns the largest error of the outputs.

    For each case, in the order ``order(cases)`` gives (a mid-size one first, unless a grader
    says otherwise): call ``fn`` on fresh guarded inputs (``Grader.call``: stubs, faults and the
    race detectors' reports become diagnoses); take its outputs, ``outputs(case)``, a list of
    ``Output``, out of what it returned (``unpack(run)``, default ``returned``: one value, or the
    tuple of the outputs' names) and check each one's type, device, shape and dtype; fail on a
    write outside an output or a temporary (``guard_hint``: the topic's hint for it) or outside an
    input; run ``check(run)``, the grader's own checks of the call; fail on elements never
    written; for the cases ``races(cases)`` picks (default: every case on a GPU, one mid-size case
    in simulation), run it again in another thread order and fail where an output changed
    (``race_hint``); fail where an input changed (``inputs``: their names in order; ``written``:
    the ones ``fn`` updates in place by design); fail on NaN the kernel wrote (outputs with a
    ``nan_hint``), then on wrong values, with the output's diagnosis; and last reject right values
    that torch or the course's reference computed (``Grader.check_launched``).

    ``explain_error(case, text) -> hint or None`` replaces the hint of a failure of the first call
    of a case; ``race_report_hint`` (a hint, or ``text -> hint``) is added to a race detector's
    report, which has none. ``defer(run, output, message, hint) -> True`` puts a failure of wrong
    values off until every other case has run (a case that says less than the others); with
    ``report_all(run, wrong names) -> hint`` a case's wrong outputs are named together.
    """
    loop = _Loop(g, outputs, inputs, written, unpack, check, explain_error, race_hint, race_report_hint,
                 guard_hint, defer, report_all)
    return loop.run(cases, order, races or _race_indices)


def run_cases(g: Grader, cases, *, names, shape_of, scalar=False, tol_of=None,
              unwritten_hint=None, diagnose=None, dtypes=(torch.float32,)):
    """``grade`` for a grader whose function returns one result (``RESULT``): ``shape_of(case)``
    its shape, ``tol_of(case)`` its tolerance (``dict(atol=, rtol=)``), ``diagnose(case, got,
    bad)`` the likely cause of wrong values, ``unwritten_hint(case, mask, grader)`` of elements
    never written (default ``tail_hint``)."""
    def outputs(case):
        return [Output(RESULT, case.expected, shape=None if scalar else tuple(shape_of(case)), scalar=scalar,
                       dtypes=dtypes, tol=tol_of(case) if tol_of else _check.tolerance(torch.float32),
                       noun="the output", unwritten_hint=unwritten_hint or tail_hint,
                       diagnose=(lambda run, got, bad: diagnose(run.case, got, bad)) if diagnose else None)]
    return grade(g, cases, outputs, inputs=names)


def success(name, cases=None, worst=0.0, sizes_text="", *, line=None):
    """Print a grader's verdict of "correct" (``line``: in its own words), once every Grader it
    made is known to have run its calls through the grading loop (``grade``) and every call to
    be the learner's kernels' work (``Grader.check_all_launched``)."""
    g = _running.pop(name, None)
    if g is None:
        raise RuntimeError(f"{name}: success() without a running Grader named {name!r}: a grader is built on "
                           "utils.grading.Grader, which records what each call launched")
    made = [h for h in _made[_graded_calls[-1][1]:] if h.name == name] if _graded_calls else []
    for h in made or [g]:
        if not h.went_through_loop():
            raise RuntimeError(
                f"{name}: success() refused: the grader's calls of the learner's function did not go through the "
                "grading loop (utils.grading.grade, or run_cases), which makes the checks every grader owes: "
                "guards, elements never written, a second run for races, inputs unchanged, the comparison with "
                "the reference and that a kernel computed the result. Build the grader on grade().")
    for h in made or [g]:
        h.check_all_launched()
    if line is None:
        line = f"{name}: correct on {len(cases)} inputs ({sizes_text}), max error {worst:.3g}"
    print(line)


def sizes_text(sizes):
    return f"sizes {min(sizes)} .. {max(sizes)}"


def shapes_text(shapes):
    return "shapes " + ", ".join(f"{r}x{c}" for r, c in shapes)


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------
def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def with_zeros(gen, x, frac=0.1):
    """Exact zeros (and negative zeros) in about ``frac`` of the places: the edge of ReLU."""
    m = torch.rand(x.shape, generator=gen) < frac
    x = x.clone()
    x[m] = 0.0
    neg = m & (torch.rand(x.shape, generator=gen) < 0.5)
    x[neg] = -0.0
    return x


def grader_sizes():
    return list(SIZES.grader_sizes)


def grader_shapes():
    return [tuple(s) for s in SIZES.grader_shapes]


# --------------------------------------------------------------------------------------
# Elementwise graders
# --------------------------------------------------------------------------------------
def tail_hint(case, mask, g=None):
    """Hints for never-written elements of a 1-D result. Only a tail missing looks the same for
    several mistakes, so the kernel is asked again at a second size (``case.resize``)."""
    if mask.dim() != 1:
        return None
    n = mask.numel()
    r = _check.index_ranges(mask)
    if len(r) != 1 or r[0][1] != n - 1:
        return None
    start = r[0][0]
    if start == 0:
        return "nothing was written: is the kernel launched, with at least one block, on the output tensor?"
    written2 = _written_prefix_at(g, case, probe_size(n))
    if written2 is not None:
        n2, w2 = written2
        if w2 == start:
            return (f"only the first {start} elements were written, whatever n is (with {n2} elements too): "
                    "every block writes the same elements. The index needs the block's offset, "
                    "blockIdx.x * blockDim.x + threadIdx.x (pid * BLOCK + tl.arange in Triton); or, with a "
                    "fixed grid, each thread must loop (grid-stride: i += gridDim.x * blockDim.x).")
        if w2 == n2 and n - start == n % 4:
            k = n - start
            return (f"the last {k} element{'s' if k > 1 else ''} (n % 4) {'were' if k > 1 else 'was'} never written, "
                    f"and with {n2} elements, a multiple of 4, every element was: the float4 loop covers "
                    "n / 4 vectors, and the n % 4 elements after them need scalar code of their own.")
        if w2 < n2:
            return (f"only the last elements are missing ({n - start} of {n}; {n2 - w2} of {n2}): is the grid "
                    "rounded up (cdiv(n, BLOCK) blocks, not n // BLOCK), so the tail block is launched?")
    if n - start < start:
        return ("only the last elements are missing: is the grid rounded up (cdiv(n, BLOCK) blocks, "
                "not n // BLOCK), so the tail block is launched?")
    return (f"only the first {start} elements were written: do all blocks work (the index needs "
            "blockIdx.x * blockDim.x + threadIdx.x), and is the grid large enough / is the last block launched?")


def probe_size(n: int) -> int:
    """A second size for a probe: more than twice ``n``, 4 more than a multiple of 8, so a
    rounded-down grid of any block of 8 or more still leaves a tail, and a float4 loop none."""
    return 8 * ((2 * n) // 8 + 1) + 4


def _written_prefix_at(g, case, n2):
    """``(n2, k)``: ``fn`` on a fresh input of ``n2`` elements wrote exactly its first ``k``
    elements (None: no probe possible, or the unwritten ones are not one tail)."""
    if g is None or case is None or case.resize is None:
        return None
    res = g.probe(case.resize(n2))
    if res is None:
        return None
    mask = g.unwritten_mask(*res)
    if mask is None or mask.dim() != 1:
        return None
    r = _check.index_ranges(mask)
    if not r:
        return n2, n2
    if len(r) == 1 and r[0][1] == n2 - 1:
        return n2, r[0][0]
    return None


def shift_hint(got, expected_fn):
    """A hint when the result looks like the right answer shifted by one element."""
    flat, exp = got.reshape(-1), expected_fn().reshape(-1)
    tol = _check.tolerance(torch.float32)
    bad = _check.mismatch_mask(flat, exp, **tol)
    if bool(bad[-1]) and int(bad.sum()) == 1:
        return ("only the last element is wrong: does it read one past the end (x[i + 1])? "
                "Past the end of the input the grader puts NaN.")
    if flat.numel() < 3:
        return None
    tol = _check.tolerance(torch.float32)
    inner = slice(1, -1)
    if same(flat[:-1][inner], exp[1:][inner], **tol) or same(flat[1:][inner], exp[:-1][inner], **tol):
        return "the result is the right answer shifted by one element: an off-by-one in the index (i + 1 or i - 1)?"
    return None


def swap_hint_2d(case, mask, g=None):
    """Whole trailing columns (or rows) never written, in a non-square matrix: the grid's
    x and y were swapped, so one dimension is covered only up to the other's extent."""
    if mask.dim() != 2:
        return None
    rows, cols = mask.shape
    full_cols = mask.all(dim=0)
    full_rows = mask.all(dim=1)
    band_cols = bool(full_cols.any()) and bool((mask == full_cols.unsqueeze(0)).all())
    band_rows = bool(full_rows.any()) and bool((mask == full_rows.unsqueeze(1)).all())
    if rows != cols and (band_cols or band_rows):
        return ("whole columns (or rows) at the end were never written: rows and columns look swapped: "
                "did you use blockIdx.x for the row? x is the fastest-varying index and should give the "
                "column, with the grid sized (cdiv(cols, BLOCK_X), cdiv(rows, BLOCK_Y)).")
    return None


def transposed_hint(got, expected):
    if expected.dim() != 2 or expected.shape[0] == expected.shape[1] or expected.numel() < 2:
        return None
    tol = _check.tolerance(torch.float32)
    if same(got.reshape(-1), expected.t().reshape(-1), **tol):
        return ("rows and columns look swapped: did you use blockIdx.x for the row? The element at "
                "(row, col) lives at row * cols + col.")
    return None



def first_row_hint(bad):
    if bad.dim() != 2 or bad.shape[0] < 2:
        return None
    if not bool(bad[0].any()) and float(bad[1:].any(dim=1).float().mean()) > 0.5:
        return "the first row is right but the others are not: is the row stride used?"
    return None


def row_cases(g, shapes, kinds):
    """2-D inputs whose rows cycle through ``kinds``: (label, scale, offset) per row."""
    cases = []
    for rows, cols in shapes:
        x = randn(g.gen, rows, cols)
        labels = []
        for r in range(rows):
            label, scale, offset = kinds[r % len(kinds)]
            x[r] = x[r] * scale + offset
            labels.append(label)
        cases.append((x, labels))
    return cases


def show_rejection(check, *args, **kwargs) -> GradingError:
    """Run a grader on a kernel that is wrong on purpose and print its diagnosis.

    For lessons that show what a grader says about a typical mistake. If the grader accepts
    the kernel, this raises, so a lesson can never silently show nothing.
    """
    try:
        check(*args, **kwargs)
    except GradingError as e:
        print("REJECTED:", e)
        return e
    raise AssertionError(f"{check.__name__} accepted a kernel that is wrong on purpose")


# ---------------------------------------------------------------------------------------
# Efficiency: the bytes a kernel moves against the bytes it needs
# ---------------------------------------------------------------------------------------
#: A kernel that moves up to this multiple of the bytes it needs passes as coalesced: a
#: misaligned start or a partial last warp adds a sector here and there, never 25 %.
TRAFFIC_SLACK = 1.25


def _profiled(kernel_or_profile, launch, kwargs, what: str, reject: bool = False):
    """A profile: the one given, or one launch of the kernel given (``utils.profile``). None on
    a GPU whose profiler cannot measure the launch: the check says loudly that it graded only the
    results there, and that the efficiency grade is given in simulation. (In simulation a launch
    is always measured; a launch that moved nothing fails there.)"""
    if hasattr(kernel_or_profile, "metrics") or hasattr(kernel_or_profile, "bytes_moved"):
        return kernel_or_profile
    from .profile import profile  # utils/profile.py, imported when an efficiency check first runs
    try:
        return profile(kernel_or_profile, *launch, **kwargs)
    except TypeError as e:
        if "takes a kernel" not in str(e) or not callable(kernel_or_profile):
            raise
        raise GradingError(_not_a_kernel(kernel_or_profile, launch, kwargs, what)) from None
    except RuntimeError as e:
        if SIMULATE:
            raise
        # On a GPU the counters come from Nsight Compute, which a machine may lack.
        # The exercise's verdict on correctness stands; its verdict on efficiency is given in
        # simulation, where every access is counted (as lesson 02's traffic exercise does).
        why = str(e).splitlines()[0]
        print(f"{what}: NOT GRADED on this GPU ({why}). Only the results were checked here: run this "
              "check in simulation (COURSE_SIMULATE=1), where every access is counted, for the "
              f"{what} grade." if reject else f"{what}: not measured on this GPU ({why})")
        return None


def _not_a_kernel(fn, launch, kwargs, what: str) -> str:
    """Why a function handed to an efficiency check is refused: it is not a kernel, and (run on
    the tensors given) what computed its values, torch's operators named."""
    text = (f"{what}: this check measures one launch of your kernel (made by utils.cuda_kernel, numba.cuda.jit or "
            f"triton.jit), and {getattr(fn, '__name__', type(fn).__name__)} is not one")
    tensors = [a for a in launch if isinstance(a, torch.Tensor)]
    try:
        with record_launches() as rec:
            fn(*tensors)
    except Exception:
        return text + "."
    ops = rec.computing_ops()
    if ops:
        return text + f": {', '.join(op_name(o) for o in ops[:3])} computed its values. Pass the kernel itself."
    return text + ". Pass the kernel itself."


def _advise(msg: str, reject: bool) -> None:
    if reject:
        raise GradingError(msg)
    print("advice:", msg)


def _requested_bytes(p) -> int | None:
    """The bytes the launch's lanes asked for (loads, stores, atomics), where the profile says."""
    m = getattr(p, "metrics", None) or {}
    parts = [m.get(k) for k in ("bytes_loaded", "bytes_stored", "bytes_atomic")]
    if parts[0] is None or parts[1] is None:
        return None
    return int(sum(v or 0 for v in parts))


def check_traffic(kernel_or_profile, *launch, max_ratio: float = TRAFFIC_SLACK,
                  reject: bool = False, why: str | None = None, **kwargs):
    """How many bytes a kernel moves against the bytes it needs, as advice or as a verdict.

    ``check_traffic(k, grid, block, *args)`` profiles one launch (``utils.profile``) and
    ``check_traffic(p)`` reads a profile already taken. Global memory moves whole 32-byte
    sectors: a warp whose threads read neighbouring 4-byte elements uses every byte of the
    sectors it touches, a warp whose threads read elements far apart drags in a whole sector
    for each 4 bytes; and a kernel that reads the same data twice moves it twice. When the
    kernel moves more than ``max_ratio`` times the bytes it needs, this prints the ratio and
    the likely cause, or, with ``reject=True`` (for the exercises that say they grade
    traffic), raises ``GradingError``. A launch that moved no byte at all fails (a kernel that
    reads and writes nothing computed nothing), and so does, with ``reject=True``, a launch
    that simulation could not measure; on a GPU without counters for the launch the check says
    that it graded only the results. ``why``: what an exercise's extra bytes usually are (replaces
    the general advice). Returns the profile.
    """
    p = _profiled(kernel_or_profile, launch, kwargs, "traffic", reject)
    if p is None:
        return None
    moved, needed = getattr(p, "bytes_moved", None), getattr(p, "bytes_needed", None)
    backend = getattr(p, "backend", "no backend")
    if moved == 0:
        raise GradingError("traffic: the kernel moved no byte of global memory: it read and wrote nothing, so it "
                           "computed nothing (is its body empty, or every access masked off?). The result must "
                           "come from this kernel's loads and stores.")
    if not moved or not needed:
        msg = (f"traffic: not measured for this launch ({backend} reported "
               f"{'no global sectors' if not moved else 'no bytes needed'})")
        if reject:
            raise GradingError(msg + ", and this check grades traffic: a check that measured nothing cannot pass.")
        print(msg)
        return p
    ratio = moved / needed
    if ratio <= max_ratio:
        print(f"traffic: {moved:,} bytes moved for the {needed:,} needed ({ratio:.2f}x): coalesced")
        return p
    summary = list(getattr(p, "summary", None) or [])
    worst = f" Worst access: {summary[0].rstrip('.')}." if summary else ""
    requested = _requested_bytes(p)
    if why:
        _advise(f"your kernel moves {ratio:.1f}x the bytes it needs ({moved:,} bytes for {needed:,} bytes of data; "
                f"this check allows {max_ratio:g}x): {why}", reject)
        return p
    if requested and moved <= TRAFFIC_SLACK * requested:
        # every sector moved was asked for: the accesses are coalesced, the data is read again
        _advise(f"your kernel moves {ratio:.1f}x the bytes it needs ({moved:,} bytes for {needed:,} bytes of "
                f"data), and its accesses are coalesced ({requested:,} bytes asked for): it reads the same data "
                f"more than once.{worst} Load each value once and keep it in registers (a variable of the kernel) "
                "for every later use, or skip the tiles that cannot contribute.", reject)
        return p
    _advise(f"your kernel moves {ratio:.1f}x the bytes it needs ({moved:,} bytes in 32-byte sectors "
            f"for {needed:,} bytes of data).{worst} Let neighbouring threads touch neighbouring "
            "elements at every step (in a loop: element = thread + k * total threads), so that a "
            "warp's 32 accesses share sectors.", reject)
    return p


_LANES = "smsp__thread_inst_executed_per_inst_executed.ratio"
_SHARED = {op: (f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum",
                f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum") for op in ("ld", "st")}
#: Below this many active lanes per warp instruction (of 32), the warps of a block tree diverge
#: for most of its steps: interleaved addressing gives about 28 in a block of 256, sequential 31.
DIVERGENCE_LANES = 30.0


def check_shared(kernel_or_profile, *launch, min_lanes: float = DIVERGENCE_LANES,
                 reject: bool = False, **kwargs):
    """Bank conflicts and divergence of a kernel that works in shared memory, as advice (or,
    with ``reject=True``, as a verdict).

    ``check_shared(k, grid, block, *args, shared=...)`` profiles one launch; ``check_shared(p)``
    reads a profile. It reports the shared-memory wavefronts against the requests' minimum
    (every extra one is a bank conflict: lanes of a warp on different words of one bank) and the
    active lanes per warp instruction (fewer than ``min_lanes`` of 32: the warps diverge).
    Returns the profile.
    """
    p = _profiled(kernel_or_profile, launch, kwargs, "shared memory", reject)
    if p is None:
        return None
    m = getattr(p, "metrics", {}) or {}
    waves = sum(m.get(_SHARED[op][0]) or 0 for op in _SHARED)
    conflicts = sum(m.get(_SHARED[op][1]) or 0 for op in _SHARED)
    lanes = m.get(_LANES)
    if lanes is None and not waves:
        msg = f"shared memory: not measured for this launch ({getattr(p, 'backend', 'no backend')})"
        if reject:
            raise GradingError(msg + ", and this check grades it: a check that measured nothing cannot pass.")
        print(msg)
        return p
    problems = []
    if conflicts:
        worst = next((s for s in getattr(p, "summary", None) or [] if "bank" in s or "wavefront" in s), None)
        problems.append(f"{conflicts:,} of its {waves:,} shared-memory wavefronts are bank conflicts"
                        + (f" ({worst})" if worst else "") + ": lanes of a warp should touch "
                        "consecutive words, as sequential addressing does")
    if lanes is not None and lanes < min_lanes:
        problems.append(f"its warps run with {lanes:.1f} of 32 lanes active on average: the working "
                        "threads are spread over all the warps (divergence); keep them packed at the "
                        "front (thread t < s works), so that whole warps retire")
    if not problems:
        print(f"shared memory: {waves:,} wavefronts, no bank conflicts"
              + (f"; {lanes:.1f} of 32 lanes active per warp instruction" if lanes is not None else ""))
        return p
    _advise("your kernel is right, but " + "; and ".join(problems) + ".", reject)
    return p
