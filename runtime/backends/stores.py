"""Who wrote each byte of a graded call's memory: a kernel launch, or code outside any kernel.

A grader compares a launcher's output with a reference, and `launches.record_launches` makes
sure a kernel ran and torch computed nothing. That leaves one way round: compute the answer
on the host (numpy, a Python loop) and launch a kernel that does nothing, or only reads. This
tracker closes it. While a graded call runs it watches the memory the call can reach (the
inputs, every tensor torch makes outside a kernel, every array handed to a launch) and, at
each boundary (a launch starts or ends, a torch operator runs outside a launch, the call
returns), compares that memory with what it held at the previous boundary:

* bytes that changed **during a launch** were stored by a kernel (``KERNEL``);
* bytes a torch operator wrote outside launches take their status from what the operator
  read: a copy or a cast of a kernel's output stays the kernel's work (``x.to(bfloat16)``,
  ``out.copy_(buf)``); a fill of a whole tensor (``torch.zeros``) is neutral (``FILL``); a copy
  of the inputs is the input (``INPUT``); a copy of memory nobody watched (``torch.from_numpy``,
  a host buffer) is ``HOST``, and so is a fill of a single element (``out[i] = v`` from Python);
* bytes that changed **between** boundaries (a write through ``t.numpy()``, ``ctypes``) were
  written on the host (``HOST``);
* memory first seen as a launch's argument (a Numba device array, ``torch.from_numpy``) held
  what it holds from before (``PRE``): a kernel that writes the value already there leaves no
  trace, so those bytes count against a result only when its kernels wrote none of it.

Each byte keeps the sequence number of its last change, so an element's status is that of its
most recent writer. It works the same on a GPU (the tracker synchronizes around each launch)
and in the simulators, costs nothing outside graded calls, and never raises into the learner's
code: anything it cannot follow makes it give up (``broken``), and the grader then judges as
before.
"""
from __future__ import annotations

import ctypes

import torch

__all__ = ["StoreTracker", "UNSET", "FILL", "INPUT", "KERNEL", "HOST", "PRE", "status_name"]

# Statuses, in a byte's low 3 bits; the rest is the sequence number of its last change.
UNSET, FILL, INPUT, KERNEL, HOST, PRE = 0, 1, 2, 3, 4, 5
_BITS = 3
_NAMES = {UNSET: "allocated", FILL: "filled", INPUT: "input", KERNEL: "kernel", HOST: "host", PRE: "before"}

#: Operators that fill what they write with one value.
_FILLS = frozenset({"fill", "fill_", "zero", "zero_", "zeros", "zeros_like", "ones", "ones_like", "full",
                    "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor"})
#: Operators that copy their source: a 0-d source is data here, not a Python number torch wrapped.
_COPIES = frozenset({"copy", "copy_", "_to_copy", "clone", "to", "contiguous", "_copy_from", "_copy_from_and_resize",
                     "lift_fresh", "lift_fresh_copy"})
#: Operators that hand out fresh memory whose contents mean nothing yet.
_ALLOCS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
                     "resize_as_"})


def status_name(status: int) -> str:
    return _NAMES.get(int(status), "?")


def _byte_view(obj):
    """``(uint8 tensor over the whole memory obj lies in, start address)``, or None when obj is
    not an array the tracker can read (a scalar, a pointer, a record)."""
    base = getattr(obj, "base", None)
    if not isinstance(obj, torch.Tensor) and isinstance(base, torch.Tensor):
        obj = base  # triton.reinterpret's TensorWrapper
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.device.type == "meta" or obj.is_quantized or obj.is_sparse:
            return None
        storage = obj.untyped_storage()
        if storage.nbytes() == 0:
            return None
        view = torch.empty(0, dtype=torch.uint8, device=obj.device)
        view.set_(storage, 0, (storage.nbytes(),), (1,))
        return view, storage.data_ptr()
    ary = getattr(obj, "_ary", None)  # the Numba simulator's device array holds a NumPy array
    if ary is not None:
        obj = ary
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        import numpy as np
        if obj.size == 0:
            return None
        low, high = np.lib.array_utils.byte_bounds(obj) if hasattr(np.lib, "array_utils") else np.byte_bounds(obj)
        buf = (ctypes.c_uint8 * (high - low)).from_address(low)
        return torch.from_numpy(np.ctypeslib.as_array(buf)), low
    if hasattr(obj, "__cuda_array_interface__"):  # numba-cuda's device arrays on a GPU
        t = torch.as_tensor(obj, device="cuda")
        return _byte_view(t)
    return None


