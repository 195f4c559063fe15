"""What a call launched: the course's kernels, and the torch operators that ran around them.

    with utils.record_launches() as seen:
        out = softmax_triton(x)
    seen.kernels        # [Launch(backend='triton', name='softmax_kernel')]
    seen.torch_ops      # Counter of the aten operators run outside kernels: {'empty_like': 1}
    seen.computing_ops()  # those that compute values (not allocation, views, fills, copies, casts)

The graders use this to make sure a launcher launches the learner's kernel: a function that
returns ``torch.softmax(x, -1)`` has the right values, and no kernel of its own.

Each backend marks its launch path with :func:`recorded` (``utils.cuda_kernel`` launches,
``numba.cuda.jit`` launches in the simulator and through numba-cuda's dispatcher on a GPU,
``triton.jit`` launches in the interpreter and through ``JITFunction.run`` on a GPU). While
no recording is active that costs one test of a global. Torch operators are seen through a
``TorchDispatchMode`` (below autograd, so the same on CPU and GPU); what runs *inside* a
launch (the simulators copy and convert tensors) is not counted.

This module imports nothing of the course, so any backend may import it.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from typing import Callable, NamedTuple

__all__ = ["Launch", "Launches", "record_launches", "recorded", "record_method", "register_hook", "install_hooks",
           "hook_problems", "ALLOWED_TORCH_OPS", "torch_op_name", "is_extension_function"]


class Launch(NamedTuple):
    backend: str  # "cuda", "numba", "triton" or "extension" (a compiled C++/CUDA extension's function or op)
    name: str     # the kernel's name


#: Aten operators that move or shape data without computing the result: allocation, views,
#: fills, copies and dtype casts, and reading sizes. A launcher may use any of them.
ALLOWED_TORCH_OPS = frozenset({
    # allocation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor",
    "resize_", "resize_as_",
    # fills
    "fill", "fill_", "zero", "zero_",
    # copies and casts (x.contiguous(), x.to(dtype), x.float(), x.cpu())
    "copy", "copy_", "clone", "_to_copy", "to", "contiguous", "_copy_from", "_copy_from_and_resize",
    "lift_fresh", "lift_fresh_copy", "detach", "detach_", "alias", "pin_memory", "_pin_memory",
    "_local_scalar_dense",
    # views
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as", "t",
    "transpose", "permute", "unsqueeze", "squeeze", "select", "slice", "narrow", "flatten",
    "unflatten", "split", "split_with_sizes", "unbind", "chunk", "view_as", "movedim", "unfold",
    "diagonal", "view_as_real", "view_as_complex",
    # sizes, strides and other metadata
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "is_same_size",
    "set_", "record_stream", "_has_compatible_shallow_copy_type",
})

#: The Python spelling of the aten operators a learner is likely to reach for.
_FRIENDLY = {
    "_softmax": "torch.softmax", "_log_softmax": "torch.log_softmax", "softmax": "torch.softmax",
    "mm": "a @ b (torch.mm)", "bmm": "a @ b (torch.bmm)", "addmm": "torch.addmm", "matmul": "a @ b",
    "sum": "torch.sum", "relu": "torch.relu", "relu_": "torch.relu_", "gelu": "torch.nn.functional.gelu",
    "clamp": "torch.clamp", "clamp_min": "torch.clamp", "maximum": "torch.maximum", "where": "torch.where",
    "add": "+ (torch.add)", "sub": "- (torch.sub)", "mul": "* (torch.mul)", "div": "/ (torch.div)",
    "exp": "torch.exp", "amax": "torch.amax", "max": "torch.max", "tanh": "torch.tanh",
    "native_layer_norm": "torch.nn.functional.layer_norm",
    "_scaled_dot_product_flash_attention_for_cpu": "torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention": "torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention": "torch.nn.functional.scaled_dot_product_attention",
}


def torch_op_name(op: str) -> str:
    """``"torch.softmax (aten._softmax)"``: how a learner wrote it, and what torch ran."""
    friendly = _FRIENDLY.get(op) or f"torch.{op.lstrip('_')}"
    return f"{friendly} (aten.{op})"


class _State(threading.local):
    inside = 0  # > 0 while a kernel launch runs in this thread
    tracking = 0  # > 0 while a store tracker reads memory (its own torch work is not the learner's)


_STATE = _State()
#: The recordings in progress (nested ones all see each launch). Empty: the hooks do nothing.
_ACTIVE: list["Launches"] = []
#: The backends' launch hooks, registered when the backends are imported (``register_hook``):
#: each recording starts by installing those whose library is imported by then. On a GPU,
#: ``import utils`` does not import ``numba.cuda``: Numba's hook goes in at the first recording
#: after a notebook imports it. The tuple never changes after ``import utils``; whether a hook
#: is in place is read from the library's class itself (``hook_problems``).
_HOOKS: tuple = ()
#: The attribute, on a hooked class, that holds the course's hook for ``<attr>`` (+ attr).
_MARK = "__course_launch_hook_"


class Hook(NamedTuple):
    label: str    # what it hooks, for messages: "Numba's launch path"
    locate: Callable  # () -> (cls, attr, backend, name_of, skip[, captured]), or None while there is nothing to hook


def register_hook(label: str, locate) -> None:
    """Register a backend's launch hook: ``locate()`` returns ``(cls, attr, name_of, skip)``,
    the library's launch method to record (see `record_method`), or None while its library is
    not imported. Installed now if it can be, else at the start of a later recording."""
    global _HOOKS
    _HOOKS += (Hook(label, locate),)
    install_hooks()


def install_hooks() -> None:
    """Hook every launch path whose library is imported by now (a hook in place stays as it is)."""
    for hook in _HOOKS:
        found = hook.locate()
        if found is not None:
            record_method(*found)
    for locate in _COPY_HOOKS:
        found = locate()
        if found is not None:
            record_copies(*found)


#: Where libraries copy device memory to the host (Numba's ``copy_to_host``): ``() -> (cls,
#: attr)`` or None, hooked so that a store tracker knows the copy holds what the device held.
_COPY_HOOKS: tuple = ()


def register_copy_hook(locate) -> None:
    """Register a library's copy to the host: ``locate()`` returns ``(cls, attr)``, a method
    ``copy(self, ...) -> the host copy``, or None while its library is not imported."""
    global _COPY_HOOKS
    _COPY_HOOKS += (locate,)
    install_hooks()


def record_copies(cls, attr: str) -> None:
    """Make ``cls.<attr>`` tell the active store trackers what it copied (installed once)."""
    fn = cls.__dict__.get(attr)
    if fn is None or getattr(fn, "_records_copies", False):
        return

    @functools.wraps(fn)
    def copy(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        if _ACTIVE and not _STATE.inside and not _STATE.tracking:
            with _tracking():
                for rec in _ACTIVE:
                    if rec.stores is not None:
                        rec.stores.copied(out, self)
        return out
    copy._records_copies = True
    setattr(cls, attr, copy)


def hook_problems() -> list[str]:
    """What a notebook changed in the launch recording, as ``"<what> (<why it matters>)"``:
    a library's hooked launch method replaced after the course hooked it, or the recording
    state left inside a launch (checked outside launches, where it must be zero)."""
    found = []
    for hook in _HOOKS:
        try:
            located = hook.locate()
        except Exception:
            located = None
        if located is None:
            continue
        cls, attr = located[0], located[1]
        mine = vars(cls).get(_MARK + attr)
        if mine is not None and vars(cls).get(attr) is not mine:
            found.append(f"{cls.__module__}.{cls.__qualname__}.{attr} ({hook.label}, hooked by the course "
                         "to see your launches)")
    if _STATE.inside:
        found.append("runtime.backends.launches._STATE.inside (the launch recording's state)")
    return found


class Launches:
    """The kernel launches and torch operators of one ``with record_launches()`` block."""

    def __init__(self):
        self.kernels: list[Launch] = []
        self.torch_ops: Counter = Counter()
        self.stopped = False  # taken off the active recordings from inside the block
        self.stores = None    # a ``stores.StoreTracker``: who wrote each byte (``record_launches(stores=...)``)

    def computing_ops(self, allowed=()) -> list[str]:
        """The aten operators that computed values (in the order first run), beyond the
        always-allowed data movement and ``allowed`` (names like ``"sum"``)."""
        extra = set(allowed)
        return [op for op in self.torch_ops if op not in ALLOWED_TORCH_OPS and op not in extra]

    def verdict(self, allowed=(), need_kernel: bool = True, fn=None) -> str | None:
        """Why this call did not compute its result with a kernel of its own (None: it did).
        ``need_kernel`` False: launching nothing is fine (an empty input needs no kernel).
        ``fn``: the function called; a compiled extension's function launches its kernels in C++."""
        if self.stopped:
            return ("the launch recording was stopped while your function ran (runtime.backends.launches._ACTIVE "
                    "was changed), so what it launched is unknown: this check earns no points.")
        ops = self.computing_ops(allowed)
        if ops:
            names = ", ".join(torch_op_name(op) for op in ops[:3]) + (", ..." if len(ops) > 3 else "")
            verb = "computed" if len(ops) == 1 else "computed (part of)"
            return (f"your function returned the right values, but {names} {verb} them: launch your kernel, "
                    f"which must compute the result itself.")
        if need_kernel and not self.kernels and not is_extension_function(fn):
            return ("your function returned the right values, but it launched no kernel: "
                    "launch your kernel (kernel[grid, block](...) or kernel[grid](...)) to compute them.")
        return None

    def __repr__(self):
        return f"Launches(kernels={self.kernels!r}, torch_ops={dict(self.torch_ops)!r})"


