"""Data-race detection in Numba's CUDA simulator (applied by ``simulator.py``).

A racy kernel often computes the right value on a CPU: the simulator runs blocks one
after another and the threads of a block in a fixed order, so a lost update between
blocks never happens there. This module watches every access to a kernel's array
arguments and shared arrays instead, and reports a race by the rules a GPU imposes:

* **shared memory**: two accesses to one address by different threads of a block, in
  one barrier interval (no ``cuda.syncthreads()`` between them), at least one of them a
  plain (non-atomic) write;
* **global memory** (array arguments): the same within a block, and any two accesses to
  one address from different blocks of one launch, at least one a plain write: blocks
  cannot wait for each other;
* **within a warp**: lanes of one warp follow the same rule; a warp collective
  (``cuda.syncwarp()``, a shuffle, a vote) orders them. Since Volta the lanes of a warp
  are not in lockstep, so "warp-synchronous" code without ``cuda.syncwarp()`` is a race.

``cuda.atomic.*`` operations never race with each other, nor with plain reads.

The report is a :class:`SimulatorRaceError` (a ``utils.KernelFault``, so graders show it
as their diagnosis) naming the kernel, the array and index, both threads and blocks,
both source lines, and the fix.

How: the launch wraps each array argument (and ``cuda.shared.array`` returns) in
:class:`_Tracked`, whose ``__getitem__``/``__setitem__`` record the access in a shadow
table keyed by the element's address (so views and aliased arguments meet). Only one
simulated thread runs at a time, so the current thread, block and barrier interval sit
in one module-level context that the scheduler updates at every hand-over. Each address
keeps its last plain write and up to three reads, which is enough to find a race at its
first conflicting access (never a false one: a race is reported only for a recorded
pair of accesses that conflicts). ``COURSE_RACECHECK=0`` turns detection off.
"""
from __future__ import annotations

import gc
import operator
import os
import re
import sys

from ..cuda._errors import KernelFault

__all__ = ["SimulatorRaceError", "SimulatorMemoryError", "RACECHECK"]

#: Race detection in simulation (``COURSE_RACECHECK=0`` in the environment turns it off).
RACECHECK = os.environ.get("COURSE_RACECHECK", "1").strip() not in ("0", "false", "no", "off")


class SimulatorRaceError(KernelFault):
    """Two accesses of a simulated kernel that race on a GPU (see ``runtime/backends/numba/races.py``)."""


class SimulatorMemoryError(KernelFault):
    """An access of a simulated kernel outside every tensor argument: an illegal or stray
    memory access on a GPU (Triton's interpreter, ``runtime/backends/triton/interpreter.py``)."""


READ, WRITE, ATOMIC = "read", "write", "atomic"


class _Context:
    """The state of the running launch: one simulated thread runs at a time."""

    __slots__ = ("on", "kernel", "gshadow", "sshadow", "cur", "args", "threads", "gc_was_on",
                 "prof")

    def __init__(self):
        self.on = False       # inside a launch with detection on
        self.kernel = None    # the kernel's name
        self.gshadow = {}     # address -> entry, for the launch's array arguments
        self.sshadow = {}     # address -> entry, for shared arrays (reset at each block)
        # (block, tid, barrier interval, warp interval) of the running thread
        self.cur = None
        self.args = None      # the launch's arguments as kernel code sees them
        self.threads = 0      # threads per block
        self.gc_was_on = False
        # The profiler of a ``profile.py`` launch (None otherwise): wrapped arrays
        # then report every access to it, with or without race detection.
        self.prof = None


_T = _Context()


def watching() -> bool:
    """Whether the running launch wraps its arrays (race detection or profiling)."""
    return _T.on or _T.prof is not None


def begin_launch(kernel_name: str) -> None:
    _T.on = RACECHECK
    if RACECHECK:
        # The shadow tables hold millions of small lists and tuples on a large launch,
        # none in a cycle; the garbage collector would scan them again and again (it made
        # a 2^20-thread launch several times slower). It runs again after the launch.
        _T.gc_was_on = gc.isenabled()
        gc.disable()
    _T.kernel = kernel_name
    _T.gshadow = {}
    _T.sshadow = {}
    _T.args = None


def end_launch() -> None:
    if _T.gc_was_on:
        gc.enable()
        _T.gc_was_on = False
    _T.on = False
    _T.gshadow = {}
    _T.sshadow = {}
    _T.cur = None
    _T.args = None


def launch_arguments(fn, args):
    """The arguments of a launch wrapped for checking (once per launch, the same for
    every block), or ``args`` unchanged when detection is off."""
    if not _T.on and _T.prof is None:
        return args
    if _T.args is None:
        import inspect
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        names += [f"argument {i}" for i in range(len(names), len(args))]
        _T.args = tuple(wrap_argument(a, n, i) for i, (a, n) in enumerate(zip(args, names)))
    return _T.args