def _span(obj):
    """``(address, bytes)`` of a contiguous array's own memory, or None."""
    if isinstance(obj, torch.Tensor):
        return (obj.data_ptr(), obj.numel() * obj.element_size()) if obj.is_contiguous() else None
    ary = getattr(obj, "_ary", None)
    if ary is not None:
        obj = ary
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        return (obj.__array_interface__["data"][0], obj.nbytes) if obj.flags.c_contiguous else None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None and getattr(obj, "is_c_contiguous", lambda: False)():
        return cai["data"][0], obj.nbytes
    return None


class _Entry:
    """One piece of watched memory: its bytes now, at the last boundary, and who wrote each."""

    __slots__ = ("start", "end", "bytes", "prev", "state", "changed")

    def __init__(self, view: torch.Tensor, start: int, encoded: int):
        self.start, self.end = start, start + view.numel()
        self.bytes = view
        self.prev = view.clone()
        self.state = torch.full((view.numel(),), encoded, dtype=torch.int32, device=view.device)
        # made once: a comparison at each boundary allocates nothing of the size of a result, so the
        # block the grader poisoned for a result made in C++ (``torch::empty``) stays free for it
        self.changed = torch.empty(view.numel(), dtype=torch.bool, device=view.device)

    def holds(self, ptr: int, nbytes: int) -> bool:
        return self.start <= ptr and ptr + nbytes <= self.end


def _tensors(obj, depth=0):
    """The arrays in a launch's or an operator's arguments (one level of tuples, lists, dicts)."""
    if isinstance(obj, (tuple, list)) and depth < 3:
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif isinstance(obj, dict) and depth < 3:
        for x in obj.values():
            yield from _tensors(x, depth + 1)
    elif obj is not None and not isinstance(obj, (int, float, bool, complex, str, bytes)):
        yield obj