#: Operator namespaces of torch itself; any other one was registered by an extension.
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "_c10d_functional", "c10d", "quantized", "profiler"})
#: Modules of builtin functions that are not a compiled extension of the course's.
_NOT_EXTENSIONS = ("torch", "numpy", "math", "builtins", "operator", "_operator", "functools", "cmath")


def is_extension_function(fn) -> bool:
    """Whether ``fn`` is a function of a compiled extension module (pybind11: ``relu_ext.relu_forward``,
    a ``torch.utils.cpp_extension.load_inline`` module's function on a GPU): its kernels launch from
    C++, where no Python hook sees them."""
    if type(fn).__name__ != "builtin_function_or_method":
        return False
    mod = getattr(fn, "__module__", None) or ""
    return bool(mod) and mod.split(".")[0] not in _NOT_EXTENSIONS


def _tracked(stores, func, args, kwargs, python_op: bool = False):
    """Run an operator outside launches, telling the store tracker (if any) before and after."""
    if stores is None:
        return func(*args, **kwargs)
    with _tracking():
        stores.before_op()
    out = func(*args, **kwargs)
    with _tracking():
        if python_op:
            stores.after_python_op(out)
        else:
            stores.after_op(func, args, kwargs, out)
    return out


def _python_op(func) -> bool:
    """Whether ``func`` is an operator made with ``torch.library.custom_op`` (Python code that
    launches kernels itself), not one compiled into an extension."""
    try:
        from torch._library import custom_ops
        return func._schema.name in custom_ops.OPDEFS
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _TorchOps(TorchDispatchMode):
        """Counts the aten operators that run outside kernel launches."""

        def __init__(self, rec: Launches):
            super().__init__()
            self.rec = rec

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            stores = self.rec.stores
            if _STATE.tracking:
                return func(*args, **kwargs)
            if _STATE.inside:
                out = func(*args, **kwargs)
                if stores is not None and func.overloadpacket.__name__ in _MADE:
                    with _tracking():
                        stores.made_in_launch(out)  # memory a launch made (an extension's torch::empty)
                return out
            if func.namespace not in _TORCH_NAMESPACES and _python_op(func):
                # a torch.library.custom_op written in Python: its kernels' launches are seen one
                # by one, and what it computes outside them is not its kernels' work
                return _tracked(stores, func, args, kwargs, python_op=True)
            if func.namespace not in _TORCH_NAMESPACES:
                # an operator that an extension registered (torch.ops.myrelu.relu): compiled code
                # of the course's or the learner's own, which launches its kernel in C++
                with launching("extension", f"{func.namespace}.{func.overloadpacket.__name__}", (args, kwargs)):
                    out = func(*args, **kwargs)
                    if stores is not None:
                        with _tracking():
                            stores.made_in_launch(out)  # what the extension returns, it made
                    return out
            self.rec.torch_ops[func.overloadpacket.__name__] += 1
            return _tracked(stores, func, args, kwargs)

    return without_dynamo_import(_TorchOps)