def begin_block(threads: int, linear: int = 0) -> None:
    _T.sshadow = {}  # shared memory is the block's own
    _T.threads = threads
    if _T.prof is not None:
        _T.prof.begin_block(linear, threads)


def set_thread(block, tid: int, interval: int, warp_interval: int) -> None:
    _T.cur = (block, tid, interval, warp_interval)
    if _T.prof is not None:
        _T.prof.set_thread(tid)


# ---------------------------------------------------------------------------------------
# Tracked arrays.
# ---------------------------------------------------------------------------------------
class _Tracked:
    """An array seen by kernel code: every element access is checked for races."""

    __slots__ = ("_a", "_name", "_shared", "_base", "_strides", "_shape", "_nd")

    def __init__(self, a, name: str, shared: bool):
        self._a = a
        self._name = name
        self._shared = shared
        self._base = a.__array_interface__["data"][0]
        self._strides = a.strides
        self._shape = a.shape
        self._nd = a.ndim

    # The rest of the array API (shape, size, dtype, ndim, ...) is the array's own.
    def __getattr__(self, name):
        return getattr(self._a, name)

    def __len__(self):
        return len(self._a)

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)

    def __repr__(self):
        return f"<{self._name}: {self._a!r}>"

    def __getitem__(self, idx):
        v = self._a[idx]
        if type(v) is _ndarray:  # a row or a slice: a view, not an access
            return _Tracked(v, f"{self._name}[{_fmt_index(idx)}]", self._shared)
        if _T.on:
            if type(idx) is int and self._nd == 1:  # the common case, kept short
                _check(self, idx, self._base + (idx if idx >= 0 else idx + self._shape[0])
                       * self._strides[0], READ, sys._getframe(1))
            else:
                _access(self, idx, READ, sys._getframe(1))
        return v

    def __setitem__(self, idx, value):
        if _T.on:
            if type(idx) is int and self._nd == 1:
                # An index past the end raises IndexError below, before anything is recorded
                # for it: check that first.
                self._a[idx] = value
                _check(self, idx, self._base + (idx if idx >= 0 else idx + self._shape[0])
                       * self._strides[0], WRITE, sys._getframe(1))
                return
            _access(self, idx, WRITE, sys._getframe(1))
        self._a[idx] = value

    def _addresses(self, idx):
        """Byte addresses of the elements ``idx`` names (a list; empty if unknown)."""
        nd = self._nd
        try:
            if nd == 1:
                i = operator.index(idx)
                n = self._shape[0]
                return [self._base + (i + n if i < 0 else i) * self._strides[0]]
            if type(idx) is tuple and len(idx) == nd:
                addr = self._base
                for i, n, s in zip(idx, self._shape, self._strides):
                    i = operator.index(i)
                    addr += (i + n if i < 0 else i) * s
                return [addr]
        except TypeError:
            pass
        view = self._a[idx]  # slices, fewer indices than dimensions, ...
        if type(view) is not _ndarray:
            return []
        import numpy as np
        start = view.__array_interface__["data"][0]
        offsets = np.zeros(view.shape, dtype=np.int64)
        for d, (n, s) in enumerate(zip(view.shape, view.strides)):
            shape = [1] * view.ndim
            shape[d] = n
            offsets = offsets + (np.arange(n, dtype=np.int64) * s).reshape(shape)
        return (start + offsets).ravel().tolist()


def _import_ndarray():
    import numpy as np
    return np.ndarray


_ndarray = _import_ndarray()


def wrap_argument(value, name: str, index: int = -1):
    """What kernel code sees for one argument of a launch."""
    a = getattr(getattr(value, "_item", None), "_ary", None)  # FakeWithinKernelCUDAArray
    if a is None and type(value) is _ndarray:
        a = value
    if a is None or a.dtype.fields is not None or a.ndim == 0:
        return value  # scalars, records: left as the simulator passes them
    if _T.prof is not None:
        return _Profiled(a, name, False, _T.prof.argument(a, name, index))
    return _Tracked(a, name, shared=False)


def wrap_shared(a, site, dynamic=False):
    filename, lineno = site
    import linecache
    m = re.match(r"\s*(\w+)\s*=", linecache.getline(filename, lineno))
    name = m.group(1) if m else "shared array"
    if _T.prof is not None:
        return _Profiled(a, name, True, _T.prof.shared_array(a, name, site, dynamic))
    return _Tracked(a, name, shared=True)