class StoreTracker:
    """The memory one graded call can reach, and who wrote each byte of it (see the module)."""

    def __init__(self, inputs=()):
        self.entries: list[_Entry] = []
        self.seq = 1
        self.kernel_stored = False   # a launch changed some watched byte, or made memory
        self.made_inside: set[int] = set()  # start addresses of storages created inside launches
        self.broken: str | None = None
        for t in _tensors(tuple(inputs)):
            self._try(self.watch, t, INPUT)

    # -- safety -------------------------------------------------------------------------------
    def _try(self, fn, *args):
        if self.broken is not None:
            return None
        try:
            return fn(*args)
        except Exception as e:  # never raise into the learner's call: give up instead
            self.broken = f"{type(e).__name__}: {e}"
            return None

    # -- memory -------------------------------------------------------------------------------
    def _code(self, status: int) -> int:
        return (self.seq << _BITS) | status

    def find(self, ptr: int, nbytes: int = 1) -> _Entry | None:
        for e in self.entries:
            if e.holds(ptr, nbytes):
                return e
        return None

    def watch(self, obj, status: int) -> _Entry | None:
        """Watch the memory ``obj`` lies in (if it is not watched yet), every byte ``status``."""
        found = _byte_view(obj)
        if found is None:
            return None
        view, start = found
        entry = self.find(start, view.numel())
        if entry is None:
            entry = _Entry(view, start, self._code(status))
            self.entries.append(entry)
        return entry

    def _byte_indices(self, entry: _Entry, t: torch.Tensor):
        """The byte offsets, in ``entry``, of each element of ``t`` (shape ``t.shape``), and its size."""
        size = t.element_size()
        offset = (t.data_ptr() - entry.start)
        strides = [s * size for s in t.stride()]
        return offset, strides, size

    def _element_states(self, entry: _Entry, t: torch.Tensor) -> torch.Tensor:
        """The encoded state of each element of ``t``: its most recently written byte's."""
        offset, strides, size = self._byte_indices(entry, t)
        out = None
        for k in range(size):
            v = entry.state.as_strided(tuple(t.shape), strides, offset + k)
            out = v.clone() if out is None else torch.maximum(out, v)
        return out

    def _set_elements(self, entry: _Entry, t: torch.Tensor, encoded) -> None:
        offset, strides, size = self._byte_indices(entry, t)
        for k in range(size):
            target = entry.state.as_strided(tuple(t.shape), strides, offset + k)
            target.fill_(encoded) if isinstance(encoded, int) else target.copy_(encoded)

    def _entry_of(self, t) -> _Entry | None:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.layout != torch.strided:
            return None
        return self.find(t.data_ptr(), 1)

    # -- boundaries ---------------------------------------------------------------------------
    def _sync(self, status: int, covered=()) -> bool:
        """Bytes changed since the last boundary get ``status`` (except ``covered`` entries'
        masks, already given theirs); returns whether any changed."""
        self.seq += 1
        code = self._code(status)
        changed_any = False
        for e in self.entries:
            changed = torch.ne(e.bytes, e.prev, out=e.changed)
            for entry, mask in covered:
                if entry is e:
                    changed &= ~mask
            if bool(changed.any()):
                changed_any = True
                e.state[changed] = code
            e.prev.copy_(e.bytes)
        return changed_any

    def _device_sync(self):
        if any(e.bytes.device.type == "cuda" for e in self.entries) and torch.cuda.is_available():
            torch.cuda.synchronize()

    def launch_start(self, args) -> None:
        def start():
            self._sync(HOST)  # what changed since the last boundary was written on the host
            for a in _tensors(args):
                self.watch(a, PRE)  # memory first seen here: what it holds was there before the launch
            self.seq += 1
        self._try(start)

    def launch_end(self) -> None:
        def end():
            self._device_sync()
            if self._sync(KERNEL):
                self.kernel_stored = True
        self._try(end)

    def made_in_launch(self, out) -> None:
        """A tensor an operator made inside a launch (a C++ extension's ``torch::empty``)."""
        def made():
            for t in _tensors(out):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel():
                    self.made_inside.add(t.untyped_storage().data_ptr())
                    self.kernel_stored = True
        self._try(made)

    def before_op(self) -> None:
        self._try(self._sync, HOST)

    def after_op(self, func, args, kwargs, out) -> None:
        self._try(self._after_op, func, args, kwargs, out)

    def _after_op(self, func, args, kwargs, out) -> None:
        name = func.overloadpacket.__name__
        schema = func._schema
        written, sources = [], []
        for i, arg in enumerate(schema.arguments):
            val = args[i] if i < len(args) else kwargs.get(arg.name)
            if not isinstance(val, torch.Tensor):
                if isinstance(val, (tuple, list)):
                    sources.extend(v for v in val if isinstance(v, torch.Tensor))
                continue
            if arg.alias_info is not None and arg.alias_info.is_write:
                written.append(val)
            else:
                sources.append(val)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        fresh = [t for t, ret in zip(outs, schema.returns)
                 if isinstance(t, torch.Tensor) and ret.alias_info is None]
        if not written and not fresh:
            self._sync(HOST)
            return
        self.seq += 1
        covered = []
        for t in written + fresh:
            if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.layout != torch.strided:
                continue
            entry = self._entry_of(t)
            if entry is None:
                # fresh memory (or memory nobody watched, written now): watched from here on
                entry = self.watch(t, UNSET if name in _ALLOCS else HOST)
                if entry is None:
                    continue
            single = t.numel() == 1 and entry.end - entry.start > t.element_size()
            if name in _ALLOCS:
                encoded = self._code(UNSET)
            elif name in _FILLS:
                encoded = self._code(HOST if single else FILL)  # out[i] = v, element by element
            else:
                encoded = self._derived(sources, t, copy=name in _COPIES)
                if single and isinstance(encoded, int) and encoded & ((1 << _BITS) - 1) == FILL:
                    encoded = self._code(HOST)  # one element set to a Python number: out[i] = v
            self._set_elements(entry, t, encoded)
            mask = torch.zeros(entry.state.shape, dtype=torch.bool, device=entry.state.device)
            offset, strides, size = self._byte_indices(entry, t)
            for k in range(size):
                mask.as_strided(tuple(t.shape), strides, offset + k).fill_(True)
            covered.append((entry, mask))
        self._sync(HOST, covered)

    def _derived(self, sources, dest: torch.Tensor, copy: bool = False):
        """The status a value computed from ``sources`` gets: element by element for a copy of one
        tensor of the same size, else the most telling status of all it read."""
        states = []
        for s in sources:
            if s.numel() == 0:
                continue
            entry = self._entry_of(s)
            if entry is None:
                if s.dim() == 0 and s.device.type == "cpu" and not copy:
                    continue  # a Python number torch wrapped (x * 2.0)
                return self._code(HOST)  # read from memory nobody watched: a host buffer
            states.append((s, self._element_states(entry, s) & ((1 << _BITS) - 1)))
        if not states:
            return self._code(FILL)
        if len(states) == 1 and states[0][0].numel() == dest.numel():
            st = states[0][1].reshape(-1).to(dest.device)
            return ((self.seq << _BITS) | st).reshape(dest.shape)
        worst = max(int(st.max()) for _, st in states)
        if worst != HOST and any(bool((st == KERNEL).any()) for _, st in states):
            worst = KERNEL
        return self._code(worst)

    def after_python_op(self, out) -> None:
        """After a ``torch.library.custom_op`` written in Python: its kernels' launches were seen
        one by one; memory it returns that no launch was given was made outside them."""
        def after():
            self._sync(HOST)
            for t in _tensors(out):
                if isinstance(t, torch.Tensor) and self._entry_of(t) is None:
                    self.watch(t, HOST)
        self._try(after)

    def copied(self, dst, src) -> None:
        """``dst`` now holds a copy of ``src`` (Numba's ``copy_to_host``): its bytes have their
        writers, not the host's."""
        def copy():
            self._sync(HOST)
            s_span, d_span = _span(src), _span(dst)
            if s_span is None or d_span is None or s_span[1] != d_span[1] or not s_span[1]:
                return
            src_entry = self.find(*s_span)
            dst_entry = self.watch(dst, HOST)
            if src_entry is None or dst_entry is None:
                return
            n = s_span[1]
            so, do = s_span[0] - src_entry.start, d_span[0] - dst_entry.start
            states = src_entry.state[so:so + n].to(dst_entry.state.device) & ((1 << _BITS) - 1)
            dst_entry.state[do:do + n] = (self.seq << _BITS) | states
            dst_entry.prev[do:do + n] = dst_entry.bytes[do:do + n]
        self._try(copy)

    def finish(self) -> None:
        self._try(self._sync, HOST)

    # -- verdicts -----------------------------------------------------------------------------
    def statuses(self, t: torch.Tensor) -> torch.Tensor | None:
        """The status of each element of ``t`` (a uint8 tensor of its shape, on the CPU), or None
        when the tracker does not know its memory (or gave up)."""
        if self.broken is not None or not isinstance(t, torch.Tensor):
            return None
        try:
            entry = self._entry_of(t)
            if entry is None:
                return None
            return (self._element_states(entry, t) & ((1 << _BITS) - 1)).to("cpu", torch.uint8)
        except Exception:
            return None

    def made_by_launch(self, t) -> bool:
        try:
            return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.made_inside
        except Exception:
            return False

    def release(self) -> None:
        """Drop the memory views and snapshots (the verdicts already taken stay with the caller)."""
        self.entries = []