def without_dynamo_import(mode_cls):
    """``mode_cls`` (a ``TorchDispatchMode``) made to cost nothing at its first use.

    torch keeps torch.compile out of a mode's ``__torch_dispatch__`` with a wrapper that imports
    torch._dynamo at its first call: over a second, in every notebook's first check, and in
    every process forked for a collective's rank. Until something imports it, torch.compile has
    not run and there is nothing to keep out: the wrapper is made only then."""
    raw = mode_cls.__dict__["__torch_dispatch__"]
    raw = getattr(raw, "__wrapped__", raw)

    def dispatch_outside_dynamo(*args, **kwargs):
        import sys
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):
            return raw(*args, **kwargs)
        disabled = dynamo.disable(raw, recursive=True, wrapping=False)
        setattr(raw, "__dynamo_disable", disabled)  # what torch's wrapper calls from now on
        return disabled(*args, **kwargs)

    if not hasattr(raw, "__dynamo_disable"):
        setattr(raw, "__dynamo_disable", dispatch_outside_dynamo)
    return mode_cls


#: Operators that make memory: inside a launch, what they make is the launch's.
_MADE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
                   "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "clone",
                   "_to_copy"})


@contextlib.contextmanager
def _tracking():
    _STATE.tracking += 1
    try:
        yield
    finally:
        _STATE.tracking -= 1