# ---------------------------------------------------------------------------------------
# Profiled arrays: every access is also reported to the launch's profiler
# (``profile.py``), which counts requests, sectors and bank conflicts from them.
# ---------------------------------------------------------------------------------------
class _Profiled(_Tracked):
    """A tracked array whose accesses are also counted. ``_key`` names the argument or
    shared array for the profiler; ``_off0`` is this view's byte offset in it."""

    __slots__ = ("_key", "_off0")

    def __init__(self, a, name, shared, key, off0=0):
        _Tracked.__init__(self, a, name, shared)
        self._key = key
        self._off0 = off0

    # Kept flat (no helper calls in the common 1-D case): a profiled launch also traces
    # every Python call, so each call here costs twice.
    def __getitem__(self, idx):
        v = self._a[idx]
        if type(v) is _ndarray:  # a view: offsets stay relative to the whole argument
            off0 = self._off0 + v.__array_interface__["data"][0] - self._base
            return _Profiled(v, f"{self._name}[{_fmt_index(idx)}]", self._shared, self._key,
                             off0)
        frame = sys._getframe(1)
        p = _T.prof
        d = ((idx if idx >= 0 else idx + self._shape[0]) * self._strides[0]
             if type(idx) is int and self._nd == 1 else self._flat(idx))
        if d is not None:
            sid = p.sites.get((frame.f_code, frame.f_lasti, self._key, 0))
            if sid is None:
                sid = p.new_site(frame, self._key, 0)
            p.rec.append((p.block, p.tid, sid, self._off0 + d))
            if _T.on:
                _check(self, idx, self._base + d, READ, frame)
        else:
            p.access(self, idx, 0, frame)
            if _T.on:
                _access(self, idx, READ, frame)
        return v

    def __setitem__(self, idx, value):
        self._a[idx] = value  # an index past the end raises here, before anything is counted
        frame = sys._getframe(1)
        p = _T.prof
        d = ((idx if idx >= 0 else idx + self._shape[0]) * self._strides[0]
             if type(idx) is int and self._nd == 1 else self._flat(idx))
        if d is not None:
            sid = p.sites.get((frame.f_code, frame.f_lasti, self._key, 1))
            if sid is None:
                sid = p.new_site(frame, self._key, 1)
            p.rec.append((p.block, p.tid, sid, self._off0 + d))
            if _T.on:
                _check(self, idx, self._base + d, WRITE, frame)
        else:
            p.access(self, idx, 1, frame)
            if _T.on:
                _access(self, idx, WRITE, frame)

    def _flat(self, idx):
        """The byte offset in this view of element ``idx`` (a full tuple of integers), or
        None for anything else (slices, too few indices)."""
        if type(idx) is not tuple or len(idx) != self._nd:
            return None
        d = 0
        try:
            for i, n, st in zip(idx, self._shape, self._strides):
                i = operator.index(i)
                if not -n <= i < n:
                    return None
                d += (i if i >= 0 else i + n) * st
        except TypeError:
            return None
        return d

    def offsets(self, idx):
        """Byte offsets in the whole argument (or shared array) of the elements ``idx``
        names."""
        if self._nd == 1 and type(idx) is int:
            return (self._off0 + (idx if idx >= 0 else idx + self._shape[0]) * self._strides[0],)
        base = self._base - self._off0
        return [a - base for a in self._addresses(idx)]


# ---------------------------------------------------------------------------------------
# The check: one entry per address, [last plain write, foreign read, read, read].
# A record is (context, code, line, kind); context is _T.cur at the access.
# ---------------------------------------------------------------------------------------
def _conflicts(p, c) -> bool:
    """Whether accesses from contexts p and c (different ones) are unordered."""
    if p[0] != c[0]:
        return True  # different blocks: nothing orders them within a launch
    if p[1] == c[1] or p[2] != c[2]:
        return False  # same thread, or a cuda.syncthreads() between them
    # Same barrier interval: lanes of one warp are ordered by a warp collective between.
    return (p[1] >> 5) != (c[1] >> 5) or p[3] == c[3]


def _access(arr: _Tracked, idx, kind, frame):
    for addr in arr._addresses(idx):
        _check(arr, idx, addr, kind, frame)


def _check(arr: _Tracked, idx, addr, kind, frame):
    """Record one access to ``addr`` and raise if it races with a recorded one."""
    c = _T.cur
    if c is None:
        return
    shadow = _T.sshadow if arr._shared else _T.gshadow
    rec = (c, frame.f_code, frame.f_lineno, kind)
    e = shadow.get(addr)
    if e is None:
        shadow[addr] = [rec, None, None, None] if kind is WRITE else [None, None, rec, None]
        return
    w = e[0]
    if w is not None and w[0] is not c and _conflicts(w[0], c):
        _report(arr, idx, w, rec)
    if kind is WRITE:
        for r in (e[1], e[2], e[3]):
            if r is not None and r[0] is not c and _conflicts(r[0], c):
                _report(arr, idx, r, rec)
        e[0] = rec
        return
    # A read or an atomic: keep a read of an earlier block (any later write from
    # another block races with it) and the last two readers of this interval.
    ra = e[2]
    if ra is None or ra[0] is c:
        e[2] = rec
        return
    p = ra[0]
    if p[0] != c[0]:
        e[1], e[2], e[3] = ra, rec, None
    elif p[2] != c[2] or p[1] == c[1]:
        e[2] = rec
        if p[2] != c[2]:
            e[3] = None
    else:
        e[2], e[3] = rec, ra


# ---------------------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------------------
def _fmt_index(idx) -> str:
    if type(idx) is tuple:
        return ", ".join(_fmt_index(i) for i in idx)
    if isinstance(idx, slice):
        parts = ["" if v is None else str(v) for v in (idx.start, idx.stop)]
        if idx.step is not None:
            parts.append(str(idx.step))
        return ":".join(parts)
    try:
        return str(operator.index(idx))
    except TypeError:
        return str(idx)


def _line(rec):
    from .sites import describe_site as _describe_site
    return _describe_site((rec[1].co_filename, rec[2]))


def _who(ctx) -> str:
    block, tid = ctx[0], ctx[1]
    return f"thread {tid} (warp {tid >> 5}, lane {tid & 31}) of block {block}"


def _report(arr: _Tracked, idx, first, second):
    p, c = first[0], second[0]
    where = "shared memory" if arr._shared else "global memory"
    what = f"{arr._name}[{_fmt_index(idx)}]"
    a_line, b_line = first[2], second[2]
    lines = [f"data race in kernel `{_T.kernel}` on {what} ({where}):",
             f"  {first[3]} by {_who(p)} at {_line(first)}",
             f"  {second[3]} by {_who(c)} at {_line(second)}"]
    both_write = first[3] is WRITE and second[3] is WRITE
    atomic = "cuda.atomic.add (or another cuda.atomic.*)"
    lo, hi = sorted((a_line, b_line))
    between = (f"between line {lo} and line {hi}" if lo != hi else
               f"between two passes through line {lo} (at the end of the loop body)")
    # A write, then another thread's access on the same line: threads updating one element
    # in turn (`out[0] += v`), which a barrier cannot fix.
    accumulate = first[3] is WRITE and a_line == b_line and first[1] is second[1]
    if p[0] != c[0]:
        lines.append("Blocks of one launch run in no fixed order and cannot wait for each other: "
                     "on a GPU these accesses happen in either order or at once, so a read sees "
                     "the value before or after the write, and of two updates (`+=`) one is lost.")
        lines.append(f"Fix: use {atomic} to combine the blocks' results in {arr._name}, or let "
                     "each block write its own element and combine them in a second step.")
    elif accumulate:
        lines.append("Several threads of the block update this one element in turn; on a GPU "
                     "their loads, adds and stores interleave and updates are lost.")
        lines.append(f"Fix: use {atomic}, or let one thread combine the values after a "
                     "cuda.syncthreads().")
    elif (p[1] >> 5) == (c[1] >> 5):
        lines.append("The two threads are lanes of one warp with no warp barrier between the "
                     "accesses. Since Volta the lanes of a warp are scheduled independently, "
                     "so relying on them running in lockstep is a race (a hazard within the warp).")
        fix = (f"a cuda.syncwarp() (or a cuda.syncthreads()) {between}" if _T.threads <= 32 else
               f"a cuda.syncthreads() {between} (a cuda.syncwarp() is enough if only the "
               "lanes of one warp exchange data there)")
        lines.append(f"Fix: {fix}" + (f", or use {atomic}." if both_write else "."))
    else:
        lines.append("The two threads of one block reach these accesses in the same barrier "
                     "interval, so on a GPU they happen in either order.")
        lines.append(f"Fix: a cuda.syncthreads() {between}"
                     + (f", or use {atomic} if both threads add to it." if both_write else "."))
    _T.on = False  # the rest of the launch unwinds unchecked
    raise SimulatorRaceError("\n".join(lines))


def atomic_method(original, has_index=True):
    """A ``cuda.atomic.*`` method that records an atomic access on a tracked array."""
    if has_index:
        def method(self, array, index, *rest):
            if isinstance(array, _Tracked):
                if _T.prof is not None and type(array) is _Profiled:
                    _T.prof.access(array, index, 2, sys._getframe(1))
                if _T.on:
                    _access(array, index, ATOMIC, sys._getframe(1))
                array = array._a
            return original(self, array, index, *rest)
    else:  # compare_and_swap(array, old, val): element 0
        def method(self, array, *rest):
            if isinstance(array, _Tracked):
                first = (0,) * array._nd if array._nd > 1 else 0
                if _T.prof is not None and type(array) is _Profiled:
                    _T.prof.access(array, first, 2, sys._getframe(1))
                if _T.on:
                    _access(array, first, ATOMIC, sys._getframe(1))
                array = array._a
            return original(self, array, *rest)
    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method