@contextlib.contextmanager
def record_launches(torch_ops: bool = True, stores=None):
    """Record the kernel launches (and, with ``torch_ops``, the torch operators run outside
    them) of the ``with`` block; yields a :class:`Launches`. ``stores``: a
    ``stores.StoreTracker`` that follows who writes each byte (it needs ``torch_ops``)."""
    install_hooks()
    rec = Launches()
    rec.stores = stores
    _ACTIVE.append(rec)
    try:
        if torch_ops:
            with _dispatch_mode()(rec):
                yield rec
        else:
            yield rec
    finally:
        if rec in _ACTIVE:
            _ACTIVE.remove(rec)
        else:  # something inside the block took the recording off: what it saw is incomplete
            rec.stopped = True


@contextlib.contextmanager
def launching(backend: str, name: str, args=()):
    """Mark one kernel launch: recorded by every active recording, and what it runs inside
    (the simulators' own tensor work) is not counted as the learner's torch operators.
    ``args``: what the launch was given (the store trackers watch the arrays among them)."""
    if _STATE.inside or _STATE.tracking:  # a launch from inside a launch: the outer one counts
        yield
        return
    trackers = [rec.stores for rec in _ACTIVE if rec.stores is not None]
    for rec in _ACTIVE:
        rec.kernels.append(Launch(backend, name))
    if trackers:
        with _tracking():
            for t in trackers:
                t.launch_start(args)
    _STATE.inside += 1
    try:
        yield
    finally:
        _STATE.inside -= 1
        if trackers:
            with _tracking():
                for t in trackers:
                    t.launch_end()


#: The simulated CUDA Graph captures in progress (``runtime.graphs``), innermost last: a launch
#: made on torch's stream while one is active goes on its tape and does not run, as a launch on
#: a capturing stream does not.
_CAPTURES: list = []


def recorded(backend: str, name_of, skip=None, captured=None):
    """Wrap a launch function ``fn(self, ...)`` so that each call is recorded as a launch of
    ``name_of(self)``; ``skip(self, *args, **kwargs)`` true: not a launch (a device function
    call, a warm-up that only compiles). Costs one test while nothing records.

    While a simulated CUDA Graph captures (``_CAPTURES``), a launch goes on the capture's tape
    instead of running, when ``captured(self)`` says it is on torch's stream (None: every launch
    is; False: none is, as for a profiled run); one that is not runs now, unrecorded."""
    def wrap(fn):
        @functools.wraps(fn)
        def launch(self, *args, **kwargs):
            if _CAPTURES and captured is not False and not _STATE.inside and not _STATE.tracking \
                    and not (skip is not None and skip(self, *args, **kwargs)):
                if captured is None or captured(self):
                    name = name_of(self)
                    _CAPTURES[-1].launch(backend, name, lambda: launch(self, *args, **kwargs))
                    for rec in _ACTIVE:
                        rec.kernels.append(Launch(backend, name))
                    return None
                with launching(backend, name_of(self), (args, kwargs)):  # its torch work is its own
                    return fn(self, *args, **kwargs)
            if not _ACTIVE or (skip is not None and skip(self, *args, **kwargs)):
                return fn(self, *args, **kwargs)
            with launching(backend, name_of(self), (args, kwargs)):
                return fn(self, *args, **kwargs)
        launch.__wrapped__ = fn
        return launch
    return wrap


def record_method(cls, attr: str, backend: str, name_of, skip=None, captured=None) -> None:
    """Make ``cls.<attr>``, a library's launch method, record its calls (``recorded``); a
    method that records already is left as it is, so installing twice wraps once."""
    fn = cls.__dict__.get(attr)
    if fn is not None and not getattr(fn, "_records_launches", False):
        hooked = recorded(backend, name_of, skip, captured)(fn)
        hooked._records_launches = True
        setattr(cls, attr, hooked)
        setattr(cls, _MARK + attr, hooked)  # what hook_problems expects to find there
